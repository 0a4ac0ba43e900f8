"""Our GRPO step against TRL's GRPOTrainer, and our training part against a bare forward+backward, same run.

    OMP_NUM_THREADS=1 python benchmarks/grpo_vs_trl.py [--steps 12] [--models tiny,tiny-5m]

Same setting for everyone (the "digits" task, see ``digits``): 1 prompt x 8 completions x 32 new tokens,
LoRA r=8/alpha=16 on
all linear layers, lr 1e-2, beta 0, the "grpo" loss. A step is what it takes to turn one group into one update:
sampling the 8 completions (our HFEngine, in process; TRL's own generate), rewards, old logprobs where needed,
forward+backward, AdamW. "bare fwd+bwd" is a plain peft model doing forward, backward and AdamW over the same
token sequences with a summed log-likelihood loss: the floor for our training part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.models.loading import resolve_model
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
from langgraph_art.serve.engines.hf import HFEngine
from langgraph_art.train.trainer import GRPOTrainer
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn

PROMPT = [{"role": "user", "content": "Write some numbers."}]
N, NEW_TOKENS = 8, 32


def digits(text: str) -> float:
    """Share of digits, plus a small term that varies with any text, so that no group has all-equal rewards
    (a random model writes few digits: with equal rewards our trainer would rightly skip the update)."""
    chars = "".join(text.split())
    if not chars:
        return 0.0
    return sum(c.isdigit() for c in chars) / len(chars) + 0.01 * sum(c in "aeiou" for c in chars) / len(chars)


class Ours:
    """Our engine samples the group in process, our GRPOTrainer takes the step."""

    def __init__(self, path: str) -> None:
        self.engine = HFEngine(path, max_batch_size=N)
        self.trainer = GRPOTrainer(
            path, GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=N), checkpoint_dir=tempfile.mkdtemp()
        )
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.engine.start())
        self.prompt = list(
            self.engine.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
        )
        self.steps = 0
        self.sequences: list[list[int]] = []

    def step(self) -> tuple[float, float]:
        """Seconds of the whole step and of its training part."""
        started = time.perf_counter()
        params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, n=N, seed=self.steps)
        result = self.loop.run_until_complete(self.engine.generate(GenerationRequest(self.prompt, params)))
        runs = []
        for sample in result.samples:
            turn = Turn(
                id=f"{self.steps}-{sample.index}",
                node="agent",
                prompt_token_ids=self.prompt,
                token_ids=sample.token_ids,
                logprobs=sample.logprobs,
                params={"temperature": 1.0},
            )
            spans = [NodeSpan(id=turn.id, name="agent", turns=[turn])]
            runs.append(Trajectory(id=turn.id, status="ok", reward=digits(sample.text), spans=spans))
        train_start = time.perf_counter()
        self.trainer.step([TrajectoryGroup(id=str(self.steps), trajectories=runs)])
        end = time.perf_counter()
        self.steps += 1
        self.sequences = [self.prompt + s.token_ids for s in result.samples]
        return end - started, end - train_start

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())


class Bare:
    """A plain peft model: forward, summed log-likelihood, backward, AdamW over the given token sequences."""

    def __init__(self, path: str) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        self.model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
        )
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-2)

    def step(self, sequences: list[list[int]]) -> float:
        width = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
            attn[row, : len(seq)] = 1
        start = time.perf_counter()
        logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).sum() / attn.sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return time.perf_counter() - start


def interleaved(path: str, steps: int) -> dict[str, list[float]]:
    """TRL trains; right after each of its steps (timed by a callback), we take one step and the bare baseline
    one, so all three see the same machine state: on a shared 2-core machine, speed drifts by tens of percent
    within seconds, and running the three one after the other measured the drift as much as the code."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    ours, floor = Ours(path), Bare(path)
    times: dict[str, list[float]] = {"trl": [], "ours": [], "ours_train": [], "bare": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times["trl"].append(time.perf_counter() - self.start)
            total, train = ours.step()
            times["ours"].append(total)
            times["ours_train"].append(train)
            times["bare"].append(floor.step(ours.sequences))

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [digits(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    args = TRLConfig(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=N,
        num_generations=N,
        max_completion_length=NEW_TOKENS,
        learning_rate=1e-2,
        beta=0.0,
        loss_type="grpo",
        report_to="none",
        max_steps=steps,
        save_strategy="no",
        logging_steps=1000,
        temperature=1.0,
        disable_tqdm=True,
        seed=0,
    )
    data = Dataset.from_list([{"prompt": PROMPT}] * (steps * N))
    trainer = TRLTrainer(
        model=path,
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
        callbacks=[Interleave()],
    )
    trainer.train()
    ours.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default="tiny,tiny-5m")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        times = interleaved(resolve_model(name), args.warmup + args.steps)
        kept = {key: values[args.warmup :] for key, values in times.items()}
        med = {key: statistics.median(values) for key, values in kept.items()}
        ratio = statistics.median([t / o for t, o in zip(kept["trl"], kept["ours"], strict=True)])
        floor = statistics.median([o / b for o, b in zip(kept["ours_train"], kept["bare"], strict=True)])
        rows.append((name, med, ratio, floor))
    print(
        f"1 prompt x {N} completions x {NEW_TOKENS} tokens, LoRA r=8, median of {args.steps} steps "
        f"after {args.warmup} warm-up, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )
    print(
        "| model | ours ms/step | TRL ms/step | ours tok/s | TRL tok/s | ours/TRL | our training part ms | "
        "bare fwd+bwd ms | training / bare |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    tokens = N * NEW_TOKENS
    for name, med, ratio, floor in rows:
        print(
            f"| {name} | {med['ours'] * 1e3:.0f} | {med['trl'] * 1e3:.0f} | {tokens / med['ours']:.0f} | "
            f"{tokens / med['trl']:.0f} | {ratio:.2f}x | {med['ours_train'] * 1e3:.0f} | {med['bare'] * 1e3:.0f} | "
            f"{floor:.2f}x |"
        )
    print("ratios are medians of per-step ratios (each TRL step paired with the step of ours that follows it)")


if __name__ == "__main__":
    main()
