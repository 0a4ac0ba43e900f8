"""The training routes of ``langgraph-art serve``: rollouts run anywhere, the updates happen next to the engine.

``POST /v1/train/{policy}/step`` takes scored trajectory groups (JSON), runs one GRPO step for that policy,
saves the checkpoint and loads it into the engine as ``project/policy@step``; ``POST /v1/train/{policy}/warmup`` runs an
SFT warm-up; ``GET /v1/train/{policy}?project=P`` tells the current step. The trainers belong to a
``train.policies.PolicyRegistry`` the caller passes in (this module never imports ``train/``): the same registry
the local backend uses, so configs, devices and bounds behave the same locally and through the service.

What it refuses (a 4xx naming the field, never a 500): policy and project names that are not plain names (the
rule of ``TrainableModel``), so no request reaches a folder outside the service's home; unknown ``config`` keys
and invalid values; malformed groups and examples; 429 when every live trainer is busy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from langgraph_art.config import NAME_PATTERN, GRPOConfig, check_name, served_name
from langgraph_art.errors import ConfigError, LangGraphArtError, RequestError, ServiceBusyError, TrainingAborted
from langgraph_art.serve.engines.base import Engine
from langgraph_art.serve.protocol import Tool, ToolCall
from langgraph_art.serve.publish import publish, trainer_turn_async
from langgraph_art.types import ModelRef, StepResult, Trajectory, TrajectoryGroup

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
    """Conversations and/or stored trajectories (trained on their exact sampled ids), at least one in all."""

    model_config = ConfigDict(extra="forbid")
    project: Name
    examples: list[Conversation] = Field(default_factory=list)
    trajectories: list[Trajectory] = Field(default_factory=list)
    steps: int = Field(ge=1, le=MAX_WARMUP_STEPS)
    learning_rate: float | None = Field(default=None, gt=0, lt=1)
    config: GRPOConfig | None = None


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: Name
    step: int = Field(ge=0)


class PolicyTraining(Protocol):
    """What the routes need of the trainers: ``train.policies.PolicyRegistry`` (this module never imports it; its
    caller, ``backends.service.build_service``, passes one in)."""

    def current_step(self, project: str, name: str) -> int: ...

    def latest_checkpoint(self, project: str, name: str) -> Path | None: ...

    def pin(self, project: str, name: str, step: int) -> None: ...

    def step(
        self, project: str, name: str, groups: Sequence[TrajectoryGroup], config: GRPOConfig | None = None
    ) -> tuple[StepResult, Path | None]: ...

    def warmup(
        self,
        project: str,
        name: str,
        examples: Sequence[Trajectory | Mapping[str, object]],
        *,
        steps: int,
        learning_rate: float | None = None,
        config: GRPOConfig | None = None,
    ) -> tuple[list[float], int, Path]: ...


def training_router(engine: Engine, policies: PolicyTraining, *, keep_loaded: int = 4) -> APIRouter:
    """Routes to mount on the inference app: ``app.include_router(training_router(engine, registry))`` with a
    ``PolicyRegistry`` for the engine's base model."""
    router = APIRouter()

    def plain(value: str, field: str = "policy") -> str:
        try:
            return check_name(value)
        except ValueError as exc:
            raise RequestError(f"{field} {exc}", field) from None

    @router.get("/v1/train/{policy}")
    async def status(policy: str, project: str) -> dict[str, Any]:
        step = policies.current_step(plain(project, "project"), plain(policy))
        folder = policies.latest_checkpoint(project, plain(policy))
        return {"policy": policy, "project": project, "step": step, "checkpoint": str(folder) if folder else None}

    @router.post("/v1/train/{policy}/pin")
    async def pin(policy: str, body: PinRequest) -> dict[str, Any]:
        """Keep checkpoint ``step`` whatever ``save_total_limit`` says (404 when there is none)."""
        await asyncio.to_thread(policies.pin, body.project, plain(policy), body.step)
        return {"policy": policy, "project": body.project, "step": body.step, "pinned": True}

    @router.post("/v1/train/{policy}/step")
    async def step(policy: str, body: StepRequest) -> Any:
        try:
            async with trainer_turn_async(engine):
                result, folder = await asyncio.to_thread(
                    policies.step, body.project, plain(policy), body.groups, body.config
                )
        except (TrainingAborted, ServiceBusyError, RequestError):
            raise  # 422 / 429 / 400 as they are (http_errors)
        except ConfigError as exc:  # a config the live trainer cannot take (another LoRA shape): a ConfigError remotely
            raise RequestError(f"config: {exc}", "config", code="invalid_config") from exc
        except ValueError as exc:  # input the trainer cannot use (token ids outside the vocabulary, ...)
            raise RequestError(f"groups: {exc}", "groups") from exc
        if folder is not None:
            await publish(engine, ModelRef(served_name(body.project, policy), result.step), folder, keep_loaded)
        return {
            "step": result.step,
            "updated": result.updated,
            "metrics": result.metrics,
            "skipped": result.skipped,
            "reason": result.reason,
            "advantages": result.advantages,
            "checkpoint": str(folder) if folder is not None else None,  # where replicas load it from
        }

    @router.post("/v1/train/{policy}/warmup")
    async def warmup(policy: str, body: WarmupRequest) -> Any:
        examples: list[Trajectory | Mapping[str, object]] = [e.model_dump(exclude_none=True) for e in body.examples]
        examples += body.trajectories
        if not examples:
            raise RequestError("examples: give at least one conversation (or trajectories)", "examples")
        try:
            async with trainer_turn_async(engine):
                losses, step, folder = await asyncio.to_thread(
                    policies.warmup,
                    body.project,
                    plain(policy),
                    examples,
                    steps=body.steps,
                    learning_rate=body.learning_rate,
                    config=body.config,
                )
        except (TrainingAborted, ServiceBusyError, RequestError):
            raise
        except ConfigError as exc:
            raise RequestError(f"config: {exc}", "config", code="invalid_config") from exc
        except (ValueError, LangGraphArtError) as exc:  # nothing to learn, a template that cannot render it
            raise RequestError(f"examples: {exc}", "examples") from exc
        await publish(engine, ModelRef(served_name(body.project, policy), step), folder, keep_loaded)
        return {"step": step, "losses": losses, "checkpoint": str(folder)}

    return router
