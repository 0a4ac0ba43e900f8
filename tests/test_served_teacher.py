"""A teacher the trainer does not hold (issue 37): a model the service serves (its base model by name, a policy's
checkpoint ``project/name@step``) or another server's. The service scores each step's turns before the trainer
sees them; the logprobs equal the trainer's own teacher's in process, and over HTTP equal those in process; a
teacher with another tokenizer is a ConfigError naming both; a trainer alone says where served logprobs come from."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import langgraph_art as art  # noqa: E402
from langgraph_art.config import GRPOConfig  # noqa: E402
from langgraph_art.errors import ConfigError  # noqa: E402
from langgraph_art.train.advantages import group_advantages  # noqa: E402
from langgraph_art.types import TrajectoryGroup  # noqa: E402


def test_the_config_and_the_teacher_name_a_served_model_and_its_server() -> None:
    assert GRPOConfig(teacher_model="distill/agent@3").teacher_is_served
    assert not GRPOConfig(teacher_model="base").teacher_is_served and not GRPOConfig().teacher_is_served
    served = GRPOConfig(teacher_model="big", teacher_base_url="http://127.0.0.1:8001/v1")
    assert served.teacher_is_served and served.teacher_base_url == "http://127.0.0.1:8001/v1"
    with pytest.raises(ConfigError, match="teacher_base_url='http://h/v1' with teacher_model='base': name the model"):
        GRPOConfig(teacher_model="base", teacher_base_url="http://h/v1")
    with pytest.raises(ConfigError, match="teacher_base_url='h:8000': give the server's http"):
        GRPOConfig(teacher_model="big", teacher_base_url="h:8000")
    with pytest.raises(ConfigError, match="teacher_model='': name the teacher"):
        GRPOConfig(teacher_model="")
    with pytest.raises(ConfigError, match=r"Teacher\(model='policy', base_url='http://h/v1'\): name the model"):
        art.Teacher(model="policy", prompt=lambda s, m: m, base_url="http://h/v1")
    with pytest.raises(ConfigError, match=r"Teacher\(model=''\): use 'base'"):
        art.Teacher(model="")
    from langgraph_art.loop import _with_teacher

    with pytest.raises(ConfigError, match="give the server's http"):  # the Trainer's config validates the URL
        _with_teacher(GRPOConfig(), art.Teacher(model="big", base_url="h:1"))
    config = _with_teacher(GRPOConfig(), art.Teacher(model="big", base_url="http://h/v1", kl_coef=2.0))
    assert (config.teacher_model, config.teacher_base_url, config.teacher_kl_coef) == ("big", "http://h/v1", 2.0)


def trainer_with(tiny_path: Path, folder: Path, **config: Any) -> Any:
    from langgraph_art.train.trainer import GRPOTrainer

    return GRPOTrainer(str(tiny_path), GRPOConfig(learning_rate=1e-2, **config), checkpoint_dir=folder)


def privileged(group: TrajectoryGroup) -> TrajectoryGroup:
    """Half the runs' turns shown a privileged prompt (rendered through the chat template), half their own ids."""
    for run in group.trajectories[::2]:
        turn = run.spans[0].turns[0]
        turn.messages = [{"role": "user", "content": "question"}]
        turn.teacher_messages = [{"role": "system", "content": "The answer is 42."}, *turn.messages]
    return group


