"""examples/function_calling.py (SmolLM2-135M-Instruct on BFCL simple_python) across seeds, with its defaults.

    python benchmarks/function_calling.py [--seeds 0 1 2] [--out DIR] [example options]

For each seed (the LoRA's initialisation and the order of the 320 training cases; sampling is not seeded) it runs the
example as documented and prints BFCL's held-out accuracy (80 cases, every argument right) at each evaluation, the
train reward and the wall time. Issue 26: the last evaluation must beat the first by >= 0.10 on every seed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import function_calling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None, help="keep each seed's curve and metrics.jsonl in OUT/seed-N")
    args, rest = parser.parse_known_args()
    rows = []
    for seed in args.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as home:
            summary = function_calling.main(["--seed", str(seed), "--home", home, *rest], echo=lambda *a: None)
            if args.out:
                shutil.copytree(summary["run_dir"], Path(args.out) / f"seed-{seed}", dirs_exist_ok=True)
        evals = [e["eval/reward/mean"] for e in summary["evals"]]
        train = [statistics.fmean(summary["curve"][:5]), statistics.fmean(summary["curve"][-5:])]
        rows.append((seed, evals, train, time.perf_counter() - started))
        print(f"seed {seed}: held-out accuracy {' -> '.join(f'{v:.3f}' for v in evals)}", flush=True)
    print(f"\n{'seed':>4}  {'held-out accuracy at each evaluation':<40}  {'gain':>6}  {'train first/last 5':>18}  wall")
    for seed, evals, train, seconds in rows:
        line = " -> ".join(f"{v:.3f}" for v in evals)
        print(f"{seed:>4}  {line:<40}  {evals[-1] - evals[0]:>+6.3f}  {train[0]:>8.2f} / {train[1]:<7.2f}  "
              f"{seconds / 60:.0f} min")  # fmt: skip
    gains = [evals[-1] - evals[0] for _, evals, _, _ in rows]
    print(f"\ngain: mean {statistics.fmean(gains):+.3f}, min {min(gains):+.3f}, max {max(gains):+.3f}")


if __name__ == "__main__":
    main()
