"""The OpenAI-compatible FastAPI app over an ``Engine``.

Endpoints: ``GET /health`` and ``GET /metrics`` (the engine's counters in Prometheus' text format, as vLLM serves
them) here; ``POST /v1/chat/completions`` (``completions.py``); ``GET /v1/models``, ``GET/POST /v1/policies``,
``GET/POST /v1/adapters``, ``DELETE /v1/adapters/{name}`` (``catalog.py``); errors in ``http_errors.py``; the
training routes (``training.py``) are mounted by ``langgraph-art serve``. Errors use OpenAI's error JSON: 400 naming
the bad field, 401 without the API key, 404 unknown model or adapter, 503 while the engine loads.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from langgraph_art.errors import EngineNotReadyError
from langgraph_art.serve.chat import TokenText
from langgraph_art.serve.engines.base import Engine
from langgraph_art.serve.http_errors import install_error_handlers
from langgraph_art.serve.protocol import error_body
from langgraph_art.serve.routes.catalog import catalog_router
from langgraph_art.serve.routes.completions import CALL_ID_HEADER, ChatCompletions
from langgraph_art.serve.routes.scoring import scoring_router

__all__ = ["CALL_ID_HEADER", "create_app"]
log = logging.getLogger(__name__)


def create_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    adapter_roots: Sequence[str | os.PathLike[str]] | None = None,
    tool_call_parser: str = "auto",
    reasoning_parser: str | None = "auto",
) -> FastAPI:
    """Build the app. The engine starts loading when the app starts; until it is ready, requests get 503.

    ``adapter_roots``: ``POST /v1/adapters`` loads only folders under these (``langgraph-art serve`` passes its home
    and each ``--adapter-root``); ``None`` allows any folder (an app built in your own process).
    ``tool_call_parser``/``reasoning_parser``: how replies are read (``serve/parsers``; vLLM's names), ``"auto"``:
    chosen from the chat template; an unknown name is a ``ConfigError`` here."""
    from langgraph_art.serve.parsers import check_parsers

    check_parsers(tool_call_parser, reasoning_parser)
    if reasoning_parser == "none":
        reasoning_parser = None
    roots = None if adapter_roots is None else [Path(root).resolve() for root in adapter_roots]
    state: dict[str, Any] = {"error": None, "token_text": None}

    async def load() -> None:
        try:
            await engine.start()
            state["token_text"] = TokenText(engine.tokenizer)
        except Exception as exc:
            log.exception("the engine failed to load")
            state["error"] = f"{type(exc).__name__}: {exc}"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()  # where the engine is used (a trainer thread's requests go here)
        task = asyncio.create_task(load())
        try:
            yield
        finally:
            task.cancel()
            await engine.close()

    app = FastAPI(title="langgraph-art inference service", lifespan=lifespan)
    app.state.engine = engine
    policies: set[str] = set()  # trainable model names: served by the base model until their first checkpoint
    app.state.policies = policies

    def ready() -> TokenText:
        if state["error"]:
            raise EngineNotReadyError(f"the engine failed to load: {state['error']}")
        if state["token_text"] is None:
            raise EngineNotReadyError("the model is still loading; retry in a few seconds")
        return state["token_text"]

    if api_key:  # a plain ASGI middleware: Starlette's BaseHTTPMiddleware cost ~15% of a request's CPU time
        app.add_middleware(_RequireKey, api_key=api_key)

    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state["error"]:
            return JSONResponse({"status": "error", "error": state["error"]}, 503)
        if state["token_text"] is None:
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ok", "model": engine.base_model, "adapters": sorted(engine.adapters())})

    completions = ChatCompletions(engine, ready, policies, tool_call_parser, reasoning_parser)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        loaded = state["token_text"] is not None
        return PlainTextResponse(prometheus_text({**engine.stats(), **completions.stats()} if loaded else {}))

    app.include_router(catalog_router(engine, ready, policies, roots, lambda: completions.reader.describe()))
    app.state.chat_completions = completions  # the in-process client calls it directly (inprocess.py)
    app.include_router(completions.router())
    app.include_router(scoring_router(engine, ready, policies))  # POST /v1/completions: prompt logprobs
    return app


_GAUGES = {"prefix_cache_blocks", "prefix_cache_bytes"}  # levels; every other counter only grows


def prometheus_text(stats: Mapping[str, float]) -> str:
    """``stats`` as Prometheus exposition text: ``langgraph_art:<name>_total`` counters (vLLM's ``vllm:`` style),
    gauges under their own names."""
    lines = []
    for name, value in sorted(stats.items()):
        kind = "gauge" if name in _GAUGES else "counter"
        metric = f"langgraph_art:{name}" + ("" if kind == "gauge" else "_total")
        lines += [f"# TYPE {metric} {kind}", f"{metric} {value}"]
    return "\n".join(lines) + "\n"


def read_prometheus_text(text: str) -> dict[str, float]:
    """``prometheus_text`` read back: name -> value (``RemoteBackend.engine_stats``)."""
    stats: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("langgraph_art:"):
            metric, _, value = line.partition(" ")
            stats[metric.removeprefix("langgraph_art:").removesuffix("_total")] = float(value)
    return stats


class _RequireKey:
    """401 for ``/v1`` requests without ``Authorization: Bearer <api_key>``."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            sent = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
            if not hmac.compare_digest(sent, self.expected):
                message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
                body = error_body(message, "authentication_error", code="invalid_api_key")
                await JSONResponse(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
