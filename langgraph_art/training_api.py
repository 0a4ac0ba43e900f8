"""The training API of ``langgraph-art serve``: rollouts run anywhere, the updates happen next to the engine.

``POST /v1/train/{policy}/step`` takes scored trajectory groups (JSON), runs one GRPO step for that policy,
saves the checkpoint and loads it into the engine as ``policy@step``; ``POST /v1/train/{policy}/warmup`` runs an
SFT warm-up; ``GET /v1/train/{policy}?project=P`` tells the current step. Checkpoints live under
``<home>/<project>/checkpoints/<policy>``.

What it refuses (a 4xx naming the field, never a 500): policy and project names that are not plain names (the
rule of ``TrainableModel``), so no request can reach a folder outside the service's home; unknown ``config`` keys
and invalid values; malformed groups and examples. Live trainers (each holds a full copy of the model) are bounded:
at most ``max_trainers``, keyed by (project, policy); a new one replaces the least recently used idle one (whose
state is already in its latest checkpoint, written after every update); when all are busy the request gets a 429.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from langgraph_art.backends.base import stale_adapters
from langgraph_art.config import NAME_PATTERN, GRPOConfig, check_name
from langgraph_art.errors import ConfigError, LangGraphArtError, RequestError, ServiceBusyError
from langgraph_art.serve.protocol import Tool, ToolCall, error_body
from langgraph_art.types import ModelRef, TrajectoryGroup

log = logging.getLogger(__name__)
Name = Annotated[str, Field(json_schema_extra={"pattern": NAME_PATTERN}), AfterValidator(check_name)]
MAX_WARMUP_STEPS = 100_000


class SFTMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # like the chat API: OpenAI message dicts may carry more
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class Conversation(BaseModel):
    """One warm-up example: a chat (the assistant's messages are learned) and the tools it could call."""

    model_config = ConfigDict(extra="forbid")
    messages: list[SFTMessage] = Field(min_length=1)
    tools: list[Tool] | None = None


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: Name
    groups: list[TrajectoryGroup]
    config: GRPOConfig | None = None


class WarmupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: Name
    examples: list[Conversation] = Field(min_length=1)
    steps: int = Field(ge=1, le=MAX_WARMUP_STEPS)
    learning_rate: float | None = Field(default=None, gt=0, lt=1)
    config: GRPOConfig | None = None


@dataclass
class _Slot:
    trainer: Any = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # requests holding or waiting for this slot: it is not evicted while > 0


class LiveTrainers:
    """At most ``limit`` trainers in memory, keyed by (project, policy), least recently used dropped first."""

    def __init__(self, create: Callable[[str, str, GRPOConfig | None], Any], limit: int) -> None:
        if limit < 1:
            raise ConfigError(f"max_trainers must be >= 1, got {limit}")
        self._create, self.limit = create, limit
        self._slots: OrderedDict[tuple[str, str], _Slot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._slots)

    @asynccontextmanager
    async def lease(self, project: str, policy: str, config: GRPOConfig | None) -> AsyncIterator[Any]:
        """The trainer of (project, policy), exclusively for this request; ``config`` applied to it."""
        key = (project, policy)
        slot = self._slots.get(key)
        if slot is None:
            self._make_room(key)
            slot = self._slots[key] = _Slot()
        self._slots.move_to_end(key)
        slot.users += 1
        try:
            async with slot.lock:
                if slot.trainer is None:
                    slot.trainer = await asyncio.to_thread(self._create, project, policy, config)
                elif config is not None:
                    try:
                        slot.trainer.update_config(config)
                    except ConfigError as exc:  # e.g. a different LoRA shape than its checkpoints
                        raise RequestError(f"config: {exc}", "config", code="config_conflict") from exc
                yield slot.trainer
        finally:
            slot.users -= 1
            if slot.trainer is None and slot.users == 0:  # creation failed: free the slot
                self._slots.pop(key, None)

    def _make_room(self, key: tuple[str, str]) -> None:
        while len(self._slots) >= self.limit:
            idle = next((k for k, s in self._slots.items() if s.users == 0), None)  # oldest first
            if idle is None:
                raise ServiceBusyError(
                    f"all {self.limit} live trainers are busy with other policies; retry shortly, or start the "
                    "service with a larger --max-trainers (each trainer holds a copy of the model in memory)"
                )
            log.info("dropping the trainer of %s/%s (least recently used) to make room for %s/%s", *idle, *key)
            del self._slots[idle]
            gc.collect()


def training_router(
    engine: Any,
    home: str | Path,
    *,
    keep_loaded: int = 4,
    max_trainers: int = 2,
    trainer_factory: Callable[..., Any] | None = None,
) -> APIRouter:
    """Routes to mount on the inference app (``app.include_router(training_router(engine, home))``).

    ``trainer_factory(base_model, config, checkpoint_dir=...)`` builds a trainer (default: ``GRPOTrainer``)."""
    router = APIRouter()
    root = Path(home).resolve()

    def checkpoints(project: str, policy: str) -> Path:
        folder = (root / project / "checkpoints" / policy).resolve()
        if not folder.is_relative_to(root):  # names are plain already; a symlink must not lead out either
            raise RequestError(f"project {project!r} / policy {policy!r} leads outside the service home", "project")
        return folder

    def create(project: str, policy: str, config: GRPOConfig | None) -> Any:
        factory = trainer_factory
        if factory is None:
            from langgraph_art.train.trainer import GRPOTrainer

            factory = GRPOTrainer
        return factory(engine.model_path, config, checkpoint_dir=checkpoints(project, policy))

    trainers = LiveTrainers(create, max_trainers)
    router.trainers = trainers  # type: ignore[attr-defined]

    def plain(value: str, field: str = "policy") -> str:
        try:
            return check_name(value)
        except ValueError as exc:
            raise RequestError(f"{field} {exc}", field) from None

    async def serve(policy: str, step: int, folder: Path) -> None:
        await engine.load_adapter(str(ModelRef(policy, step)), str(folder))
        for name in stale_adapters(engine.adapters(), policy, keep_loaded):
            await engine.unload_adapter(name)

    @router.get("/v1/train/{policy}")
    async def status(policy: str, project: str) -> dict[str, Any]:
        from langgraph_art.train import checkpoint

        folder = checkpoints(plain(project, "project"), plain(policy))
        return {"policy": policy, "project": project, "step": checkpoint.latest_step(folder) or 0}

    @router.post("/v1/train/{policy}/step")
    async def step(policy: str, body: StepRequest) -> Any:
        from langgraph_art.train.trainer import TrainingAborted

        checkpoints(body.project, plain(policy))
        async with trainers.lease(body.project, policy, body.config) as trainer:
            try:
                result = await asyncio.to_thread(trainer.step, body.groups)
            except TrainingAborted as exc:
                return JSONResponse(error_body(str(exc), "training_error", None, "aborted"), 422)
            except ValueError as exc:  # input the trainer cannot use (token ids outside the vocabulary, ...)
                raise RequestError(f"groups: {exc}", "groups") from exc
            if result.updated:
                await serve(policy, result.step, await asyncio.to_thread(trainer.save_checkpoint))
        return {
            "step": result.step,
            "updated": result.updated,
            "metrics": result.metrics,
            "skipped": result.skipped,
            "reason": result.reason,
        }

    @router.post("/v1/train/{policy}/warmup")
    async def warmup(policy: str, body: WarmupRequest) -> Any:
        from langgraph_art.train.trainer import TrainingAborted

        checkpoints(body.project, plain(policy))
        examples = [e.model_dump(exclude_none=True) for e in body.examples]
        async with trainers.lease(body.project, policy, body.config) as trainer:
            try:
                losses = await asyncio.to_thread(
                    trainer.sft, examples, steps=body.steps, learning_rate=body.learning_rate
                )
            except TrainingAborted as exc:
                return JSONResponse(error_body(str(exc), "training_error", None, "aborted"), 422)
            except (ValueError, LangGraphArtError) as exc:  # nothing to learn, a template that cannot render it
                raise RequestError(f"examples: {exc}", "examples") from exc
            await serve(policy, trainer.step_count, await asyncio.to_thread(trainer.save_checkpoint))
        return {"step": trainer.step_count, "losses": losses}

    return router
