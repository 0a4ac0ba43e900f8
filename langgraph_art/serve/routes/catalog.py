"""The service's catalog routes: ``GET /v1/models``, ``GET/POST /v1/policies``, ``GET/POST /v1/adapters`` and
``DELETE /v1/adapters/{name}`` (what is served, and loading or unloading adapters at run time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, field_validator

from langgraph_art.config import check_served_name
from langgraph_art.errors import RequestError
from langgraph_art.serve.engines.base import Engine
from langgraph_art.serve.routes.completions import resolve_adapter


class AdapterLoad(BaseModel):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:  # no file system takes it (os functions raise ValueError)
            raise ValueError("a folder path cannot contain a NUL character")
        return value


class PolicyRegistration(BaseModel):
    name: str


def catalog_router(
    engine: Engine,
    ready: Callable[[], Any],
    policies: set[str],
    roots: list[Path] | None,
    parsers: Callable[[], dict[str, Any]] = dict,
) -> APIRouter:
    """``policies``: registered trainable model names (served by the base model until their first checkpoint);
    ``roots``: the folders adapters may be loaded from (None: any); ``parsers``: the parsers replies are read with
    (shown on the base model in ``/v1/models``)."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        ready()
        created = int(time.time())
        data = [
            {
                "id": engine.base_model,
                "object": "model",
                "created": created,
                "owned_by": "langgraph-art",
                "root": engine.base_model,
                "parent": None,
                "max_model_len": engine.max_model_len,
                **parsers(),
            }
        ]
        for name, path in sorted(engine.adapters().items()):
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "langgraph-art",
                    "root": path,
                    "parent": engine.base_model,
                }
            )
        return {"object": "list", "data": data}

    @router.get("/v1/policies")
    async def list_policies() -> dict[str, Any]:
        return {"data": [{"name": n, "serves": resolve_adapter(engine, n, policies) or engine.base_model}
                         for n in sorted(policies)]}  # fmt: skip

    @router.post("/v1/policies")
    async def register_policy(body: PolicyRegistration) -> dict[str, Any]:
        ready()
        add_policy(engine, policies, body.name)
        return {"name": body.name, "serves": resolve_adapter(engine, body.name, policies) or engine.base_model}

    @router.get("/v1/adapters")
    async def list_adapters() -> dict[str, Any]:
        ready()
        return {"data": [{"name": n, "path": p} for n, p in sorted(engine.adapters().items())]}

    @router.post("/v1/adapters")
    async def load_adapter(body: AdapterLoad) -> dict[str, Any]:
        ready()
        if body.name == engine.base_model:
            raise RequestError(f"{body.name!r} is the base model's name; choose another adapter name", "name")
        if roots is not None and not any(Path(body.path).resolve().is_relative_to(root) for root in roots):
            raise RequestError(
                f"{body.path!r} is outside the folders this service loads adapters from ({[str(r) for r in roots]}); "
                "copy the adapter under one of them, or start the service with --adapter-root <folder>",
                "path",
                code="path_not_allowed",
            )
        await engine.load_adapter(body.name, body.path)
        return {"name": body.name, "path": body.path, "loaded": True}

    @router.delete("/v1/adapters/{name:path}")
    async def unload_adapter(name: str) -> dict[str, Any]:
        ready()
        await engine.unload_adapter(name)
        return {"name": name, "unloaded": True}

    return router


def add_policy(engine: Engine, policies: set[str], name: str) -> None:
    """Serve ``name`` (``project/name`` or a plain name) as a trainable model: the base model until its first
    checkpoint is published. ``RequestError`` naming ``name`` for a name that is not plain or is the base model's."""
    try:
        check_served_name(name)
    except ValueError as exc:
        raise RequestError(f"a policy is 'project/name' or a plain 'name' like 'agent-001': {exc}", "name") from None
    if name == engine.base_model:
        raise RequestError(f"{name!r} is the base model's name; a policy needs its own name", "name")
    policies.add(name)
