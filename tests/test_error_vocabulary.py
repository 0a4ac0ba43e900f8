"""One error vocabulary: a step that fails in a service raises in ``RemoteBackend`` what it raises in
``LocalBackend`` (``errors.HTTP_ERRORS`` both ways), against the real service app on loopback; a busy service is
waited for by its ``retry-after``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import langgraph_art as art
from langgraph_art.backends import remote
from langgraph_art.backends.service import build_service
from langgraph_art.errors import (
    HTTP_ERRORS,
    ConfigError,
    ModelNotFoundError,
    ServiceBusyError,
    TrainingAborted,
    error_from_http,
    http_row,
)
from langgraph_art.serve.embedded import EmbeddedServer
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn
from tests.helpers import free_port, serving

pytestmark = [pytest.mark.integration]
HELLO = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]}]


def test_every_row_maps_both_ways() -> None:
    for cls, status, _, _code in HTTP_ERRORS:
        error = cls("m", "p") if cls.__name__ in ("RequestError", "ModelNotFoundError") else cls("m")
        answered = http_row(error)
        assert answered[0] == status
        back = error_from_http(status, {"message": "m", "code": answered[2], "param": "p"}, "svc")
        assert type(back) is cls, (cls, back)
    assert type(error_from_http(500, {"message": "boom"}, "the service")) is art.LangGraphArtError


# the PPO ratio to the sampler's logprobs (no mismatch correction, which would bound the weight of such a token)
UNCORRECTED = art.GRPOConfig(importance_sampling_correction="none")


def exploding_group() -> TrajectoryGroup:
    """Runs whose sampler logprobs are -1e30: under ``UNCORRECTED`` the importance ratio overflows, the loss is inf,
    the step aborts (the trainer's own check, not a fake)."""
    runs = []
    for i, score in enumerate([1.0, 0.0]):
        turn = Turn(
            id=f"t{i}",
            node="agent",
            prompt_token_ids=[1, 2, 3],
            token_ids=[10 + i, 11, 12],
            logprobs=[-1e30] * 3,
            params={"temperature": 1.0},
            start_time=0.0,
        )
        runs.append(
            Trajectory(id=f"r{i}", status="ok", reward=score, spans=[NodeSpan(id=f"s{i}", name="agent", turns=[turn])])
        )
    return TrajectoryGroup(id="g", trajectories=runs)


@pytest.fixture(scope="module")
def service(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    service = build_service(str(tiny_path), home=tmp_path_factory.mktemp("service"), served_name="tiny")
    with EmbeddedServer(app=service.app) as server:
        yield server.base_url
    service.close()


def local_and_remote(service: str, tmp_path: Path, name: str) -> Iterator[tuple[Any, art.TrainableModel]]:
    with art.LocalBackend(home=tmp_path / "local") as local:
        yield local, art.TrainableModel(name=name, project="p").register(local)
    backend = art.RemoteBackend(service, home=tmp_path / "remote", max_wait=0)
    yield backend, art.TrainableModel(name=name, project="p").register(backend)


def test_an_aborted_step_is_training_aborted_on_both_backends(service: str, tmp_path: Path) -> None:
    raised = []
    for backend, model in local_and_remote(service, tmp_path, "aborts"):
        backend.trainer(model, UNCORRECTED)
        with pytest.raises(TrainingAborted, match="non-finite"):
            backend.train_step(model, [exploding_group()], UNCORRECTED)
        raised.append(type(backend).__name__)
        assert backend.current_step(model) == 0  # nothing was published
    assert raised == ["LocalBackend", "RemoteBackend"]


def test_a_config_the_live_trainer_cannot_take_is_a_config_error_on_both(service: str, tmp_path: Path) -> None:
    for backend, model in local_and_remote(service, tmp_path, "reshaped"):
        backend.warmup(model, HELLO, steps=1)  # a live trainer with lora_r=8
        with pytest.raises(ConfigError, match="lora_r"):
            backend.trainer(model, art.GRPOConfig(lora_r=4))
            backend.train_step(model, [exploding_group()])


def test_a_busy_service_is_waited_for_by_its_retry_after_then_raised(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, started = threading.Event(), threading.Event()

    class Slow:  # a trainer that holds the only slot until released
        step_count = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def sft(self, examples: Any, **kwargs: Any) -> list[float]:
            started.set()
            assert release.wait(60)
            return [1.0]

        def save_checkpoint(self) -> Path:
            return tmp_path

        def close(self) -> None:
            pass  # holds nothing

    async def no_publish(*args: Any, **kwargs: Any) -> None:
        return None

    service = build_service(str(tiny_path), home=tmp_path, served_name="tiny", max_trainers=1, trainer_factory=Slow)
    server = EmbeddedServer(app=service.app)
    server.engine.load_adapter = no_publish  # type: ignore[method-assign]
    answers: list[float | None] = []

    def record(response: httpx.Response) -> float | None:
        wait = real_retry_after(response)
        answers.append(wait)
        release.set()  # the slot frees up once the waiting client has been told to wait
        return 0.01 if wait else wait

    real_retry_after = remote.retry_after
    with server:
        body = {"project": "p", "examples": HELLO, "steps": 1}
        first = threading.Thread(target=lambda: httpx.post(f"{server.base_url}/train/a/warmup", json=body, timeout=60))
        first.start()
        assert started.wait(30)
        impatient = art.RemoteBackend(server.base_url, home=tmp_path, max_wait=0)
        with pytest.raises(ServiceBusyError, match="--max-trainers"):
            impatient.warmup(art.TrainableModel(name="b", project="p").register(impatient), HELLO, steps=1)
        assert not release.is_set()
        monkeypatch.setattr(remote, "retry_after", record)
        patient = art.RemoteBackend(server.base_url, home=tmp_path, max_wait=30)
        model = art.TrainableModel(name="b", project="p").register(patient)
        started.clear()
        assert patient.warmup(model, HELLO, steps=1) == [1.0]  # waited, asked again, got the slot
        first.join(60)
    assert answers[0] == 5.0  # the service's retry-after for a 429
    service.close()


@pytest.mark.slow
def test_a_langgraph_art_serve_process_answers_in_the_same_vocabulary(tiny_path: Path, tmp_path: Path) -> None:
    """The command a user runs, as its own process: an aborted step, a reshaped config and an unknown checkpoint
    raise in RemoteBackend what they raise locally (above)."""
    port = free_port()
    argv = [sys.executable, "-m", "langgraph_art.cli", "serve", "--model", str(tiny_path), "--port", str(port)]
    argv += ["--home", str(tmp_path / "service")]
    with serving(argv, port, "`langgraph-art serve`") as url:
        backend = art.RemoteBackend(f"{url}/v1", home=tmp_path / "client", max_wait=0)
        model = art.TrainableModel(name="served", project="p").register(backend)
        backend.trainer(model, UNCORRECTED)
        with pytest.raises(TrainingAborted, match="non-finite"):
            backend.train_step(model, [exploding_group()], UNCORRECTED)
        backend.warmup(model, HELLO, steps=1)
        with pytest.raises(ModelNotFoundError, match="no checkpoint 7"):
            model.pin(7)
        backend.trainer(model, art.GRPOConfig(lora_r=4))
        with pytest.raises(ConfigError, match="lora_r"):
            backend.train_step(model, [exploding_group()])
