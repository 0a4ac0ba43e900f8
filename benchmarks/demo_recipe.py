"""The tiny demo (`langgraph-art demo --tiny`) across seeds: its recipe against the one it replaced, in the same run.

    OMP_NUM_THREADS=1 python benchmarks/demo_recipe.py --seeds 0 1 2 [--only new]

For each seed (the LoRA's initialisation; sampling is not seeded) it runs ``run_demo`` with
- ``old``: the recipe before issue 16 (60 SFT steps at 1e-2, 40 GRPO steps, one update per step, temperature 1.0);
- ``new``: today's defaults (``./dev demo``: 100 SFT steps at 5e-3, 60 GRPO steps of 2 updates each
  (``num_iterations=2``), temperature 0.7),
and prints the first and last 5-step mean reward (of 2), the evaluations (each question 4 times, not trained on) and
the wall time. Point 4 of issue 16: ``new`` must reach last-5 >= 1.6 on every seed in <= 180 s.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from langgraph_art.demos.lookup import run_demo

RECIPES = {
    "old": {"warmup_steps": 60, "warmup_lr": 1e-2, "steps": 40, "num_iterations": 1, "temperature": 1.0},
    "new": {},  # run_demo's defaults
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", choices=sorted(RECIPES), default=None)
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for name, recipe in RECIPES.items():
            if args.only and name != args.only:
                continue
            with tempfile.TemporaryDirectory() as home:
                result = run_demo(home=home, seed=seed, echo=lambda *a: None, **recipe)
            evals = " ".join(f"{v:.2f}" for v in result["evals"]) or "-"
            rows.append((seed, name, result["first"], result["last"], evals, result["seconds"]))
            print(f"seed {seed} {name}: first 5 {result['first']:.2f}, last 5 {result['last']:.2f}", flush=True)
    print(f"\n{'seed':>4}  {'recipe':<6}  {'first 5':>7}  {'last 5':>6}  {'wall s':>6}  evaluations")
    for seed, name, first, last, evals, seconds in rows:
        print(f"{seed:>4}  {name:<6}  {first:>7.2f}  {last:>6.2f}  {seconds:>6.0f}  {evals}")


if __name__ == "__main__":
    main()
