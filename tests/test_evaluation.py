"""Evaluation during training and the sinks (a user's, a failing one, an integration asked for but not installed),
against the fake backend. W&B's own tests: integrations/wandb/tests."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import langgraph_art as art
from langgraph_art.testing import FakeBackend, echo_graph

TRAIN = [{"id": "q1", "input": {"messages": [("user", "hi")]}}]
HELD_OUT = [{"id": "h1", "input": {"messages": [("user", "a")]}}, {"id": "h2", "input": {"messages": [("user", "b")]}}]


@art.reward
def by_generation(metadata: dict[str, Any]) -> float:
    return float(metadata["generation"])


@art.reward
def held_out_score(scenario: dict[str, Any]) -> float:
    return {"h1": 0.25, "h2": 0.75}[scenario["id"]]


class Recording:
    """A user's sink: keeps every call."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, info: Any) -> None:
        self.calls.append(("start", dict(info)))

    def submit(self, record: Any) -> None:
        self.calls.append(("submit", dict(record)))

    def finish(self, *, curve: Path | None, timeout: float) -> None:
        self.calls.append(("finish", curve))


def trainer_for(tmp_path: Path, **kwargs: Any) -> tuple[art.Trainer, FakeBackend]:
    backend = FakeBackend(tmp_path)
    model = art.TrainableModel(name="fake", project="evals").register(backend)
    kwargs.setdefault("langfuse", False)
    kwargs.setdefault("wandb", False)
    return art.Trainer(echo_graph(), model, rewards=[by_generation], num_generations=4, **kwargs), backend


def test_eval_runs_at_the_start_every_n_steps_and_at_the_end_and_is_never_trained_on(tmp_path: Path) -> None:
    sink = Recording()
    trainer, backend = trainer_for(
        tmp_path,
        eval_scenarios=HELD_OUT,
        eval_every=2,
        eval_generations=3,
        eval_rewards=[held_out_score],
        sinks=[sink],
    )
    started = time.perf_counter()
    history = trainer.train(TRAIN, steps=5, progress=False)
    elapsed = time.perf_counter() - started
    assert len(history) == 5
    # each evaluation's time is its own, in seconds: all four fit in the run (a unit or a running total would not)
    assert all(e["eval/time_s"] > 0 for e in trainer.evals)
    assert sum(e["eval/time_s"] for e in trainer.evals) <= elapsed
    assert [e["iteration"] for e in trainer.evals] == [0, 2, 4, 5]
    assert [e["step"] for e in trainer.evals] == [0, 2, 4, 5]  # the checkpoint each one evaluated
    for e in trainer.evals:
        assert e["eval/reward/mean"] == pytest.approx(0.5) and e["eval/runs"] == 6 and e["eval/runs/failed"] == 0
        assert e["eval/reward/held_out_score"] == pytest.approx(0.5)
    # the training steps saw only training runs
    assert all(g.scenario_id == "q1" for groups in backend.received for g in groups)
    store = trainer.store
    assert store.count(split="eval") == 4 * 6 and store.count(split="train") == 5 * 4
    assert {t.metadata["split"] for t in store.trajectories(split="eval")} == {"eval"}
    assert sorted({t.reward for t in store.trajectories(split="eval")}) == [0.25, 0.75]  # stored with rewards
    lines = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["iteration"]) for r in lines] == [
        ("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4), ("eval", 4),
        ("train", 5), ("eval", 5),
    ]  # fmt: skip
    assert all(r["run"] == trainer.run_id for r in lines)
    # the user's sink got the same records, between one start and one finish with the curve
    kinds = [kind for kind, _ in sink.calls]
    assert kinds == ["start"] + ["submit"] * 9 + ["finish"]
    assert [c[1] for c in sink.calls[1:-1]] == lines
    assert sink.calls[0][1]["learning_rate"] == trainer.config.learning_rate and sink.calls[0][1]["steps"] == 5
    assert sink.calls[-1][1] == trainer.run_dir / "reward_curve.png" and sink.calls[-1][1].stat().st_size > 1000

    # a second call goes on from there: no second evaluation of iteration 5, then every 2 and at the end
    trainer.train(TRAIN, steps=2, progress=False)
    assert [e["iteration"] for e in trainer.evals] == [0, 2, 4, 5, 6, 7]


def test_a_failing_sink_is_logged_once_and_training_goes_on(tmp_path: Path, caplog: Any) -> None:
    class Broken(Recording):
        name = "broken"

        def submit(self, record: Any) -> None:
            raise ConnectionError("tool is down")

    broken, fine = Broken(), Recording()
    trainer, _ = trainer_for(tmp_path, sinks=[broken, fine])
    with caplog.at_level(logging.WARNING):
        history = trainer.train(TRAIN, steps=3, progress=False)
    assert len(history) == 3
    assert caplog.text.count("broken failed in submit (ConnectionError: tool is down)") == 1
    assert [kind for kind, _ in broken.calls] == ["start"]  # off after its first failure
    assert [kind for kind, _ in fine.calls] == ["start", "submit", "submit", "submit", "finish"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eval_every": 0, "eval_scenarios": HELD_OUT}, "eval_every must be an int >= 1"),
        ({"eval_every": 2}, "need eval_scenarios"),
        ({"eval_rewards": [held_out_score]}, "need eval_scenarios"),
        ({"eval_scenarios": HELD_OUT, "eval_generations": 0}, "eval_generations must be an int >= 1"),
        ({"eval_scenarios": [{"id": "x"}]}, "must be a dict with an 'input' key"),
        ({"sinks": [object()]}, "sinks= takes objects with name, start"),
    ],
)
def test_bad_settings_say_what_to_change(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(art.ConfigError, match=message):
        trainer_for(tmp_path, **kwargs)


def test_evaluate_on_its_own(tmp_path: Path) -> None:
    store = art.TrajectoryStore(tmp_path / "s.db")
    result = art.evaluate(echo_graph(), HELD_OUT, [held_out_score], num_generations=2, store=store)
    assert result.metrics["eval/reward/mean"] == pytest.approx(0.5) and len(result.groups) == 2
    assert store.count(split="eval") == 4 and store.count(split="train") == 0


def test_integrations_come_through_entry_points_and_a_missing_one_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from importlib.metadata import EntryPoint

    from langgraph_art import sinks

    monkeypatch.setattr(sinks, "installed_sinks", dict)  # nothing installed
    with pytest.raises(art.ConfigError, match=r"langgraph-art-wandb: .*pip install -e integrations/wandb"):
        trainer_for(tmp_path, wandb=True)
    assert trainer_for(tmp_path, langfuse=None, wandb=None)[0].sinks == []  # not asked for: nothing needed
    found = {"mine": EntryPoint("mine", "tests.test_evaluation:make_recording_sink", sinks.SINK_ENTRY_POINTS)}
    found["broken"] = EntryPoint("broken", "no_such_module:make_sink", sinks.SINK_ENTRY_POINTS)
    monkeypatch.setattr(sinks, "installed_sinks", lambda: found)
    with caplog.at_level(logging.WARNING):
        trainer, _ = trainer_for(tmp_path)
    assert [s.name for s in trainer.sinks] == ["recording"]  # the plugin's factory, called with its setting
    assert "the broken sink integration failed to load" in caplog.text


def make_recording_sink(setting: Any, *, store: Any, project: str, home: Any) -> Recording:
    assert setting is None and project == "evals" and store is not None
    return Recording()
