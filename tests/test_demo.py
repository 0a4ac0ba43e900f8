"""The main job runs end to end (a short version: the full one is `langgraph-art demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_engine_conformance import ENGINES

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("engine", ENGINES[1:])  # the transformers engine runs the full demo below
def test_demo_runs_warmup_then_grpo_and_writes_the_curve(tmp_path: Path, engine: str) -> None:
    from langgraph_art.demos.lookup import called_lookup, run_demo, scenarios, warmup_conversations

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


def test_the_tiny_demo_runs_from_the_command_line(tmp_path: Path) -> None:
    """``langgraph-art demo --tiny``: the lookup agent on the tiny model (its numbers: benchmarks/demo_recipe.py)."""
    from typer.testing import CliRunner

    from langgraph_art.cli import app

    done = CliRunner().invoke(app, ["demo", "--tiny", "--steps", "2", "--warmup-steps", "5", "--home", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert (
        "warm-up: 5 SFT steps" in done.output and "the same question after the warm-up and 2 GRPO steps" in done.output
    )


def test_the_real_model_learns_the_tool_by_grpo_alone(tmp_path: Path) -> None:
    """The main job on SmolLM2-135M-Instruct, shortened to 8 steps (``./dev demo`` runs 14): no warm-up, so whatever
    the held-out evaluation gains is GRPO's. Questions in phrasings never trained on; the untrained model gets about
    half of the arguments right (units default to meters). 14 steps, 3 seeds: benchmarks/README.md, issue 26."""
    from langgraph_art.demos.units import run_demo

    lines: list[str] = []
    result = run_demo(steps=8, home=tmp_path, echo=lines.append)
    assert len(result["curve"]) == 8 and result["png"].stat().st_size > 1000
    logged = [json.loads(line) for line in (result["png"].parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in logged if r["split"] == "eval"] == [0, 8]
    assert result["before"] < 0.75, result  # room to learn: the untrained model is not there already
    assert result["after"] >= result["before"] + 0.2, result
    assert result["calls_right"][1] > result["calls_right"][0]
    assert any("the same question after training" in line for line in lines)
    assert any("-> calls convert" in line for line in lines)
