"""The library's defaults chosen by measurement (issue 35): the demo's task (``langgraph-art demo``) at a grid of
learning rates and temperatures x seeds, everything else at the library's defaults.

    python benchmarks/defaults.py --settings old lr2e-4 --seeds 0 1 2 [--threads 2] [--steps 28]

Each run is ``run_demo`` (``langgraph_art/demos/units.py``: SmolLM2-135M-Instruct, 40 held-out questions in phrasings
never trained on, evaluated before the first step and after the last) in a fresh ``home``; a setting only names what
it changes, the rest is ``GRPOConfig()``, ``ChatART(model=model)`` and ``art.Trainer(...)`` defaults. ``old`` is the
peer: the defaults before issue 35 (learning rate 1e-5, the server's temperature 1.0). ``default`` is whatever the
library's defaults are now. It prints a table (setting, seed, held-out share of arguments right before and after, the
gain, whole calls right before and after, seconds) and merges the rows into ``benchmarks/defaults.json`` (one row per
setting and seed; a rerun replaces it).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS: dict[str, dict[str, Any]] = {
    "old": {"learning_rate": 1e-5, "temperature": 1.0},
    "default": {},
    "lr1e-4": {"learning_rate": 1e-4, "temperature": 0.7},
    "lr2e-4": {"learning_rate": 2e-4, "temperature": 0.7},
    "lr4e-4": {"learning_rate": 4e-4, "temperature": 0.7},
    "lr2e-4-t1.0": {"learning_rate": 2e-4, "temperature": 1.0},
    "lr2e-4-2q": {"learning_rate": 2e-4, "temperature": 0.7, "scenarios_per_step": 2},
}
RESULTS = Path(__file__).with_name("defaults.json")


def run_one(setting: str, seed: int, steps: int | None, threads: int | None) -> dict[str, Any]:
    """One demo run in a fresh home; the row for the table and the JSON."""
    from langgraph_art.demos.units import run_demo

    with tempfile.TemporaryDirectory() as home:
        extra = {} if steps is None else {"steps": steps}
        result = run_demo(home=home, seed=seed, threads=threads, echo=lambda *_: None, **extra, **SETTINGS[setting])
    return {
        "setting": setting,
        "seed": seed,
        "before": result["before"],
        "after": result["after"],
        "gain": result["after"] - result["before"],
        "calls_before": result["calls_right"][0],
        "calls_after": result["calls_right"][1],
        "seconds": result["seconds"],
        "settings": result["settings"],
        "curve": result["curve"],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'setting':<12} {'seed':>4} {'lr':>7} {'temp':>5} {'q/step':>6} {'steps':>5} {'before':>6} {'after':>6} "
          f"{'gain':>6} {'calls before -> after':>21} {'s':>5}")  # fmt: skip
    for r in rows:
        s = r["settings"]
        calls = f"{r['calls_before']:.0%} -> {r['calls_after']:.0%}"
        print(f"{r['setting']:<12} {r['seed']:>4} {s['learning_rate']:>7g} {s['temperature']!s:>5} "
              f"{s['scenarios_per_step']:>6} {s['steps']:>5} {r['before']:>6.2f} {r['after']:>6.2f} "
              f"{r['gain']:>+6.2f} {calls:>21} {r['seconds']:>5.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["old", "default"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: every core)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's)")
    parser.add_argument("--table", action="store_true", help="print the table of benchmarks/defaults.json only")
    args = parser.parse_args()
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    if not args.table:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads or os.cpu_count() or 1))
        for seed in args.seeds:
            for setting in args.settings:
                row = run_one(setting, seed, args.steps, args.threads)
                print(f"{setting} seed {seed}: {row['before']:.2f} -> {row['after']:.2f} ({row['gain']:+.2f}), "
                      f"whole calls {row['calls_before']:.0%} -> {row['calls_after']:.0%}, {row['seconds']:.0f} s",
                      flush=True)  # fmt: skip
                stored = [r for r in stored if (r["setting"], r["seed"]) != (setting, seed)] + [row]
                RESULTS.write_text(json.dumps(stored, indent=1) + "\n")
    print_table(sorted(stored, key=lambda r: (list(SETTINGS).index(r["setting"]), r["seed"])))


if __name__ == "__main__":
    main()
