"""Dynamic sampling: uniform groups are replaced by further scenarios, never more than the bound per step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import langgraph_art as art
from langgraph_art.dynamic_sampling import is_uniform, refill
from langgraph_art.errors import ConfigError
from langgraph_art.types import Trajectory, TrajectoryGroup


def group(*rewards: float | None, gid: str = "g") -> TrajectoryGroup:
    runs = [Trajectory(id=f"{gid}{i}", status="ok", reward=r) for i, r in enumerate(rewards)]
    return TrajectoryGroup(id=gid, trajectories=runs)


def test_a_uniform_group_is_one_whose_scored_runs_all_agree() -> None:
    assert is_uniform(group(1.0, 1.0, 1.0)) and is_uniform(group(0.0, 0.0, None))
    assert not is_uniform(group(1.0, 0.5)) and not is_uniform(group(1.0, None)) and not is_uniform(group())


def run_refill(initial: list[TrajectoryGroup], further: list[list[float]], bound: int) -> tuple[list, dict, list]:
    """``refill`` with further scenarios whose groups score ``further`` in turn; what it sampled and asked."""
    queue = iter(further)
    asked: list[int] = []

    async def sample(n: int) -> list[TrajectoryGroup]:
        asked.append(n)
        return [group(gid=f"x{len(asked)}-{i}") for i in range(n)]

    async def score(batch: list[TrajectoryGroup]) -> None:  # the scenario's runs, scored
        for g in batch:
            g.trajectories = group(*next(queue), gid=g.id).trajectories

    extra, metrics = asyncio.run(refill(initial, sample, score, bound))
    return extra, metrics, asked


def test_refill_replaces_uniform_groups_and_their_uniform_replacements_within_the_bound() -> None:
    initial = [group(1, 1, gid="a"), group(0, 1, gid="b"), group(0, 0, gid="c")]  # 2 uniform
    extra, metrics, asked = run_refill(initial, [[1, 1], [0, 1], [0, 1]], bound=5)
    # 2 asked for; of those one was uniform again, so 1 more: 3 further groups in all
    assert asked == [2, 1] and len(extra) == 3
    assert metrics == {
        "dynamic_sampling/uniform_groups": 2.0,
        "dynamic_sampling/extra_groups": 3.0,
        "dynamic_sampling/extra_uniform": 1.0,
        "dynamic_sampling/replaced": 2.0,
    }


def test_refill_never_samples_more_than_the_bound() -> None:
    initial = [group(1, 1, gid=f"u{i}") for i in range(4)]
    extra, metrics, asked = run_refill(initial, [[1, 1]] * 10, bound=3)
    assert asked == [3] and len(extra) == 3 and metrics["dynamic_sampling/replaced"] == 0  # all uniform again
    extra, metrics, asked = run_refill([group(0, 1)], [], bound=3)
    assert asked == [] and extra == [] and metrics["dynamic_sampling/extra_groups"] == 0  # nothing to replace


def test_the_trainer_samples_further_scenarios_for_uniform_groups(tmp_path: Path) -> None:
    """A reward that is 1 on the first scenario and varies on the second: the first's groups are uniform and each
    step samples the next scenario in their place (one further group: the bound)."""
    from langgraph_art.testing import digit_share, one_agent_graph

    def score(state: dict, scenario: dict) -> float:
        return 1.0 if scenario["id"] == "same" else digit_share(state)

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="dyn", project="dyn").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)  # type: ignore[call-arg,arg-type]
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[art.reward(score, name="score")],
                              num_generations=4, config=art.GRPOConfig(learning_rate=1e-3),
                              dynamic_sampling=1)  # fmt: skip
        numbers = {"messages": [("user", "Write some numbers.")]}
        scenarios = [{"id": "same", "input": numbers}, {"id": "varied", "input": numbers}]
        history = trainer.train(scenarios, steps=2, progress=False)
    first = history[0]
    assert first["dynamic_sampling/uniform_groups"] == 1 and first["dynamic_sampling/extra_groups"] == 1
    assert first["reward/mean"] == 1.0  # the step's own groups: the further ones are counted apart
    ids = [t.scenario_id for t in trainer.store.trajectories()]
    assert ids.count("same") >= 4 and ids.count("varied") >= 4  # the further scenario was run and stored


def test_dynamic_sampling_is_checked(tmp_path: Path) -> None:
    from langgraph_art.testing import FakeBackend, one_agent_graph

    model = art.TrainableModel(name="m", project="p").register(FakeBackend(tmp_path))
    llm = art.ChatART(model=model)
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="dynamic_sampling must be an int >= 0"):
            art.Trainer(one_agent_graph(llm), model, rewards=[lambda s: 1.0], dynamic_sampling=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="use it without branching"):
        art.Trainer(one_agent_graph(llm), model, rewards=[lambda s: 1.0], dynamic_sampling=2,
                    branching=art.Branching(groups_per_step=1))  # fmt: skip
