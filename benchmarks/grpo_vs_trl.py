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


def ours(path: str, steps: int) -> tuple[list[float], list[float], list[list[int]]]:
    """Seconds per full step, seconds of the training part, and one step's token sequences (for the floor)."""
    engine = HFEngine(path, max_batch_size=N)
    trainer = GRPOTrainer(
        path, GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=N), checkpoint_dir=tempfile.mkdtemp()
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    prompt = list(engine.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False))
    totals, train_parts, sequences = [], [], []
    for step in range(steps):
        started = time.perf_counter()
        params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, n=N, seed=step)
        result = loop.run_until_complete(engine.generate(GenerationRequest(prompt, params)))
        runs = []
        for sample in result.samples:
            turn = Turn(
                id=f"{step}-{sample.index}",
                node="agent",
                prompt_token_ids=prompt,
                token_ids=sample.token_ids,
                logprobs=sample.logprobs,
                params={"temperature": 1.0},
            )
            runs.append(
                Trajectory(
                    id=turn.id,
                    status="ok",
                    reward=digits(sample.text),
                    spans=[NodeSpan(id=turn.id, name="agent", turns=[turn])],
                )
            )
        train_start = time.perf_counter()
        trainer.step([TrajectoryGroup(id=str(step), trajectories=runs)])
        end = time.perf_counter()
        totals.append(end - started)
        train_parts.append(end - train_start)
        sequences = [prompt + s.token_ids for s in result.samples]
    loop.run_until_complete(engine.close())
    return totals, train_parts, sequences


def bare(path: str, sequences: list[list[int]], steps: int) -> list[float]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        attn[row, : len(seq)] = 1
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).sum() / attn.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def trl(path: str, steps: int) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

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
        callbacks=[Clock()],
    )
    trainer.train()
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
        path = resolve_model(name)
        total, train_part, sequences = ours(path, args.warmup + args.steps)
        floor = bare(path, sequences, args.warmup + args.steps)
        theirs = trl(path, args.warmup + args.steps)
        skip = args.warmup
        ours_step, ours_train = statistics.median(total[skip:]), statistics.median(train_part[skip:])
        trl_step, bare_step = statistics.median(theirs[skip:]), statistics.median(floor[skip:])
        tokens = N * NEW_TOKENS
        rows.append((name, ours_step, trl_step, tokens / ours_step, tokens / trl_step, ours_train, bare_step))
    print(
        f"1 prompt x {N} completions x {NEW_TOKENS} tokens, LoRA r=8, median of {args.steps} steps "
        f"after {args.warmup} warm-up, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )
    print(
        "| model | ours ms/step | TRL ms/step | ours tok/s | TRL tok/s | ours/TRL | our training part ms | "
        "bare fwd+bwd ms | training / bare |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, o, t, otok, ttok, train, floor_ms in rows:
        print(
            f"| {name} | {o * 1e3:.0f} | {t * 1e3:.0f} | {otok:.0f} | {ttok:.0f} | {otok / ttok:.2f}x | "
            f"{train * 1e3:.0f} | {floor_ms * 1e3:.0f} | {train / floor_ms:.2f}x |"
        )


if __name__ == "__main__":
    main()