def test_a_trainer_alone_says_where_a_served_teachers_logprobs_come_from(tiny_path: Path, tmp_path: Path) -> None:
    from langgraph_art.train.policies import PolicyRegistry
    from tests.test_trainer import make_group

    trainer = trainer_with(tiny_path, tmp_path / "t", teacher_model="distill/agent@3")
    group = make_group(trainer, [1.0, 0.0, 0.5, 0.25])
    with pytest.raises(ValueError, match=r"turn \S+ carries no logprobs of the served teacher 'distill/agent@3'"):
        trainer.step([group])
    turn = group.trajectories[0].spans[0].turns[0]
    turn.teacher_logprobs = [-1.0]
    with pytest.raises(ValueError, match=r"scored 1 tokens of 8"):
        trainer._teach([group], group_advantages([group], keep_uniform=True))
    registry = PolicyRegistry(str(tiny_path), tmp_path / "home")
    with pytest.raises(ConfigError, match="'distill/agent@3' is a served model, and this registry has no engine"):
        registry.step("p", "n", [group], GRPOConfig(teacher_model="distill/agent@3"))
    registry.close()


def test_a_served_teacher_scores_as_the_trainers_own_in_process_and_over_http(
    tiny_path: Path, tmp_path: Path, smol_server: Any
) -> None:
    """The service's base model by its served name (in process) and through the same service's HTTP route give the
    trainer-held base teacher's logprobs, privileged prompts included; a policy's checkpoint ``p/n@1`` as the
    teacher gives the trainer's own policy teacher's after that step; a teacher with another tokenizer (the real
    model's server, for the tiny student) is refused, naming both."""
    from langgraph_art.backends.service import build_service
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.publish import publish
    from langgraph_art.types import ModelRef
    from tests.test_trainer import make_group

    held = trainer_with(tiny_path, tmp_path / "held", teacher_model="base")
    group = privileged(make_group(held, [1.0, 0.0, 0.5, 0.25]))
    runs = group.trajectories
    expected, held_stats = held._teach([group], group_advantages([group], keep_uniform=True))
    turns = [run.spans[0].turns[0] for run in runs]
    assert max(abs(a - b) for a, b in zip(expected[turns[0].id], turns[0].logprobs, strict=True)) > 1e-3

    service = build_service(tiny_path, home=tmp_path / "home", served_name="tiny")
    assert service.policies is not None
    with EmbeddedServer(app=service.app) as server:
        score = service.policies._score_teacher
        assert score is not None
        score([group], GRPOConfig(teacher_model="tiny"))  # the engine's base model, in process
        for turn in turns:
            assert turn.teacher_logprobs == pytest.approx(expected[turn.id], abs=1e-4)
        over_http = copy.deepcopy(group)
        score([over_http], GRPOConfig(teacher_model="tiny", teacher_base_url=server.base_url))
        for turn, remote in zip(turns, (run.spans[0].turns[0] for run in over_http.trajectories), strict=True):
            assert remote.teacher_logprobs == pytest.approx(turn.teacher_logprobs, abs=1e-6)

        # a step through the registry with the served base model: the held teacher's metrics
        config = GRPOConfig(learning_rate=1e-2, teacher_model="tiny")
        stepped = copy.deepcopy(group)
        result, folder = service.policies.step("p", "n", [stepped], config)
        assert result.updated and folder is not None
        assert result.metrics["train/teacher/kl"] == pytest.approx(held_stats["train/teacher/kl"], abs=1e-4)

        # the policy's checkpoint as the teacher, served as p/n@1: the trainer's own policy teacher after step 1
        server.run(publish(service.engine, ModelRef("p/n", 1), folder, 4))
        with service.policies.lease("p", "n") as trainer:
            assert type(trainer).__name__ == "GRPOTrainer"  # in this process: its own teacher can be asked
            trainer.update_config(config.model_copy(update={"teacher_model": "policy"}))
            own, _ = trainer._teach([group], group_advantages([group], keep_uniform=True))
        checkpoint = copy.deepcopy(group)
        score([checkpoint], GRPOConfig(teacher_model="p/n@1"))
        for turn in (run.spans[0].turns[0] for run in checkpoint.trajectories):
            assert turn.teacher_logprobs == pytest.approx(own[turn.id], abs=1e-4)
        assert max(abs(a - b) for a, b in zip(own[turns[0].id], expected[turns[0].id], strict=True)) > 1e-4

        with pytest.raises(ConfigError, match=r"teacher_model='nope@1': .*not served"):
            score([copy.deepcopy(group)], GRPOConfig(teacher_model="nope@1"))
        with pytest.raises(ConfigError, match=r"refused to score for teacher_model='nope' \(HTTP 404\)"):
            score([copy.deepcopy(group)], GRPOConfig(teacher_model="nope", teacher_base_url=server.base_url))
        other = GRPOConfig(teacher_model="smollm2-135m", teacher_base_url=smol_server.base_url)
        refused = r"the teacher 'smollm2-135m' at .* decodes token \d+ as .*the student's tokenizer \('tiny'\) as "
        with pytest.raises(ConfigError, match=refused + ".*must share the student's tokenizer"):
            score([copy.deepcopy(group)], other)
    service.close()


