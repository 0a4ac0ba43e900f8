"""A GRPO step of the email agent per phase, and its update against this machine's own matmul bound, same run.

    OMP_NUM_THREADS=2 python benchmarks/step_bound.py [--base-model qwen2.5-coder-0.5b] [--steps 1] [--threads 2]

Runs ``examples/email_agent.py`` (its defaults: 2 questions x 4 runs, the first call forced) for ``--steps`` steps and
reads each step's phases: rollout (sampling, tools, rewards), the update (``train/seconds``: sequences built, then per
micro-batch the forward, the loss and the backward, then AdamW) split into the forward (timed around the trainer's
``_token_logprobs``), AdamW (timed around ``optimizer.step``) and the rest (backward, loss, tokenizing), and the
checkpoint written and hot-loaded (``time/learn_s`` less the update).

The bound: the update's FLOPs over the machine's matmul throughput measured in the same process at the model's own
widest product ([512, hidden] x [hidden, intermediate], the MLP's, in the trainer's compute dtype, at the step's
thread count). FLOPs counted for T tokens forwarded, of which ``trained`` are sampled tokens trained on:

- the decoder's linear layers, forward and the gradient of their inputs (the base is frozen: no weight gradient),
  ``2 x 2 x N_body x T`` (``N_body``: the decoder's linear weights, embeddings and LM head excluded; the LoRA's
  own FLOPs, < 1% of them at r=8, not counted);
- attention's scores and weighted sum, ``4 x L x heads x head_dim x T^2 / 2`` forward, twice that backward;
- the LM head on the trained tokens only, ``2 x 2 x hidden x vocabulary x trained``.

Two counts. **As run** (the ratio that reads as the hardware's share, <= 1): the tokens the forward ran, a prompt
that a micro-batch's rows share once, padding included; a forward recomputed under gradient checkpointing is not
counted (it is overhead the ratio shows). **Each sequence whole** (unpadded, no prompt shared): what a plain trainer
would run; it exceeds the bound when sharing saves more than the step loses elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def cpu_line() -> str:
    from langgraph_art.models.precision import cpu_flags

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")  # fmt: skip
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(cpu_flags()) or '-'}"


def model_shape(config: Any) -> dict[str, int]:
    heads, hidden = int(config.num_attention_heads), int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv = int(getattr(config, "num_key_value_heads", heads))
    inter, layers = int(config.intermediate_size), int(config.num_hidden_layers)
    per_layer = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter  # q, o; k, v; MLP
    return {"hidden": hidden, "heads": heads, "head_dim": head_dim, "layers": layers, "intermediate": inter,
            "vocab": int(config.vocab_size), "n_body": layers * per_layer}  # fmt: skip


def update_flops(shape: dict[str, int], forwards: list[tuple[int, int, int]], trained: int) -> float:
    """The update's FLOPs (see the module docstring) over ``forwards``: (shared, rows, width) per forward, whose
    first ``shared`` tokens run once and the rest once per row (a sequence counted whole: shared 0, rows 1)."""
    attend = 3 * 4 * shape["layers"] * shape["heads"] * shape["head_dim"] / 2  # x T^2 for T tokens, fwd + bwd
    linear = sum(4 * shape["n_body"] * (shared + rows * (width - shared)) for shared, rows, width in forwards)
    attention = sum(attend * (shared**2 + rows * (width**2 - shared**2)) for shared, rows, width in forwards)
    head = 4 * shape["hidden"] * shape["vocab"] * trained
    return linear + attention + head


def matmul_bound(shape: dict[str, int], dtype: str, seconds: float = 2.0) -> float:
    """GFLOP/s of [512, hidden] x [hidden, intermediate] in ``dtype`` at torch's thread count, the best of 3 tries."""
    from langgraph_art.models.precision import gflops

    dims = (512, shape["hidden"], shape["intermediate"])
    return max(gflops(dtype, dims, seconds=seconds / 3) for _ in range(3))


