"""``LocalBackend``: the embedded service. One in-process inference server per base model (a uvicorn thread on a
loopback port) and one GRPO trainer per trainable model, whose checkpoints are hot-loaded as ``name@step``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from langgraph_art.backends.base import register_policy, stale_adapters
from langgraph_art.errors import ConfigError
from langgraph_art.model import TrainableModel
from langgraph_art.store import TrajectoryStore, default_home
from langgraph_art.types import ModelRef


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
        register_policy(self.server(model.base_model).base_url, None, model.name)
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