def test_a_served_teachers_logprobs_are_kept_with_the_runs(tmp_path: Path) -> None:
    """``Trainer(teacher=art.Teacher(model=<a served name>))`` on the local backend: each step's turns carry the
    served teacher's logprobs in the store, and the metrics report its KL (a step from a running event loop too)."""
    from langgraph_art.testing import digit_share, one_agent_graph

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="student", project="served").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)  # type: ignore[call-arg,arg-type]
        rewards = [art.reward(digit_share, name="digits")]
        scenarios = [{"id": "n", "input": {"messages": [("user", "Write some numbers.")]}}]
        teacher = art.Teacher(model=model.base_model, kl_coef=0.5)  # the base model by the name the service gives it
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=rewards, num_generations=4,
                              config=GRPOConfig(learning_rate=1e-2), teacher=teacher)  # fmt: skip
        history = trainer.train(scenarios, steps=1, progress=False)
        history.append(asyncio.run(trainer.atrain_step(scenarios)))  # from inside a running event loop too
        assert all("train/teacher/kl" in m and m["train/teacher/tokens"] > 0 for m in history)
        assert history[0]["train/teacher/kl"] == pytest.approx(0.0, abs=1e-4)  # the untrained policy is the base
        taught = [turn for run in trainer.store.trajectories() for turn in run.turns() if turn.teacher_logprobs]
        assert len(taught) == 8 and all(len(t.teacher_logprobs or []) == len(t.token_ids) for t in taught)


@pytest.mark.slow
def test_a_served_teacher_reaches_trainer_ranks_through_the_remote_backend(tiny_path: Path, tmp_path: Path) -> None:
    """The remote backend sends the step; the service scores its turns with the served teacher before its trainer,
    two data-parallel ranks in child processes, sees them: the teacher's metrics are the trainer-held base teacher's
    on the same groups (the served base model by its name is that teacher)."""
    from langgraph_art.backends.service import build_service
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.train.factory import TrainingOptions
    from tests.test_trainer import make_group

    held = trainer_with(tiny_path, tmp_path / "held", teacher_model="base")
    group = privileged(make_group(held, [1.0, 0.0, 0.5, 0.25]))
    _, held_stats = held._teach([group], group_advantages([group], keep_uniform=True))
    service = build_service(tiny_path, home=tmp_path / "service", served_name="tiny",
                            training=TrainingOptions(ranks=2))  # fmt: skip
    with EmbeddedServer(app=service.app) as server:
        backend = art.RemoteBackend(server.base_url, home=tmp_path / "client")
        model = art.TrainableModel(name="ranked", project="p", base_model="tiny").register(backend)
        config = GRPOConfig(learning_rate=1e-2, teacher_model="tiny")
        backend.trainer(model, config)  # the config each step sends
        result = backend.train_step(model, [group], config)
        assert result.updated
        assert result.metrics["train/teacher/kl"] == pytest.approx(held_stats["train/teacher/kl"], abs=1e-4)
        assert result.metrics["train/teacher/tokens"] == held_stats["train/teacher/tokens"]
    service.close()
