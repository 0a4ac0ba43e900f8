"""The main job runs end to end (a short version: the full one is `langgraph-art demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_engine_conformance import ENGINES

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("engine", ENGINES)
def test_demo_runs_warmup_then_grpo_and_writes_the_curve(tmp_path: Path, engine: str) -> None:
    from langgraph_art.demo import called_lookup, run_demo, scenarios, warmup_conversations

    lines: list[str] = []
    result = run_demo(steps=3, warmup_steps=20, home=tmp_path, engine=engine, echo=lines.append)
    assert len(result["curve"]) == 3 and result["png"].stat().st_size > 1000
    assert any(line.startswith("warm-up: 20 SFT steps") for line in lines)
    assert (result["png"].parent / "metrics.jsonl").read_text().count("\n") == 3
    assert len(scenarios()) == len(warmup_conversations()) == 6
    assert called_lookup.name == "called_lookup"
    assert json.loads((result["png"].parent / "metrics.jsonl").read_text().splitlines()[0])["step"] >= 0
