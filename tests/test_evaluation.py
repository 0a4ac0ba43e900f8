"""Evaluation during training and the sinks (a user's, a failing one, W&B offline), against the fake backend."""

from __future__ import annotations

import glob
import json
import logging
import struct
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
    history = trainer.train(TRAIN, steps=5, progress=False)
    assert len(history) == 5
    assert [e["iteration"] for e in trainer.evals] == [0, 2, 4, 5]
    assert [e["step"] for e in trainer.evals] == [0, 2, 4, 5]  # the checkpoint each one evaluated
    for e in trainer.evals:
        assert e["eval/reward/mean"] == pytest.approx(0.5) and e["eval/runs"] == 6 and e["eval/runs/failed"] == 0
        assert e["eval/reward/held_out_score"] == pytest.approx(0.5) and e["eval/time_s"] >= 0
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
        ({"wandb": "yes"}, "wandb= takes True, False, None"),
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


# -- W&B, offline: the run files are written and read back -------------------------------------------------------
def wandb_history(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every history row and the config in the offline run files under ``root`` (``run-<id>.wandb``: LevelDB log
    records of W&B's ``Record`` protobuf, which the SDK no longer reads back itself)."""
    from wandb.proto import wandb_internal_pb2

    rows, config = [], {}
    for path in sorted(glob.glob(str(root / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data, pos, chunks = Path(path).read_bytes(), 7, []
        assert data[:4] == b":W&B", data[:7]
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
                pos += 32768 - pos % 32768
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            chunks.append(data[pos + 7 : pos + 7 + length])
            pos += 7 + length
            if kind in (1, 4):  # FULL or LAST: a whole record
                record = wandb_internal_pb2.Record()
                record.ParseFromString(b"".join(chunks))
                chunks = []
                which = record.WhichOneof("record_type")
                if which == "history":
                    items = record.history.item
                    rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
                elif which == "run":
                    config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
                elif which == "config":
                    config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return rows, config


def test_wandb_offline_gets_config_train_and_eval_metrics_and_the_curve(tmp_path: Path, monkeypatch: Any) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer, _ = trainer_for(tmp_path, wandb=None, eval_scenarios=HELD_OUT, eval_rewards=[held_out_score])
    assert [s.name for s in trainer.sinks] == ["W&B"]  # on by WANDB_MODE alone
    trainer.train(TRAIN, steps=3, progress=False)
    rows, config = wandb_history(tmp_path)
    train = {r["_step"]: r["reward/mean"] for r in rows if "reward/mean" in r}
    evals = {r["_step"]: r["eval/reward/mean"] for r in rows if "eval/reward/mean" in r}
    assert train == {i: pytest.approx(m["reward/mean"]) for i, m in enumerate(trainer.history, 1)}
    assert evals == {0: pytest.approx(0.5), 3: pytest.approx(0.5)}
    (curve,) = [r["reward_curve/path"] for r in rows if "reward_curve/path" in r]
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / curve))
    assert {r.get("eval/policy_step") for r in rows if "eval/reward/mean" in r} == {0, 3}
    assert config["learning_rate"] == trainer.config.learning_rate and config["model"] == "fake"
    assert config["project"] == "evals"
    trainer.train(TRAIN, steps=1, progress=False)  # the next call resumes the same W&B run
    rows, _ = wandb_history(tmp_path)
    assert max(r["_step"] for r in rows if "reward/mean" in r) == 4


def test_wandb_failing_never_stops_training(tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    wandb = pytest.importorskip("wandb")

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.CommError("W&B is unreachable")

    monkeypatch.setattr(wandb, "init", refuse)
    trainer, _ = trainer_for(tmp_path, wandb={"project": "mine"})
    with caplog.at_level(logging.WARNING):
        assert len(trainer.train(TRAIN, steps=2, progress=False)) == 2
    assert "W&B failed in start" in caplog.text and "W&B is unreachable" in caplog.text


def test_wandb_follows_the_environment(tmp_path: Path, monkeypatch: Any) -> None:
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    assert trainer_for(tmp_path, wandb=None)[0].sinks == []
    monkeypatch.setenv("WANDB_PROJECT", "p")
    assert [s.name for s in trainer_for(tmp_path, wandb=None)[0].sinks] == ["W&B"]
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert trainer_for(tmp_path, wandb=None)[0].sinks == []
    assert trainer_for(tmp_path, wandb=False)[0].sinks == []
