"""@reward functions and their combination, on hand-built groups (no model needed)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from langchain_core.messages import AIMessage

import langgraph_art as art
from langgraph_art.errors import ConfigError, RewardError
from langgraph_art.rewards.combine import score_groups
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn


def run(i: int, answer: str, *, status: str = "ok", nodes: tuple[str, ...] = ("agent",)) -> Trajectory:
    spans = [
        NodeSpan(id=f"r{i}-s{k}", name=name, turns=[Turn(id=f"r{i}-t{k}", node=name, start_time=float(k))])
        for k, name in enumerate(nodes)
    ]
    trajectory = Trajectory(id=f"r{i}", status=status, spans=spans, metadata={"generation": i})
    trajectory.final_state = {"messages": [AIMessage(answer)]}
    return trajectory


def group(*answers: str, failed: int = 0) -> TrajectoryGroup:
    runs = [run(i, a) for i, a in enumerate(answers)]
    runs += [run(100 + i, "", status="failed") for i in range(failed)]
    return TrajectoryGroup(id="g1", scenario_id="s1", scenario={"input": {}, "answer": "42"}, trajectories=runs)


def test_injection_by_name_weights_and_subscores() -> None:
    seen: list[tuple[str, ...]] = []

    @art.reward
    def correct(state, scenario) -> float:
        seen.append(("correct", scenario["answer"]))
        return float(scenario["answer"] in state["messages"][-1].content)

    @art.reward(name="style", weight=0.5)
    def style_parts(trajectory, metadata) -> dict:
        assert trajectory.id.startswith("r") and "generation" in metadata
        return {"short": len(trajectory.final_state["messages"][-1].content) < 5, "polite": 0.0}

    g = group("42", "I think 41", failed=1)
    report = score_groups([g], [correct, style_parts])
    good, bad, failed = g.trajectories
    assert good.rewards == {"correct": 1.0, "style": 0.5, "style/short": 1.0, "style/polite": 0.0}
    assert good.reward == pytest.approx(1.0 + 0.5 * 0.5)
    assert bad.rewards["correct"] == 0.0 and bad.reward == pytest.approx(0.5 * 0.0)
    assert failed.reward is None and failed.rewards == {}  # failed runs are not scored
    assert report.metrics["reward/correct"] == 0.5 and report.metrics["reward/style/short"] == 0.5
    assert report.metrics["reward/total"] == pytest.approx((1.25 + 0.0) / 2)
    assert seen == [("correct", "42"), ("correct", "42")]
    assert correct(state={"messages": [AIMessage("42")]}, scenario={"answer": "42"}) == 1.0  # still a function


def test_unknown_parameters_and_bad_options_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"asks for \['answer'\].*state"):
        art.reward(lambda answer: 1.0)
    with pytest.raises(ConfigError, match="node="):
        art.reward(lambda span: 1.0)
    with pytest.raises(ConfigError, match="on_error"):
        art.reward(on_error="ignore")(lambda state: 1.0)  # type: ignore[arg-type]


def test_async_rewards_run_concurrently() -> None:
    """Each call waits until all six are under way at once: one at a time, the first would wait alone and fail."""
    running: list[int] = []
    all_running = asyncio.Event()

    @art.reward
    async def slow(trajectory) -> float:
        running.append(1)
        if len(running) == 6:
            all_running.set()
        try:
            await asyncio.wait_for(all_running.wait(), 30)
        except TimeoutError:
            raise AssertionError(f"only {len(running)} of 6 reward calls ran at once") from None
        return 1.0

    g = group(*["x"] * 6)
    score_groups([g], [slow])
    assert all(t.reward == 1.0 for t in g.trajectories), [t.reward for t in g.trajectories]


def test_abstaining_and_all_abstained_warning(caplog: pytest.LogCaptureFixture) -> None:
    @art.reward
    def only_long(state) -> float | None:
        text = state["messages"][-1].content
        return None if len(text) < 3 else 1.0

    g = group("a long answer", "no")
    report = score_groups([g], [only_long])
    assert g.trajectories[0].reward == 1.0 and g.trajectories[1].reward is None
    assert report.all_abstained == ["r1"] and "every reward abstained" in caplog.text


def test_per_node_rewards_land_on_spans_not_in_the_total() -> None:
    @art.reward(node="critic", weight=2.0)
    def critic_quality(span, trajectory) -> float:
        return 0.25 if span.name == "critic" else math.nan

    @art.reward
    def overall(trajectory) -> float:
        return 1.0

    g = TrajectoryGroup(id="g", trajectories=[run(0, "x", nodes=("agent", "critic", "critic"))])
    report = score_groups([g], [critic_quality, overall])
    agent, critic1, critic2 = g.trajectories[0].spans
    assert agent.reward is None and critic1.reward == 0.5 and critic2.rewards == {"critic_quality": 0.25}
    assert g.trajectories[0].reward == 1.0
    assert report.metrics["reward/critic_quality"] == 0.25


def test_group_level_rewards_by_list_or_id() -> None:
    @art.reward
    def rank(group) -> list[float]:
        return [1.0 if i == 0 else 0.0 for i, _ in enumerate(group.completed())]

    @art.reward
    def by_id(group) -> dict[str, float]:
        return {t.id: 0.5 for t in group.completed()}

    g = group("a", "b", failed=1)
    score_groups([g], [rank, by_id])
    assert [t.rewards.get("rank") for t in g.trajectories] == [1.0, 0.0, None]
    assert [t.rewards.get("by_id") for t in g.trajectories] == [0.5, 0.5, None]

    @art.reward
    def wrong_length(group) -> list[float]:
        return [1.0]

    with pytest.raises(RewardError, match="one value per completed run"):
        score_groups([group("a", "b")], [wrong_length])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (math.nan, "finite"),
        (math.inf, "finite"),
        ("good", "type str"),
        ({"a": math.nan}, "sub-score 'a'"),
        ([1.0], "type list"),
    ],
)
def test_bad_values_name_function_value_and_run(value: Any, match: str) -> None:
    @art.reward
    def broken(state) -> Any:
        return value

    with pytest.raises(RewardError, match=match) as info:
        score_groups([group("x")], [broken])
    assert "'broken'" in str(info.value) and "r0" in str(info.value)


def test_on_error_policies() -> None:
    def boom(state) -> float:
        raise KeyError("missing field")

    with pytest.raises(RewardError, match=r"'boom' on run r0 raised KeyError"):
        score_groups([group("x")], [art.reward(boom)])
    g = group("x", "y")
    report = score_groups(
        [g], [art.reward(name="abstains", on_error="abstain")(boom), art.reward(name="zeroes", on_error="zero")(boom)]
    )
    assert all("abstains" not in t.rewards and t.rewards["zeroes"] == 0.0 for t in g.trajectories)
    assert len(report.errors) == 4 and "KeyError" in report.errors[0]
    assert report.metrics["reward/errors"] == 4


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(Exception, match="unique"):
        score_groups([group("x")], [art.reward(lambda state: 1.0), art.reward(lambda state: 0.0)])


def test_a_function_defined_elsewhere_takes_its_options_too() -> None:
    def share(state) -> float:
        return 0.5

    declared = art.reward(share, name="half", weight=2.0)
    assert (declared.name, declared.weight) == ("half", 2.0)
    with pytest.raises(ConfigError, match="on_error"):
        art.reward(share, on_error="ignore")  # type: ignore[call-overload]


def test_state_rewards_abstain_on_stored_runs_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Runs read back from the store have no final state (it is Python objects): a reward taking `state` abstains
    on them (named in a warning) instead of being called with None; `trajectory` rewards still score them."""
    called: list[Any] = []

    @art.reward
    def needs_state(state) -> float:
        called.append(state)
        return 1.0

    @art.reward
    def from_trajectory(trajectory) -> float:
        return 0.5

    g = group("42", "41")
    stored = TrajectoryGroup.model_validate_json(g.model_dump_json())  # what store.groups() gives back
    assert all(t.final_state is None for t in stored.trajectories)
    report = score_groups([stored], [needs_state, from_trajectory])
    assert called == []
    assert [t.rewards for t in stored.trajectories] == [{"from_trajectory": 0.5}] * 2
    assert "needs_state" in caplog.text and "2 run(s) have no final state" in caplog.text
    assert report.metrics["reward/total"] == 0.5
    score_groups([g], [needs_state])  # live runs still get their state
    assert len(called) == 2
