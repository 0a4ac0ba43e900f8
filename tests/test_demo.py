"""The main job runs end to end (a short version: the full one is `langgraph-art demo`)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# The tiny lookup demo's warm-up in these short runs: 50 SFT steps leave the agent right on some runs of a question
# and wrong on others, so GRPO's groups differ and its steps update. Measured on 2 cores: after 5 or 20 steps every
# run scored 0 and after the demo's 100 every run scored 2 of 2; either way every group scored the same and every
# GRPO step was skipped (train/updated 0), which the old checks here let pass.
WARMUP = 50


def run_log(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def assert_grpo_updated(logged: list[dict]) -> list[dict]:
    """The run's GRPO steps updated the policy: at least one did, each that did trained on tokens and wrote the next
    checkpoint after the one the first evaluation saw (the warm-up's), and the last evaluation saw the last of them.
    A GRPO phase whose steps were all skipped (each group's runs scoring the same) fails here. The updates."""
    evals = [r for r in logged if r["split"] == "eval"]
    train = [r for r in logged if r["split"] == "train"]
    updated = [r for r in train if r["train/updated"]]
    assert updated, [(r["reward/mean"], r["reward/std"]) for r in train]
    assert all(r["train/tokens"] > 0 for r in updated), updated
    start = evals[0]["policy_step"]
    assert [r["step"] for r in updated] == list(range(start + 1, start + 1 + len(updated))), updated
    assert evals[-1]["policy_step"] == start + len(updated), evals
    return updated


def test_the_tiny_demo_runs_from_the_command_line(tmp_path: Path) -> None:
    """``langgraph-art demo --tiny``: the lookup agent on the tiny model (its numbers: benchmarks/demo_recipe.py),
    warm-up then GRPO steps that update the policy."""
    from typer.testing import CliRunner

    from langgraph_art.cli import app

    argv = ["demo", "--tiny", "--steps", "3", "--warmup-steps", str(WARMUP), "--home", str(tmp_path)]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, done.output
    assert f"warm-up: {WARMUP} SFT steps" in done.output
    assert "the same question after the warm-up and 3 GRPO steps" in done.output
    (metrics,) = tmp_path.glob("demo/runs/*/metrics.jsonl")
    assert_grpo_updated(run_log(metrics))


def test_the_tiny_demo_learns_past_its_warm_up(tmp_path: Path) -> None:
    """GRPO's own gain on the lookup demo, past its warm-up (whose gain does not count). Its 24 steps train on 32
    runs each, its evaluations score 24: the evaluations are too few to show a gain of this size every time (one
    evaluation's standard error is ~0.17 of 2), so the claim rests on the training reward, step 19-24 against
    step 1-6 (192 runs each), and the evaluations only have to beat the one after the warm-up once. Measured on 2
    cores, OMP_NUM_THREADS=1, seeds 0-3, as is and with ATEN_CPU_CAPABILITY=default (other kernels, other float
    rounding): training reward +0.14 to +0.72; best evaluation after the warm-up's +0.13 to +1.25 (17 runs with
    mkldnn off too), 22-31 s each. The end-against-start evaluation this test once asked for (>= +0.3) failed on CI's
    other CPU (0.54 -> 0.63) and on seed 2 here (0.71 -> 0.71). This demo evaluates its six training questions (fresh
    runs, never trained on); questions in phrasings never trained on are the real model's test below."""
    from langgraph_art.demos.lookup import run_demo

    result = run_demo(steps=24, warmup_steps=WARMUP, home=tmp_path, echo=lambda *_: None)
    logged = run_log(result["png"].parent / "metrics.jsonl")
    assert len(assert_grpo_updated(logged)) >= 12  # most steps trained (measured: 23-24 of 24)
    train = [r["reward/mean"] for r in logged if r["split"] == "train"]
    assert statistics.fmean(train[-6:]) > statistics.fmean(train[:6]), train
    evals = [r for r in logged if r["split"] == "eval"]
    assert [r["iteration"] for r in evals] == [0, 6, 12, 18, 24]
    scores = [r["eval/reward/mean"] for r in evals]
    assert max(scores[1:]) > scores[0], scores


def test_the_real_model_learns_the_tool_by_grpo_alone(tmp_path: Path) -> None:
    """The main job as a user runs it (``langgraph-art demo``, its own process, its own thread setting) on
    SmolLM2-135M-Instruct at the library's defaults, shortened to 14 steps of 1 question (``./dev demo`` runs 28):
    no warm-up, so whatever the held-out evaluation gains is GRPO's. Questions in phrasings never trained on; the
    untrained model gets about half of the arguments right (units default to meters). 28 steps, 3 seeds:
    benchmarks/README.md, issue 35.

    The bar is twice the run-to-run spread of an evaluation (0.058-0.075: the same untrained model sampled again).
    At 10 steps the gain was too close to it to hold everywhere: CI's machine measured 0.525 -> 0.70 (+0.175 against
    a bar of +0.2), and here 4 runs (seeds 0, 0, 1, 2) gained +0.38, +0.30, +0.42, +0.12 by step 10 and +0.43,
    +0.38, +0.46, +0.21 by step 14 (seed 0 under torch's AVX2 kernels: +0.42, +0.48); each step ~7.5 s on 2 cores."""
    from langgraph_art.store import TrajectoryStore

    argv = [sys.executable, "-m", "langgraph_art.cli", "demo", "--steps", "14", "--home", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (metrics,) = tmp_path.glob("demo/runs/*/metrics.jsonl")
    assert (metrics.parent / "reward_curve.png").stat().st_size > 1000
    logged = run_log(metrics)
    assert len([r for r in logged if r["split"] == "train"]) == 14
    evals = [r for r in logged if r["split"] == "eval"]
    assert [r["iteration"] for r in evals] == [0, 14]
    assert_grpo_updated(logged)
    # the baseline is the evaluation just before the first GRPO step (with no warm-up, the untrained model's), the
    # end the one after the last; both on questions no training run was asked
    assert evals[0]["policy_step"] == 0 and evals[-1]["policy_step"] > 0
    before, after = evals[0]["eval/reward/mean"], evals[-1]["eval/reward/mean"]
    shown = re.search(r"arguments right: ([\d.]+) before training -> ([\d.]+) after 14 steps; "
                      r"whole calls right: (\d+)% -> (\d+)%", done.stdout)  # fmt: skip
    assert shown, done.stdout[-3000:]
    assert (float(shown[1]), float(shown[2])) == (round(before, 2), round(after, 2))  # it prints what it logged
    store = TrajectoryStore.for_project("demo", home=tmp_path)

    def asked(split: str) -> set[str]:
        return {json.dumps(run.input, sort_keys=True, default=str) for run in store.trajectories(split=split)}

    assert asked("eval") and asked("train") and not asked("eval") & asked("train")
    assert before < 0.75, (before, after)  # room to learn: the untrained model is not there already
    assert after >= before + 0.15, (before, after)  # GRPO improved on it, by twice the noise
    assert int(shown[4]) > int(shown[3])  # whole calls right
    assert "the same question after training" in done.stdout and "-> calls convert" in done.stdout
