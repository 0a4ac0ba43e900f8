"""The user-facing shape: a ``TrainableModel`` registered with a backend that serves it.

``LocalBackend`` runs the inference service embedded in this process (a uvicorn thread on a loopback port, one
per base model); ``RemoteBackend`` talks to a ``langgraph-art serve`` elsewhere. Either way
``ChatART(model=trainable_model)`` serves the model's current policy: its latest checkpoint, or the base model
before the first one. (Training through the backend arrives with the GRPO trainer.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, PrivateAttr, field_validator

from langgraph_art.capture.recorder import TurnRecorder
from langgraph_art.config import check_name
from langgraph_art.errors import ConfigError
from langgraph_art.store import TrajectoryStore, default_home
from langgraph_art.types import ModelRef


class Backend(Protocol):
    def register(self, model: TrainableModel) -> None: ...

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]: ...


class TrainableModel(BaseModel):
    """A model that learns: ``name`` (served as ``name`` and ``name@step``), ``project`` (where its data lives)
    and ``base_model`` (``"tiny"``, a hub id, or a local folder as a ``str`` or ``Path``)."""

    name: str
    project: str
    base_model: str = "tiny"
    _backend: Backend | None = PrivateAttr(default=None)
    _recorder: TurnRecorder = PrivateAttr(default_factory=TurnRecorder)

    @field_validator("name", "project")
    @classmethod
    def _plain(cls, value: str) -> str:
        return check_name(value)

    @field_validator("base_model", mode="before")
    @classmethod
    def _path_or_name(cls, value: Any) -> Any:
        return str(value) if isinstance(value, os.PathLike) else value

    def register(self, backend: Backend) -> TrainableModel:
        """Attach to a backend (``LocalBackend()`` or ``RemoteBackend(url)``); the model is servable after this."""
        backend.register(self)
        self._backend = backend
        return self

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise ConfigError(f"model {self.name!r} is not registered: call model.register(art.LocalBackend()) first")
        return self._backend

    @property
    def recorder(self) -> TurnRecorder:
        """Shared by every ChatART of this model, so one handler can adopt all their unseen calls."""
        return self._recorder

    def chat_model_settings(self) -> dict[str, Any]:
        """What ``ChatART(model=self)`` needs: base_url, api_key, model name, recorder."""
        return {**self.backend.chat_model_settings(self), "model": self.name, "recorder": self._recorder}


class LocalBackend:
    """The embedded service: one in-process inference server per base model, started on first registration, and
    one GRPO trainer per trainable model, whose checkpoints are hot-loaded into the server as ``name@step``.

    ``merge_adapters=False`` serves adapters through peft's LoRA layers instead of merging the one in use into
    the weights: slower sampling, but no copy of the targeted base weights in memory (for a large model in a
    tight RAM budget). ``fast_decode=False`` runs every forward through transformers."""

    def __init__(
        self,
        *,
        home: str | Path | None = None,
        device: str | None = None,
        max_batch_size: int = 64,
        keep_loaded: int = 4,
        merge_adapters: bool = True,
        fast_decode: bool = True,
    ) -> None:
        self.home = Path(home) if home is not None else default_home()
        self.device = device
        self.keep_loaded = keep_loaded
        self._engine_kwargs: dict[str, Any] = {
            "device": device,
            "max_batch_size": max_batch_size,
            "merge_adapters": merge_adapters,
            "fast_decode": fast_decode,
        }
        self._servers: dict[str, Any] = {}
        self._trainers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def checkpoint_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "checkpoints" / model.name

    def run_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "runs" / model.name

    def trainer(self, model: TrainableModel, config: Any = None) -> Any:
        """The model's ``GRPOTrainer`` (created on first use; resumes from its latest checkpoint)."""
        from langgraph_art.train.trainer import GRPOTrainer

        with self._lock:
            trainer = self._trainers.get(model.name)
            if trainer is None:
                trainer = GRPOTrainer(
                    model.base_model, config, checkpoint_dir=self.checkpoint_dir(model), device=self.device
                )
                self._trainers[model.name] = trainer
            elif config is not None:
                trainer.update_config(config)
            return trainer

    def current_step(self, model: TrainableModel) -> int:
        from langgraph_art.train import checkpoint

        return checkpoint.latest_step(self.checkpoint_dir(model)) or 0

    def train_step(self, model: TrainableModel, groups: Any, config: Any = None) -> Any:
        """One GRPO step; when the weights changed, save checkpoint ``step`` and serve it as ``name@step``."""
        trainer = self.trainer(model, config)
        result = trainer.step(groups)
        if result.updated:
            folder = trainer.save_checkpoint()
            self._serve(model, result.step, folder)
        return result

    def warmup(
        self,
        model: TrainableModel,
        examples: Any,
        *,
        steps: int,
        learning_rate: float | None = None,
        config: Any = None,
    ) -> list[float]:
        """SFT warm-up of the model's LoRA; the result is saved and served as the current step (``name@0`` for
        a fresh model)."""
        trainer = self.trainer(model, config)
        losses = trainer.sft(examples, steps=steps, learning_rate=learning_rate)
        self._serve(model, trainer.step_count, trainer.save_checkpoint())
        return losses

    def _serve(self, model: TrainableModel, step: int, folder: Path) -> None:
        base_url = self.server(model.base_model).base_url
        response = httpx.post(
            f"{base_url}/adapters", json={"name": str(ModelRef(model.name, step)), "path": str(folder)}, timeout=120
        )
        if response.status_code != 200:
            raise ConfigError(f"the service could not load checkpoint {folder}: {response.text}")
        loaded = [a["name"] for a in httpx.get(f"{base_url}/adapters", timeout=30).json()["data"]]
        for name in stale_adapters(loaded, model.name, self.keep_loaded):  # older steps stay on disk
            httpx.delete(f"{base_url}/adapters/{name}", timeout=30)

    def server(self, base_model: str) -> Any:
        """The running embedded server for ``base_model`` (started on first use)."""
        from langgraph_art.serve.embedded import EmbeddedServer

        with self._lock:
            server = self._servers.get(base_model)
            if server is None:
                server = EmbeddedServer(
                    base_model, served_name=base_model, adapter_roots=[self.home], **self._engine_kwargs
                ).start()
                self._servers[base_model] = server
            return server

    def register(self, model: TrainableModel) -> None:
        _register_policy(self.server(model.base_model).base_url, None, model.name)
        from langgraph_art.train import checkpoint

        step = checkpoint.latest_step(self.checkpoint_dir(model))
        if step is not None:  # a model trained before: serve where it left off
            self._serve(model, step, checkpoint.step_dir(self.checkpoint_dir(model), step))

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]:
        return {"base_url": self.server(model.base_model).base_url, "api_key": "unused"}

    def store(self, model: TrainableModel) -> TrajectoryStore:
        return TrajectoryStore.for_project(model.project, self.home)

    def close(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RemoteStepResult:
    """What a remote training step reports (the same fields as the local trainer's ``StepResult``)."""

    step: int
    updated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    reason: str | None = None


class RemoteBackend:
    """A client of ``langgraph-art serve`` at ``base_url`` (``http://host:8000/v1``): rollouts run here (many
    machines can point at one service), training steps run in the service. The store and metrics stay local,
    under ``home``."""

    def __init__(
        self, base_url: str, api_key: str | None = None, *, home: str | Path | None = None, timeout: float = 600.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.home = Path(home) if home is not None else default_home()
        self.timeout = timeout
        self._config: dict[str, dict[str, Any] | None] = {}

    def register(self, model: TrainableModel) -> None:
        _register_policy(self.base_url, self.api_key, model.name)

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]:
        return {"base_url": self.base_url, "api_key": self.api_key or "unused"}

    def store(self, model: TrainableModel) -> TrajectoryStore:
        return TrajectoryStore.for_project(model.project, self.home)

    def run_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "runs" / model.name

    def trainer(self, model: TrainableModel, config: Any = None) -> None:
        """Remember the config sent with each step (the service creates the trainer on the first one)."""
        self._config[model.name] = config.model_dump() if config is not None else None

    def current_step(self, model: TrainableModel) -> int:
        body = self._call("get", f"/train/{model.name}", params={"project": model.project})
        return int(body["step"])

    def train_step(self, model: TrainableModel, groups: Any, config: Any = None) -> RemoteStepResult:
        payload = {
            "project": model.project,
            "config": self._config.get(model.name),
            "groups": [g.model_dump(mode="json") for g in groups],
        }
        return RemoteStepResult(**self._call("post", f"/train/{model.name}/step", json=payload))

    def warmup(
        self,
        model: TrainableModel,
        examples: Any,
        *,
        steps: int,
        learning_rate: float | None = None,
        config: Any = None,
    ) -> list[float]:
        if any(not isinstance(e, dict) for e in examples):
            raise ConfigError("a remote warm-up takes conversations ({'messages': [...]}), not Trajectory objects")
        payload = {
            "project": model.project,
            "examples": list(examples),
            "steps": steps,
            "learning_rate": learning_rate,
            "config": config.model_dump() if config is not None else None,
        }
        return list(self._call("post", f"/train/{model.name}/warmup", json=payload)["losses"])

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.request(method, f"{self.base_url}{path}", headers=headers, timeout=self.timeout, **kwargs)
        except httpx.TransportError as exc:
            raise ConfigError(f"cannot reach the langgraph-art service at {self.base_url}: {exc}") from exc
        if response.status_code == 404 and path.startswith("/train"):
            raise ConfigError(
                f"the service at {self.base_url} has no training API: start it with "
                "`langgraph-art serve` (training is on by default)"
            )
        if response.status_code != 200:
            raise ConfigError(f"the service at {self.base_url} answered {response.status_code}: {response.text}")
        return response.json()


def stale_adapters(loaded: Iterable[str], policy: str, keep: int) -> list[str]:
    """The loaded ``policy@step`` adapters beyond the newest ``keep``, oldest first (to unload)."""
    refs = sorted((ref for ref in map(ModelRef.parse, loaded) if ref.name == policy and ref.step is not None),
                  key=lambda ref: ref.step or 0)  # fmt: skip
    return [str(ref) for ref in refs[: max(0, len(refs) - keep)]]


def _register_policy(base_url: str, api_key: str | None, name: str) -> None:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{base_url}/policies", json={"name": name}, headers=headers, timeout=30)
    except httpx.TransportError as exc:
        raise ConfigError(f"cannot reach the langgraph-art service at {base_url}: {exc}") from exc
    if response.status_code != 200:
        raise ConfigError(f"the service at {base_url} refused policy {name!r}: {response.text}")
