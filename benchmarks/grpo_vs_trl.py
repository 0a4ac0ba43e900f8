"""Our GRPO step against TRL's GRPOTrainer, and our training part against a bare forward+backward, same run.

    OMP_NUM_THREADS=1 python benchmarks/grpo_vs_trl.py [--steps 12] [--models tiny,tiny-5m]

Same setting for everyone (the "digits" task, see ``reward``): 1 prompt x 8 completions x 32 new tokens,
LoRA r=8/alpha=16 on all linear layers, lr 1e-2, beta 0, the "grpo" loss. A step is what it takes to turn one
group into one update: sampling the 8 completions with the current policy (our HFEngine, in process; TRL's own
generate), rewards, old logprobs where needed, forward+backward, AdamW; for us also what our loop does after
each update so that the next samples come from the new policy: the checkpoint written (adapter + optimizer
state) and hot-loaded into the engine as ``name@step`` (TRL samples from the model it trains: nothing to load).
"bare fwd+bwd" is a plain peft model doing forward, backward and AdamW over the same token sequences with a
summed log-likelihood loss: the floor for our training part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.models.loading import resolve_model
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
from langgraph_art.serve.engines.hf.engine import HFEngine
from langgraph_art.train.trainer import GRPOTrainer
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn

PROMPT = [{"role": "user", "content": "Write some numbers."}]
N, NEW_TOKENS = 8, 32
LR = 1e-2


def reward(text: str, noise: random.Random | None = None) -> float:
    """Share of digits; the timing comparison adds a small random term so that no group has all-equal rewards
    (at lr 1e-2 the policy soon writes one completion 8 times, and with equal rewards our trainer rightly skips
    the update while TRL still runs it: both must train every step to compare step times). The learning
    comparison (``--learning``) uses the plain share."""
    chars = "".join(text.split())
    share = sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0
    return share + (0.01 * noise.random() if noise is not None else 0.0)


class Ours:
    """Our engine samples the group in process, our GRPOTrainer takes the step."""

    def __init__(self, path: str, lr: float = LR, seed: int = 0, noise: bool = True) -> None:
        self.engine = HFEngine(path, max_batch_size=N)
        config = GRPOConfig(learning_rate=lr, per_device_train_batch_size=N, seed=seed)
        self.trainer = GRPOTrainer(path, config, checkpoint_dir=tempfile.mkdtemp())
        self.seed = seed
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.engine.start())
        self.prompt = list(
            self.engine.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
        )
        self.steps = 0
        self.noise = random.Random(seed) if noise else None
        self.rewards: list[float] = []  # per step: the group's mean reward
        self.adapter: str | None = None  # the policy: base model until the first update
        self.sequences: list[list[int]] = []
        self.sampled_tokens: list[int] = []  # per step: the table's tok/s assume N x NEW_TOKENS, checked below
        self.updates: list[bool] = []  # per step: False when the trainer skipped it (all-equal rewards)

    def step(self) -> tuple[float, float, float]:
        """Seconds of the whole step, of its training part and of the checkpoint + hot reload."""
        started = time.perf_counter()
        # choice i samples with seed + i: each step takes its own block of N seeds (seed=step would give
        # consecutive steps 7 of 8 random streams in common, and a skipped step the same samples again)
        seed = (self.seed * 100_000 + self.steps) * N
        params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, n=N, seed=seed)
        request = GenerationRequest(self.prompt, params, adapter=self.adapter)
        result = self.loop.run_until_complete(self.engine.generate(request))
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
            runs.append(Trajectory(id=turn.id, status="ok", reward=reward(sample.text, self.noise), spans=spans))
        self.rewards.append(statistics.fmean(r.reward or 0.0 for r in runs))
        train_start = time.perf_counter()
        updated = self.trainer.step([TrajectoryGroup(id=str(self.steps), trajectories=runs)]).updated
        reload_start = time.perf_counter()
        if updated:  # as the service: a step that changed nothing writes and serves nothing
            self.loop.run_until_complete(self.reload(str(self.trainer.save_checkpoint())))
        end = time.perf_counter()
        self.steps += 1
        self.sequences = [self.prompt + s.token_ids for s in result.samples]
        self.sampled_tokens.append(sum(len(s.token_ids) for s in result.samples))
        self.updates.append(updated)
        return end - started, reload_start - train_start, end - reload_start

    async def reload(self, folder: str) -> None:
        """What the service does after an update: serve the new checkpoint, drop the one before."""
        previous, self.adapter = self.adapter, f"bench@{self.trainer.step_count}"
        await self.engine.load_adapter(self.adapter, folder)
        if previous is not None:
            await self.engine.unload_adapter(previous)

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
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=LR)

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
    from trl import GRPOTrainer as TRLTrainer

    ours, floor = Ours(path), Bare(path)
    times: dict[str, list[float]] = {"trl": [], "ours": [], "ours_train": [], "ours_reload": [], "bare": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times["trl"].append(time.perf_counter() - self.start)
            total, train, reload = ours.step()
            times["ours"].append(total)
            times["ours_train"].append(train)
            times["ours_reload"].append(reload)
            times["bare"].append(floor.step(ours.sequences))

    noise = random.Random(1)

    def rewards(completions: list[Any], **_: Any) -> list[float]:
        return [reward(c[0]["content"] if isinstance(c, list) else c, noise) for c in completions]

    args = trl_args(steps, LR, 0)
    args.logging_steps = 1000
    data = Dataset.from_list([{"prompt": PROMPT}] * (steps * N))
    trainer = TRLTrainer(
        model=path,
        reward_funcs=[rewards],
        args=args,
        train_dataset=data,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
        callbacks=[Interleave()],
    )
    trainer.train()
    ours.close()
    times["ours_tokens"] = [float(t) for t in ours.sampled_tokens]
    times["ours_updated"] = [float(u) for u in ours.updates]
    return times


THRESHOLD = 0.5


def trl_args(steps: int, lr: float, seed: int) -> Any:
    from trl import GRPOConfig as TRLConfig

    return TRLConfig(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=N,
        num_generations=N,
        max_completion_length=NEW_TOKENS,
        learning_rate=lr,
        beta=0.0,
        loss_type="grpo",
        report_to="none",
        max_steps=steps,
        save_strategy="no",
        logging_steps=1,
        temperature=1.0,
        disable_tqdm=True,
        seed=seed,
    )


def learning_curves(path: str, who: str, seed: int, steps: int, lr: float) -> list[float]:
    """The group's mean reward (plain digit share) at each step of one run."""
    if who == "ours":
        ours = Ours(path, lr=lr, seed=seed, noise=False)
        for _ in range(steps):
            ours.step()
        ours.close()
        return ours.rewards
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOTrainer as TRLTrainer

    curve: list[float] = []

    class Rewards(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                curve.append(float(logs["reward"]))

    def rewards(completions: list[Any], **_: Any) -> list[float]:
        return [reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    trainer = TRLTrainer(
        model=path,
        reward_funcs=[rewards],
        args=trl_args(steps, lr, seed),
        train_dataset=Dataset.from_list([{"prompt": PROMPT}] * (steps * N)),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
        callbacks=[Rewards()],
    )
    trainer.train()
    return curve


def compare_learning(models: list[str], seeds: int, steps: int, lr: float) -> None:
    """Steps to a mean group reward of THRESHOLD over ``seeds`` runs each, same hyper-parameters for both."""
    print(f"digits task without the noise term, lr {lr}, {steps} steps, seeds 0..{seeds - 1}, threshold {THRESHOLD}")
    print("| model | who | runs that reached it | median steps to it | mean reward, last 10 steps (median run) |")
    print("|---|---|---:|---:|---:|")
    for name in models:
        path = resolve_model(name)
        for who in ("ours", "TRL"):
            reached, finals = [], []
            for seed in range(seeds):
                curve = learning_curves(path, who.lower() if who == "ours" else "trl", seed, steps, lr)
                hit = next((i + 1 for i, r in enumerate(curve) if r >= THRESHOLD), None)
                if hit is not None:
                    reached.append(hit)
                finals.append(statistics.fmean(curve[-10:]))
                print(f"  {name} {who} seed {seed}: steps to {THRESHOLD}: {hit}; last 10 {finals[-1]:.2f}", flush=True)
            median = f"{statistics.median(reached):.0f}" if reached else "-"
            print(f"| {name} | {who} | {len(reached)} of {seeds} | {median} | {statistics.median(finals):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default="tiny,tiny-5m")
    parser.add_argument("--learning", action="store_true", help="compare learning (steps to a reward) instead")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--learning-steps", type=int, default=60)
    parser.add_argument("--learning-lr", type=float, default=5e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.learning:
        compare_learning(args.models.split(","), args.seeds, args.learning_steps, args.learning_lr)
        return
    rows = []
    for name in args.models.split(","):
        times = interleaved(resolve_model(name), args.warmup + args.steps)
        kept = {key: values[args.warmup :] for key, values in times.items()}
        med = {key: statistics.median(values) for key, values in kept.items()}
        ratio = statistics.median([t / o for t, o in zip(kept["trl"], kept["ours"], strict=True)])
        floor = statistics.median([o / b for o, b in zip(kept["ours_train"], kept["bare"], strict=True)])
        rows.append((name, med, ratio, floor))
        tokens, updates = kept["ours_tokens"], kept["ours_updated"]
        if min(tokens) < N * NEW_TOKENS or not all(updates):
            print(
                f"warning: {name}: our steps sampled {min(tokens):.0f}..{max(tokens):.0f} tokens (not all "
                f"{N * NEW_TOKENS}) or skipped {updates.count(0.0)} updates: tok/s and ratios overstate ours"
            )
    print(
        f"1 prompt x {N} completions x {NEW_TOKENS} tokens, LoRA r=8, median of {args.steps} steps "
        f"after {args.warmup} warm-up, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )
    print(
        "| model | ours ms/step | TRL ms/step | ours tok/s | TRL tok/s | ours/TRL | our training part ms | "
        "bare fwd+bwd ms | training / bare | our checkpoint + reload ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    tokens = N * NEW_TOKENS
    for name, med, ratio, floor in rows:
        print(
            f"| {name} | {med['ours'] * 1e3:.0f} | {med['trl'] * 1e3:.0f} | {tokens / med['ours']:.0f} | "
            f"{tokens / med['trl']:.0f} | {ratio:.2f}x | {med['ours_train'] * 1e3:.0f} | {med['bare'] * 1e3:.0f} | "
            f"{floor:.2f}x | {med['ours_reload'] * 1e3:.0f} |"
        )
    print("ratios are medians of per-step ratios (each TRL step paired with the step of ours that follows it)")


if __name__ == "__main__":
    main()
