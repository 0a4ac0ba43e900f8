"""One GRPO step on long sequences, in a fresh process, reporting its peak memory:
``python -m tests.memory_worker TOKENS [--checkpointing]`` prints ``{"tokens": T, "before_mib": .., "peak_mib": ..}``.

``before`` is the resident memory after the trainer is built and has taken one short step (weights, optimizer,
allocator warm); the kernel's high-water mark is reset there (``/proc/self/clear_refs``), so ``peak - before`` is
what the long step itself needed, not hidden under an earlier peak (loading the weights peaks higher than they sit).
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.models.tiny import tiny_model
from langgraph_art.train.trainer import GRPOTrainer
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn


def status_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: the lifetime peak


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS


def group(tokens: int, vocab: int) -> TrajectoryGroup:
    runs = []
    for i, reward in enumerate((1.0, 0.0)):
        ids = torch.randint(10, vocab, (tokens,), generator=torch.Generator().manual_seed(i)).tolist()
        turn = Turn(id=f"t{i}", node="agent", prompt_token_ids=[1, 2, 3, 4], token_ids=ids,
                    logprobs=[-7.0] * tokens, params={"temperature": 1.0}, start_time=float(i))  # fmt: skip
        runs.append(Trajectory(id=f"r{i}", status="ok", reward=reward,
                               spans=[NodeSpan(id=f"s{i}", name="agent", turns=[turn])]))  # fmt: skip
    return TrajectoryGroup(id="g", trajectories=runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tokens", type=int)
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = GRPOConfig(learning_rate=1e-4, max_length=args.tokens + 16, per_device_train_batch_size=2,
                        gradient_checkpointing=args.checkpointing)  # fmt: skip
    with TemporaryDirectory() as home:
        trainer = GRPOTrainer(str(tiny_model(hidden_size=256, num_layers=6)), config, checkpoint_dir=Path(home))
        warm = group(16, len(trainer.tokenizer))
        trainer.step([warm])  # allocator and autograd warm, so `before` holds no one-time costs
        reset_peak()
        before = status_mib("VmRSS")
        result = trainer.step([group(args.tokens, len(trainer.tokenizer))])
        assert result.updated, result
        peak = status_mib("VmHWM")
    print(json.dumps({"tokens": args.tokens, "before_mib": before, "peak_mib": peak}))


if __name__ == "__main__":
    main()
