"""The agent examples on SmolLM2-135M across seeds, with their defaults: held-out success before and after training.

    python benchmarks/agents.py email_agent [--seeds 0 1 2] [--out DIR] [example options]
    python benchmarks/agents.py when_to_call [--seeds 0 1 2]

For each seed (the inbox or the question split, the LoRA's initialisation; sampling is not seeded) it runs the
example as documented (`python examples/<name>.py --seed S`) and prints what its held-out evaluations measured:
email_agent: the share of runs answered right, the share that read the right email, and the searches and reads of
the runs answered right; when_to_call: the share answered right and the share of runs that called the tool, on the
questions that need it and on those that do not. The noise column is one evaluation's binomial standard error,
sqrt(p (1 - p) / runs), at the larger of its two rates; the untrained starts' spread across seeds is printed below.
Issue 36: each seed's gain must be at least twice the noise.
"""

from __future__ import annotations

import argparse
import importlib
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

COLUMNS = {
    "email_agent": [("right", "right"), ("read", "read the email"), ("calls_when_right", "calls when right")],
    "when_to_call": [
        ("right", "right"),
        ("called_needs_tool", "called, needed"),
        ("called_no_tool", "called, not needed"),
    ],
}


def noise(first: dict[str, float], last: dict[str, float]) -> float:
    p = max(first["right"], last["right"])
    return math.sqrt(p * (1 - p) / max(last["runs"], 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("example", choices=sorted(COLUMNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None, help="keep each seed's curve and metrics.jsonl in OUT/seed-N")
    args, rest = parser.parse_known_args()
    example = importlib.import_module(args.example)
    rows: list[tuple[int, dict[str, float], dict[str, float], float]] = []
    for seed in args.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as home:
            summary: dict[str, Any] = example.main(["--seed", str(seed), "--home", home, *rest], echo=lambda *a: None)
            if args.out:
                shutil.copytree(summary["run_dir"], Path(args.out) / f"seed-{seed}", dirs_exist_ok=True)
        first, last = summary["held_out"][0], summary["held_out"][-1]
        rows.append((seed, first, last, time.perf_counter() - started))
        print(f"seed {seed}: " + ", ".join(f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k, _ in COLUMNS[args.example]),
              flush=True)  # fmt: skip
    heads = "  ".join(f"{label:>22}" for _, label in COLUMNS[args.example])
    print(f"\n{'seed':>4}  {heads}  {'gain':>6}  {'noise':>5}  wall")
    for seed, first, last, seconds in rows:
        cells = "  ".join(f"{f'{first[k]:.3f} -> {last[k]:.3f}':>22}" for k, _ in COLUMNS[args.example])
        gain = last["right"] - first["right"]
        print(f"{seed:>4}  {cells}  {gain:>+6.3f}  {noise(first, last):>5.3f}  {seconds / 60:.0f} min")
    starts = [first["right"] for _, first, _, _ in rows]
    print(f"\nuntrained held-out success across seeds: {min(starts):.3f}-{max(starts):.3f}"
          f" (spread {max(starts) - min(starts):.3f}); runs per evaluation: {rows[0][2]['runs']:.0f}")  # fmt: skip
    gains = [last["right"] - first["right"] for _, first, last, _ in rows]
    print(f"gain: mean {statistics.fmean(gains):+.3f}, min {min(gains):+.3f}, max {max(gains):+.3f}")


if __name__ == "__main__":
    main()
