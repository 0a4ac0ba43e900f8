"""The training API of ``langgraph-art serve``: rollouts run anywhere, the updates happen next to the engine.

``POST /v1/train/{policy}/step`` takes scored trajectory groups (JSON), runs one GRPO step for that policy,
saves the checkpoint and loads it into the engine as ``policy@step``; ``POST /v1/train/{policy}/warmup`` runs an
SFT warm-up; ``GET /v1/train/{policy}`` tells the current step. One trainer per policy, created on first use,
resuming from the policy's latest checkpoint under ``<home>/<project>/checkpoints/<policy>``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from langgraph_art.config import GRPOConfig
from langgraph_art.serve.protocol import error_body
from langgraph_art.service import stale_adapters
from langgraph_art.types import TrajectoryGroup


class StepRequest(BaseModel):
    project: str
    groups: list[TrajectoryGroup]
    config: dict[str, Any] | None = None


class WarmupRequest(BaseModel):
    project: str
    examples: list[dict[str, Any]] = Field(min_length=1)
    steps: int = Field(ge=1)
    learning_rate: float | None = None
    config: dict[str, Any] | None = None


def training_router(engine: Any, home: str | Path, *, keep_loaded: int = 4) -> APIRouter:
    """Routes to mount on the inference app (``app.include_router(training_router(engine, home))``)."""
    router = APIRouter()
    root = Path(home)
    trainers: dict[str, Any] = {}
    locks: dict[str, asyncio.Lock] = {}

    def trainer_for(policy: str, project: str, config: dict[str, Any] | None) -> Any:
        from langgraph_art.train.trainer import GRPOTrainer

        if policy not in trainers:
            trainers[policy] = GRPOTrainer(
                engine.model_path, GRPOConfig(**(config or {})), checkpoint_dir=root / project / "checkpoints" / policy
            )
        return trainers[policy]

    async def serve(policy: str, step: int, folder: Path) -> None:
        await engine.load_adapter(f"{policy}@{step}", str(folder))
        for name in stale_adapters(engine.adapters(), policy, keep_loaded):
            await engine.unload_adapter(name)

    @router.get("/v1/train/{policy}")
    async def status(policy: str, project: str) -> dict[str, Any]:
        from langgraph_art.train import checkpoint

        return {"policy": policy, "step": checkpoint.latest_step(root / project / "checkpoints" / policy) or 0}

    @router.post("/v1/train/{policy}/step")
    async def step(policy: str, body: StepRequest) -> Any:
        from langgraph_art.train.trainer import TrainingAborted

        async with locks.setdefault(policy, asyncio.Lock()):
            trainer = await asyncio.to_thread(trainer_for, policy, body.project, body.config)
            try:
                result = await asyncio.to_thread(trainer.step, body.groups)
            except TrainingAborted as exc:
                return JSONResponse(error_body(str(exc), "training_error", None, "aborted"), 422)
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
        async with locks.setdefault(policy, asyncio.Lock()):
            trainer = await asyncio.to_thread(trainer_for, policy, body.project, body.config)
            losses = await asyncio.to_thread(
                trainer.sft, body.examples, steps=body.steps, learning_rate=body.learning_rate
            )
            await serve(policy, trainer.step_count, await asyncio.to_thread(trainer.save_checkpoint))
        return {"step": trainer.step_count, "losses": losses}

    return router