class Phases:
    """Times the trainer's forward passes and optimizer steps, and the sequences it builds (wrapped in place)."""

    def __init__(self) -> None:
        from langgraph_art.train import trainer as trainer_module
        from langgraph_art.train.batches import MIN_SHARED_PREFIX, shared_prefix

        self.forward_s = 0.0
        self.optimizer_s = 0.0
        self.lengths: list[int] = []
        self.padded_tokens = 0
        self.executed: list[tuple[int, int, int]] = []  # per forward: (shared prompt run once, rows, padded width)
        self.compute_dtype = "float32"
        cls = trainer_module.GRPOTrainer
        forward, build, setup = cls._token_logprobs, trainer_module.build_sequences, cls._setup
        phases = self

        def timed_forward(trainer: Any, ids: Any, first: int, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return forward(trainer, ids, first, *args, **kwargs)
            finally:
                phases.forward_s += time.perf_counter() - started
                phases.padded_tokens += int(ids.numel())
                rows, width = ids.shape
                # what PolicyForward.hidden runs: the rows' common prompt once, when it shares (no checkpointing)
                shared = shared_prefix(ids, first - 1) if rows > 1 and not trainer._checkpoint_now else 0
                shared = shared if shared >= MIN_SHARED_PREFIX else 0
                phases.executed.append((shared, rows, int(width)))

        def recorded_build(*args: Any, **kwargs: Any) -> Any:
            sequences = build(*args, **kwargs)
            phases.lengths.extend(len(s) for s in sequences if any(s.mask))
            return sequences

        def timed_setup(trainer: Any, base: Any) -> None:
            setup(trainer, base)
            step = trainer.optimizer.step
            phases.compute_dtype = str(trainer.autocast or next(base.parameters()).dtype).removeprefix("torch.")

            def timed_step(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return step(*args, **kwargs)
                finally:
                    phases.optimizer_s += time.perf_counter() - started

            trainer.optimizer.step = timed_step

        cls._token_logprobs = timed_forward  # type: ignore[method-assign]
        cls._setup = timed_setup  # type: ignore[method-assign]
        trainer_module.build_sequences = recorded_build

    def take(self) -> dict[str, Any]:
        out = {"forward_s": self.forward_s, "optimizer_s": self.optimizer_s, "lengths": list(self.lengths),
               "padded_tokens": self.padded_tokens, "executed": list(self.executed)}  # fmt: skip
        self.forward_s = self.optimizer_s = 0.0
        self.lengths, self.padded_tokens, self.executed = [], 0, []
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--base-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=int(os.environ["OMP_NUM_THREADS"]))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpointing",
        choices=["default", "on", "off"],
        default="default",
        help="gradient checkpointing: the trainer's default for the model, or forced",
    )
    parser.add_argument("--example-args", default="", help="more arguments for email_agent.py, space-separated")
    args = parser.parse_args()
    import email_agent
    import torch
    from transformers import AutoConfig

    from langgraph_art.models.loading import resolve_model

    torch.set_num_threads(args.threads)
    phases = Phases()
    if args.checkpointing != "default":
        from langgraph_art.train import trainer as trainer_module

        cls, on = trainer_module.GRPOTrainer, args.checkpointing == "on"

        def forced(self: Any, batches: list) -> list:
            self._checkpoint_now = on
            return batches

        cls._plan_memory = forced  # type: ignore[method-assign]
    shape = model_shape(AutoConfig.from_pretrained(resolve_model(args.base_model)))
    home = tempfile.mkdtemp(prefix="step-bound-")
    argv = [
        "--base-model",
        args.base_model,
        "--steps",
        str(args.steps),
        "--held-out",
        "1",
        "--eval-generations",
        "1",
        "--home",
        home,
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        *args.example_args.split(),
    ]
    summary = email_agent.main(argv, echo=lambda *a: None)
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    per_step = [r for r in map(json.loads, lines) if r.get("split") == "train"]
    measured = phases.take()  # all steps together
    bound = {dtype: matmul_bound(shape, dtype) for dtype in ("float32", "bfloat16")}
    chosen = phases.compute_dtype
    update_s = sum(r["train/seconds"] for r in per_step)
    trained = int(sum(r["train/tokens"] for r in per_step))
    whole = update_flops(shape, [(0, 1, n) for n in measured["lengths"]], trained)  # each sequence whole, unpadded
    flops = update_flops(shape, measured["executed"], trained)  # as run: shared prompts once, padding included
    rollout_s = sum(r["time/rollout_s"] for r in per_step)
    learn_s = sum(r["time/learn_s"] for r in per_step)
    step_s = sum(r["time/step_s"] for r in per_step)
    other_s = update_s - measured["forward_s"] - measured["optimizer_s"]
    print(f"# {cpu_line()}; torch {torch.__version__}, {args.threads} threads; {args.base_model}, "
          f"N_body {shape['n_body'] / 1e6:.0f}M; {len(per_step)} step(s)")  # fmt: skip
    print(
        f"# matmul [512, {shape['hidden']}] x [{shape['hidden']}, {shape['intermediate']}]: "
        f"float32 {bound['float32']:.1f} GFLOP/s, bfloat16 {bound['bfloat16']:.1f}; the trainer computed in {chosen}"
    )
    print("| phase | s | share of the step |")
    print("|---|---:|---:|")
    rows = [("rollout (sampling, tools, rewards)", rollout_s), ("update: forward", measured["forward_s"]),
            ("update: backward, loss, tokenizing", other_s), ("update: AdamW", measured["optimizer_s"]),
            ("checkpoint + hot reload", learn_s - update_s)]  # fmt: skip
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {seconds / step_s:.0%} |")
    print(f"| whole step | {step_s:.1f} | 100% |")
    lengths = measured["lengths"]
    executed = sum(shared + rows * (width - shared) for shared, rows, width in measured["executed"])
    print(
        f"\nsequences {len(lengths)}, tokens {sum(lengths)} (longest {max(lengths)}, mean "
        f"{statistics.fmean(lengths):.0f}); forwarded {executed} in {len(measured['executed'])} micro-batches "
        f"(padding included, a shared prompt once); trained {trained}"
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process (engine, trainer, graph): {peak:.0f} MiB")
    rate = bound[chosen] * 1e9
    print(f"update {update_s:.1f} s. FLOPs as run {flops / 1e12:.2f} TFLOP: {flops / 1e9 / update_s:.1f} GFLOP/s, "
          f"**{flops / rate / update_s:.2f} of the {chosen} bound**. Each sequence counted whole "
          f"{whole / 1e12:.2f} TFLOP: {whole / rate / update_s:.2f} of the bound")  # fmt: skip


if __name__ == "__main__":
    main()
