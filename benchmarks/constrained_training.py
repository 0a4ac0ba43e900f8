"""GRPO on a structured-output node: the grammar's mask in the loss ("masked", the default) against not ("unmasked").

    OMP_NUM_THREADS=1 python benchmarks/constrained_training.py [--steps 30] [--seeds 0 1 2]

The task is ``examples/router.py``: one LangGraph node answering ``with_structured_output(Route)`` (a destination
among four, and a short note), reward 1 for the destination the question's topic calls for. The random-init tiny
model never writes JSON on its own, so every answer is valid only because the server decodes under the schema's
grammar, and both modes sample exactly alike. What differs is the trainer. "masked" recomputes each token's logprob
under the mask it was sampled with: the importance ratio starts at 1 and a forced token carries no gradient.
"unmasked" takes it over the whole vocabulary: the ratio starts at the probability the policy put inside the mask
(mostly far below 1 - epsilon, so clipped for every negative advantage), and the forced format tokens get gradient.
That was measured under ``importance_sampling_correction="none"``; under the default correction since (issue 37)
the ratio is to the trainer's own logprobs and that probability becomes each token's importance weight instead.

Prints, per seed and mode: the train reward's mean over the first and last 5 steps, the held-out evaluation (the
third question of each topic, 8 runs each) before and after, the first pass's mean ratio and clip fraction, the
policy's probability inside the grammar's mask (``train/grammar/mass``), and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import router  # examples/router.py

KEYS = ("train/ratio_mean", "train/clip_fraction", "train/grammar/mass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--learning-rate", default="1e-3")
    args = parser.parse_args()
    print(f"examples/router.py: {args.steps} steps of 16 runs x 2 questions, lr {args.learning_rate}, temperature 1")
    print("| seed | mode | first 5 | last 5 | held-out before -> after | ratio (1st pass) | clip | mass | wall s |")
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for seed in args.seeds:
        for mode in ("masked", "unmasked"):
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as home:
                argv = ["--steps", str(args.steps), "--seed", str(seed), "--home", home]
                argv += ["--learning-rate", args.learning_rate, "--constrained-logprobs", mode]
                summary = router.main(argv, echo=lambda *_: None)
                lines = (summary["run_dir"] / "metrics.jsonl").read_text().splitlines()
                steps = [r for r in map(json.loads, lines) if r["split"] == "train" and "train/ratio_mean" in r]
            wall = time.perf_counter() - started
            curve, evals = summary["curve"], summary["evals"]
            ratio, clip, mass = (statistics.fmean(r[k] for r in steps) for k in KEYS)
            print(
                f"| {seed} | {mode} | {statistics.fmean(curve[:5]):.2f} | {statistics.fmean(curve[-5:]):.2f} | "
                f"{evals[0]['eval/reward/mean']:.2f} -> {evals[-1]['eval/reward/mean']:.2f} | "
                f"{ratio:.3f} | {clip:.3f} | {mass:.3f} | {wall:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
