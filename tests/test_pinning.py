"""``model.pin(step)``: a checkpoint kept whatever ``save_total_limit`` says, on a local backend and through the
service (``POST /v1/train/{policy}/pin``); a step that does not exist is a ``ModelNotFoundError`` on both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import langgraph_art as art
from langgraph_art.backends.service import build_service
from langgraph_art.errors import ModelNotFoundError
from langgraph_art.serve.embedded import EmbeddedServer
from langgraph_art.testing import FakeBackend
from langgraph_art.train import checkpoint

pytestmark = [pytest.mark.integration]
HELLO = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]}]


@pytest.fixture(scope="module")
def service(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("service")
    service = build_service(str(tiny_path), home=home, served_name="tiny")
    with EmbeddedServer(app=service.app) as server:
        yield server.base_url, home
    service.close()


def pinned_and_kept(checkpoints: Path) -> None:
    assert (checkpoint.step_dir(checkpoints, 0) / checkpoint.PIN).exists()
    assert checkpoint.prune(checkpoints, keep=0) == []  # a pruning that keeps nothing unpinned keeps it
    assert checkpoint.list_steps(checkpoints) == [0]


def test_pin_on_a_local_backend(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="kept", project="p").register(backend)
        backend.warmup(model, HELLO, steps=1)  # checkpoint 0
        model.pin(0)
        with pytest.raises(ModelNotFoundError, match=r"no checkpoint 7 \(kept: \[0\]\)"):
            model.pin(7)
    pinned_and_kept(tmp_path / "p" / "checkpoints" / "kept")


def test_pin_through_the_service(service: tuple[str, Path], tmp_path: Path) -> None:
    url, home = service
    backend = art.RemoteBackend(url, home=tmp_path)
    model = art.TrainableModel(name="kept", project="p").register(backend)
    backend.warmup(model, HELLO, steps=1)
    model.pin(0)
    with pytest.raises(ModelNotFoundError, match="no checkpoint 7"):
        model.pin(7)
    pinned_and_kept(home / "p" / "checkpoints" / "kept")


def test_bad_steps_and_backends_without_checkpoints_say_so(tmp_path: Path) -> None:
    model = art.TrainableModel(name="m", project="p").register(FakeBackend(tmp_path))
    with pytest.raises(art.ConfigError, match="keeps no checkpoints to pin"):
        model.pin(0)
    with art.LocalBackend(home=tmp_path) as backend:
        local = art.TrainableModel(name="m", project="p").register(backend)
        with pytest.raises(art.ConfigError, match="step must be an int >= 0"):
            local.pin(-1)
