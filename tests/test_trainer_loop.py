"""``Trainer`` against a fake backend: the loop (rollouts -> rewards -> step -> metrics) without a model or a server."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import langgraph_art as art
from langgraph_art.testing import FakeBackend, echo_graph


@art.reward
def by_generation(state: Any, metadata: dict[str, Any]) -> float:
    assert state["messages"][-1].content == "seen 1"
    return float(metadata["generation"])


def test_train_step_with_a_fake_backend(tmp_path: Path) -> None:
    backend = FakeBackend(tmp_path)
    model = art.TrainableModel(name="fake", project="loop").register(backend)
    trainer = art.Trainer(echo_graph(), model, rewards=[by_generation], num_generations=4, langfuse=False)
    writes: Counter[str] = Counter()
    add_trajectories, add_group = trainer.store.add_trajectories, trainer.store.add_group

    def counting_trajectories(trajectories: Any) -> None:
        trajectories = list(trajectories)
        writes.update(t.id for t in trajectories)
        add_trajectories(trajectories)

    def counting_group(group: art.TrajectoryGroup, *, trajectories: bool = True) -> None:
        if trajectories:
            writes.update(t.id for t in group.trajectories)
        add_group(group, trajectories=trajectories)

    trainer.store.add_trajectories, trainer.store.add_group = counting_trajectories, counting_group  # type: ignore[method-assign]
    scenario = {"id": "q1", "input": {"messages": [("user", "hi")]}}

    metrics = trainer.train_step([scenario])
    assert metrics["step"] == 1 and metrics["policy_step"] == 0 and metrics["train/loss"] == 0.25
    assert metrics["reward/mean"] == 1.5 and metrics["runs/failed"] == 0
    (group,) = backend.received[0]
    assert [t.reward for t in group.trajectories] == [0.0, 1.0, 2.0, 3.0]
    advantages = [t.metadata["advantage"] for t in group.trajectories]
    assert advantages == sorted(advantages) and advantages[0] < 0 < advantages[-1]
    stored = trainer.store.trajectories(step=0)
    assert sorted(t.reward for t in stored) == [0.0, 1.0, 2.0, 3.0]
    assert sorted(t.metadata["advantage"] for t in stored) == [-1.5, -0.5, 0.5, 1.5]  # the trainer's, stored
    assert sorted(writes.values()) == [2, 2, 2, 2]  # when each run finished, and once more with its reward
    assert "reward/total" not in metrics and metrics["reward/std"] > 0  # reward/mean is the one name for it

    history = trainer.train([scenario], steps=2, progress=False)
    assert [m["policy_step"] for m in history] == [0, 1, 2]  # each step samples the previous step's checkpoint
    assert backend.prepared == [trainer.config]
    lines = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [1, 2, 3] and lines[-1]["model"] == "fake"


def test_a_backend_missing_methods_is_refused_with_the_fix(tmp_path: Path) -> None:
    class Serving:  # can serve, cannot train
        def register(self, model: Any) -> None:
            pass

    model = art.TrainableModel(name="fake", project="loop").register(Serving())  # type: ignore[arg-type]
    with pytest.raises(art.ConfigError, match="Serving cannot train"):
        art.Trainer(echo_graph(), model, rewards=[by_generation])


def test_the_run_log_reads_what_it_writes(tmp_path: Path) -> None:
    from langgraph_art.runlog import append_record, read_records

    for model, step in (("a", 0), ("a", 1), ("b", 2)):
        append_record(tmp_path / "runs" / model, {"run": "r", "model": model, "policy_step": step, "reward/mean": 1.0})
    (tmp_path / "runs" / "a" / "metrics.jsonl").open("a").write("\n")  # a blank line is skipped
    assert [(r["model"], r["policy_step"]) for r in read_records(tmp_path)] == [("a", 0), ("a", 1), ("b", 2)]
    assert [r["policy_step"] for r in read_records(tmp_path, since_step=1)] == [1, 2]


def test_num_generations_is_said_in_one_place(tmp_path: Path) -> None:
    """The argument sets GRPOConfig.num_generations; a config that chose another value is not silently overwritten."""
    model = art.TrainableModel(name="fake", project="loop").register(FakeBackend(tmp_path))
    graph = echo_graph()
    assert art.Trainer(graph, model, rewards=[by_generation], langfuse=False).config.num_generations == 8
    chosen = art.GRPOConfig(num_generations=4)
    assert art.Trainer(graph, model, rewards=[by_generation], config=chosen, langfuse=False).config.num_generations == 4
    other = art.GRPOConfig(learning_rate=1e-3)  # num_generations left at its default: the argument decides
    trainer = art.Trainer(graph, model, rewards=[by_generation], num_generations=2, config=other, langfuse=False)
    assert trainer.config.num_generations == 2 and trainer.config.learning_rate == 1e-3
    with pytest.raises(art.ConfigError, match=r"num_generations=2 and GRPOConfig\(num_generations=4\) disagree"):
        art.Trainer(graph, model, rewards=[by_generation], num_generations=2, config=chosen, langfuse=False)
    with pytest.raises(art.ConfigError, match="num_generations=1"):
        art.Trainer(graph, model, rewards=[by_generation], num_generations=1, langfuse=False)


def test_every_invalid_grpo_config_is_a_config_error_naming_the_field_and_the_fix() -> None:
    """A bad value, a wrong type and an unknown field: ``ConfigError`` (not pydantic's ValidationError), as
    ``Trainer(num_generations=1)`` raises; from the constructor, ``model_validate`` and ``model_copy(update=...)``."""
    from pydantic import BaseModel, ValidationError

    cases: list[tuple[dict[str, Any], str]] = [
        ({"num_generations": 1}, r"num_generations=1: GRPO compares runs of one scenario; use >= 2"),
        ({"loss_type": "gspo"}, r"epsilon=3e-4"),
        ({"learning_rate": 2.0}, r"learning_rate=2\.0: use a small positive value"),
        ({"learning_rate": "fast"}, r"learning_rate='fast': .*number.*AdamW's learning rate"),
        ({"lora_r": 2.5}, r"lora_r=2\.5: .*integer.*LoRA rank"),
        ({"loss_type": "ppo"}, r"loss_type='ppo': .*'grpo', 'dr_grpo', 'bnpo', 'cispo' or 'gspo'"),
        ({"lr": 1e-3}, r"lr: unknown field; did you mean learning_rate\?"),
        ({"num_generatons": 4}, r"num_generatons: unknown field; did you mean num_generations\?"),
    ]
    base = art.GRPOConfig(learning_rate=1e-3)
    for fields, message in cases:
        for make in (art.GRPOConfig.model_validate, lambda f: art.GRPOConfig(**f), lambda f: base.model_copy(update=f)):
            with pytest.raises(art.ConfigError, match=f"^invalid GRPOConfig: .*{message}") as caught:
                make(fields)
            assert not isinstance(caught.value, ValidationError) and caught.value.__cause__ is None, fields
    both = r"learning_rate=0\.0: .*; lora_r=0, lora_alpha=16: both must be >= 1"  # every problem, in one message
    with pytest.raises(art.ConfigError, match=both):
        art.GRPOConfig(learning_rate=0.0, lora_r=0)
    with pytest.raises(art.ConfigError, match=r"max_length='long': .*; lr: unknown field"):
        art.GRPOConfig(max_length="long", lr=1)  # type: ignore[arg-type, call-arg]
    # valid updates still copy: the new value validated (and coerced), the fields chosen before kept as chosen
    copied = base.model_copy(update={"num_iterations": "2"})
    assert copied.num_iterations == 2 and copied.learning_rate == 1e-3
    assert copied.model_fields_set == {"learning_rate", "num_iterations"}
    assert art.GRPOConfig.model_validate_json('{"lora_r": 4}').lora_r == 4
    with pytest.raises(art.ConfigError, match="lora_r=0"):
        art.GRPOConfig.model_validate_json('{"lora_r": 0}')

    class Request(BaseModel):  # as a field of another model (the training routes' requests): that model's error,
        config: art.GRPOConfig  # with the field's place in it (the service answers 400, param config.lr)

    with pytest.raises(ValidationError) as nested:
        Request.model_validate({"config": {"lr": 1e-3}})
    assert [e["loc"] for e in nested.value.errors()] == [("config", "lr")]


def test_a_run_whose_output_is_not_a_terminal_logs_one_plain_line_per_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log file, CI, nohup: no bar (it would print nothing until the end), one line per step with reward and time;
    the per-rollout bar stays silent."""
    model = art.TrainableModel(name="fake", project="loop").register(FakeBackend(tmp_path))
    trainer = art.Trainer(echo_graph(), model, rewards=[by_generation], num_generations=4, langfuse=False)
    capsys.readouterr()
    trainer.train([{"id": "q1", "input": {"messages": [("user", "hi")]}}], steps=3, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["training 1/3", "training 2/3", "training 3/3"], lines
    assert all(re.search(r"reward 1\.500 ± 1\.118  step \d+\.\d\ds  elapsed \d+s$", line) for line in lines), lines
