"""Contract test against a real Langfuse: runs when LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL
are set in the environment of the test run, skipped otherwise (a real Langfuse cannot run on CI machines).

    LANGFUSE_PUBLIC_KEY=pk-lf-... LANGFUSE_SECRET_KEY=sk-lf-... LANGFUSE_BASE_URL=https://cloud.langfuse.com \\
        .venv/bin/python -m pytest tests/test_langfuse_contract.py -v
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph_art_langfuse import LangfuseExporter, LangfuseScoreReward, trace_id

import langgraph_art as art
from langgraph_art.types import NodeSpan, ToolCallRecord, Turn

pytestmark = pytest.mark.integration


@pytest.fixture
def keys(real_langfuse: dict[str, str]) -> dict[str, str]:
    found = {
        "public_key": real_langfuse.get("LANGFUSE_PUBLIC_KEY"),
        "secret_key": real_langfuse.get("LANGFUSE_SECRET_KEY"),
        "base_url": real_langfuse.get("LANGFUSE_BASE_URL") or real_langfuse.get("LANGFUSE_HOST"),
    }
    if not all(found.values()):
        pytest.skip(
            "set LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL to test against a real Langfuse"
        )
    return found  # type: ignore[return-value]


def one_trajectory() -> art.Trajectory:
    now = time.time() - 5
    turn = Turn(
        id=uuid.uuid4().hex,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        output={"role": "assistant", "content": "It is sunny in Paris."},
        prompt_token_ids=[1, 2, 3],
        token_ids=[4, 5, 6, 7],
        logprobs=[-0.1, -0.2, -0.3, -0.4],
        model="contract@3",
        policy_step=3,
        node="agent",
        start_time=now + 0.1,
        latency_s=0.5,
    )
    call = ToolCallRecord(
        id="c1",
        run_id="r1",
        name="get_weather",
        arguments={"city": "Paris"},
        result="Sunny",
        start_time=now + 0.7,
        end_time=now + 0.8,
    )
    span = NodeSpan(
        id="n1", name="agent", step=1, start_time=now, end_time=now + 1, status="ok", turns=[turn], tool_calls=[call]
    )
    return art.Trajectory(
        id=f"contract-{uuid.uuid4().hex}",
        name="contract-agent",
        spans=[span],
        input={"question": "Weather in Paris?"},
        output={"answer": "It is sunny in Paris."},
        status="ok",
        start_time=now,
        end_time=now + 1.2,
        metadata={"policy_step": 3, "training_run": "contract", "group_id": "g", "scenario_id": "s"},
        reward=0.75,
        rewards={"found": 1.0, "short": 0.5},
    )


def eventually(fetch: Callable[[], Any], done: Callable[[Any], bool], seconds: float = 120) -> Any:
    """Langfuse ingests asynchronously: poll until ``done`` (or give up)."""
    deadline = time.time() + seconds
    while True:
        value = fetch()
        if done(value) or time.time() > deadline:
            return value
        time.sleep(3)


def test_a_trajectory_and_its_scores_arrive_in_a_real_langfuse(tmp_path: Path, keys: dict[str, str]) -> None:
    store = art.TrajectoryStore(tmp_path / "store.sqlite")
    trajectory = one_trajectory()
    store.add_trajectory(trajectory)
    exporter = LangfuseExporter(store, **keys)
    report = exporter.export()
    assert report.ok and report.traces == 1 and report.spans == 4 and report.scores == 3, report
    api, tid = exporter.settings.api(), trace_id(trajectory.id)

    observations = eventually(
        lambda: api.observations.get_many(trace_id=tid, fields="core,basic,model,usage,trace_context").data,
        lambda data: len(data) == 4,
    )
    by_type = {o.type: o for o in observations}
    assert set(by_type) >= {"SPAN", "GENERATION", "TOOL"}, observations
    generation = by_type["GENERATION"]
    assert generation.model == "contract@3"
    assert generation.usage_details.get("output") == 4

    scores = eventually(lambda: api.scores.get_many(trace_id=tid).data, lambda data: len(data) >= 3)
    values = {s.name: s.value for s in scores}
    assert {name: values.get(name) for name in ("reward", "reward/found", "reward/short")} == {
        "reward": 0.75,
        "reward/found": 1.0,
        "reward/short": 0.5,
    }

    api.scores.create(request=[{"traceId": tid, "name": "contract-feedback", "value": 0.25, "dataType": "NUMERIC"}])
    feedback = LangfuseScoreReward("contract-feedback", **keys)
    group = art.TrajectoryGroup(id="g", trajectories=[trajectory])
    eventually(lambda: feedback.fetch([tid])[tid], lambda found: bool(found))
    art.score_groups([group], [feedback])
    assert trajectory.reward == 0.25
