"""The sampler/trainer mismatch, measured, and what its correction does to learning (issue 37).

    python benchmarks/sampler_mismatch.py --runs hf-0:none hf-0:token_truncate hf-1:none hf-1:token_truncate \
        --seeds 0 1 2 [--steps 14]

Each run is the demo's task (``run_demo``, ``langgraph_art/demos/units.py``: SmolLM2-135M-Instruct, 40 held-out
questions in phrasings never trained on, evaluated before the first step and after the last) in a fresh home. A run
is ``ENGINE-LAG:CORRECTION``: the engine that samples (``hf`` or ``vllm``, vLLM's CPU build: run this script with
``.venv-vllm/bin/python`` for it), ``max_steps_off_policy`` (0: sample, then train; 1: the next step's runs sample
while a step trains, one update behind) and ``importance_sampling_correction``. Everything else is the library's
defaults. It prints per run: the held-out share of arguments right before and after, and over the updated steps the
mean of ``train/mismatch/abs_max``, ``_kl``, ``_beyond_cap``, ``_is_weight``, the staleness (``off_policy/steps_mean``)
and ``train/clip_fraction``; then each run kind's mean gain and spread over the seeds. Rows are merged into
``benchmarks/sampler_mismatch.json`` (a rerun replaces its row). ``lscpu`` flags go with the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("sampler_mismatch.json")
KEYS = (
    "train/mismatch/abs_max",
    "train/mismatch/kl",
    "train/mismatch/beyond_cap",
    "train/mismatch/is_weight",
    "off_policy/steps_mean",
    "train/clip_fraction",
)


def run_one(kind: str, seed: int, steps: int) -> dict[str, Any]:
    from langgraph_art.demos.units import run_demo

    where, correction = kind.split(":")
    engine, lag = where.split("-")
    with tempfile.TemporaryDirectory() as home:
        result = run_demo(
            home=home,
            seed=seed,
            steps=steps,
            engine=engine,
            max_steps_off_policy=int(lag),
            config={"importance_sampling_correction": correction},
            echo=lambda *_: None,
        )
    updated = [m for m in result["history"] if m.get("train/updated")]
    means = {k: statistics.fmean(m[k] for m in updated if k in m) if any(k in m for m in updated) else None
             for k in KEYS}  # fmt: skip
    return {
        "kind": kind,
        "seed": seed,
        "steps": steps,
        "updated": len(updated),
        "before": result["before"],
        "after": result["after"],
        "gain": result["after"] - result["before"],
        "seconds": result["seconds"],
        **means,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["hf-0:token_truncate", "hf-1:none", "hf-1:token_truncate"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args()
    from prefix_cache import cpu_flags

    print(f"the demo's task, {args.steps} steps; {cpu_flags()}")
    print("| run | seed | updated | held-out before -> after | gain | abs_max | kl | beyond cap | is_weight | "
          "staleness | clip | s |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    fresh = []
    for seed in args.seeds:
        for kind in args.runs:
            row = run_one(kind, seed, args.steps)
            fresh.append(row)
            rows = [r for r in rows if (r["kind"], r["seed"], r["steps"]) != (kind, seed, args.steps)] + [row]
            RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
            print(
                f"| {kind} | {seed} | {row['updated']} | {row['before']:.3f} -> {row['after']:.3f} | "
                f"{row['gain']:+.3f} | {fmt(row[KEYS[0]], '.2e')} | {fmt(row[KEYS[1]], '.2e')} | "
                f"{fmt(row[KEYS[2]], '.4f')} | {fmt(row[KEYS[3]], '.4f')} | {fmt(row[KEYS[4]], '.2f')} | "
                f"{fmt(row[KEYS[5]], '.4f')} | {row['seconds']:.0f} |",
                flush=True,
            )
    print("\n| run | seeds | gain mean | gain min .. max |\n|---|---:|---:|---|")
    for kind in args.runs:
        gains = [r["gain"] for r in fresh if r["kind"] == kind]
        print(f"| {kind} | {len(gains)} | {statistics.fmean(gains):+.3f} | {min(gains):+.3f} .. {max(gains):+.3f} |")


if __name__ == "__main__":
    main()
