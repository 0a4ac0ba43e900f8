"""The W&B sink through core's entry point, offline: the run files are written and read back."""

from __future__ import annotations

import glob
import json
import logging
import struct
import time
import zlib
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


def trainer_for(tmp_path: Path, **kwargs: Any) -> tuple[art.Trainer, FakeBackend]:
    backend = FakeBackend(tmp_path)
    model = art.TrainableModel(name="fake", project="evals").register(backend)
    kwargs.setdefault("langfuse", False)
    return art.Trainer(echo_graph(), model, rewards=[by_generation], num_generations=4, **kwargs), backend


def test_a_bad_setting_says_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError, match="wandb= takes True, False, None"):
        trainer_for(tmp_path, wandb="yes")


# -- W&B, offline: the run files are written and read back -------------------------------------------------------
def wandb_records(path: Path) -> tuple[list[Any], str | None]:
    """The ``Record`` protobufs of one offline run file (``run-<id>.wandb``: LevelDB log records, 32 KiB blocks,
    each chunk's CRC-32 over its type byte and data, after a 7-byte ``:W&B`` header; the SDK no longer reads them
    back itself), and why the file stops early where it does (None when every byte is a whole record)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunks, records = path.read_bytes(), 7, [], []
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
            pos += 32768 - pos % 32768
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return records, f"at byte {pos} of {len(data)}: a chunk of {length} bytes, kind {kind}, not (yet) whole"
        chunks.append(chunk)
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records, None if pos == len(data) else f"{len(data) - pos} bytes after the last record"


def wandb_history(root: Path, *, runs: int, timeout: float = 120.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every history row and the config of the offline runs under ``root``, once ``runs`` of them have ended in
    their files (W&B's service process writes them; the sink waits a bounded time for it, the test longer)."""
    deadline = time.monotonic() + timeout
    while True:
        paths = sorted(glob.glob(str(root / "wandb" / "offline-run-*" / "run-*.wandb")))
        read = [wandb_records(Path(path)) for path in paths]
        torn = [f"{path}: {why}" for path, (_, why) in zip(paths, read, strict=True) if why]
        ended = sum(any(r.WhichOneof("record_type") == "exit" for r in records) for records, _ in read)
        if (ended == runs and not torn) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ended == runs and not torn, f"{ended} of {runs} W&B runs ended in their files after {timeout:.0f} s; {torn}"
    rows, config = [], {}
    for records, _ in read:
        for record in records:
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
    rows, config = wandb_history(tmp_path, runs=1)
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
    rows, _ = wandb_history(tmp_path, runs=2)
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


def test_a_resumed_run_waits_for_the_last_finish_that_outlived_its_wait(monkeypatch: Any) -> None:
    wandb = pytest.importorskip("wandb")
    from langgraph_art_wandb.sink import WandbSink

    events: list[str] = []

    class SlowRun:
        id = "r1"

        def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
            events.append("log")

        def finish(self) -> None:
            time.sleep(0.5)
            events.append("finished")

    def init(**kwargs: Any) -> SlowRun:
        events.append(f"init {kwargs.get('id')}")
        return SlowRun()

    monkeypatch.setattr(wandb, "init", init)
    sink = WandbSink(project="p")
    sink.start({"model": "m"})
    sink.finish(curve=None, timeout=0.01)  # gives up waiting; the finish goes on
    assert events == ["init None"]
    sink.start({"model": "m"})
    assert events == ["init None", "finished", "init r1"]
