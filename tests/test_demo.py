"""The main job runs end to end (a short version: the full one is `langgraph-art demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_engine_conformance import ENGINES

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("engine", ENGINES[1:])  # the transformers engine runs the full demo below
def test_demo_runs_warmup_then_grpo_and_writes_the_curve(tmp_path: Path, engine: str) -> None:
    from langgraph_art.demo import called_lookup, run_demo, scenarios, warmup_conversations

    lines: list[str] = []
    result = run_demo(steps=3, warmup_steps=20, home=tmp_path, engine=engine, echo=lines.append)
    assert len(result["curve"]) == 3 and result["png"].stat().st_size > 1000
    assert any(line.startswith("warm-up: 20 SFT steps") for line in lines)
    logged = [json.loads(line) for line in (result["png"].parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in logged] == ["eval", "train", "eval", "train", "eval", "train", "eval"]
    assert any("the same question after the warm-up and 3 GRPO steps" in line for line in lines)
    assert len(scenarios()) == len(warmup_conversations()) == 6
    assert called_lookup.name == "called_lookup"
    assert logged[1]["step"] >= 0


def test_the_demo_agent_is_clearly_good_by_the_end(tmp_path: Path) -> None:
    """What ``./dev demo`` runs (seed 0): last 5 steps >= 1.6 of 2, i.e. >= 80% of runs right, the evaluation far
    above the untrained model's, the run log and the transcripts. benchmarks/README.md has the three-seed numbers."""
    from langgraph_art.demo import run_demo

    lines: list[str] = []
    result = run_demo(home=tmp_path, echo=lines.append)
    assert len(result["curve"]) == 60 and result["png"].stat().st_size > 1000
    assert any(line.startswith("warm-up: 100 SFT steps") for line in lines)
    logged = [json.loads(line) for line in (result["png"].parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in logged if r["split"] == "eval"] == [0, 15, 30, 45, 60]
    assert [r["iteration"] for r in logged if r["split"] == "train"] == list(range(1, 61))
    assert result["last"] >= 1.6, result["curve"]
    assert result["evals"][-1] >= 1.6 and result["untrained"] < 0.5, (result["untrained"], result["evals"])
    assert any("one question before training (the untrained model" in line for line in lines)
    assert any("-> calls lookup" in line for line in lines)  # the trained run's transcript
