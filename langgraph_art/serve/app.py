"""The OpenAI-compatible FastAPI app over an ``Engine``.

Endpoints: ``POST /v1/chat/completions`` (streaming or not), ``GET /v1/models``, ``GET/POST /v1/adapters``,
``DELETE /v1/adapters/{name}``, ``GET /health``. Every completion token carries its ``token_id`` inside
``logprobs.content[i]`` and each response names its call in the ``x-langgraph-art-call-id`` header. Errors use
OpenAI's error JSON: 400 naming the bad field, 401 without the API key, 404 unknown model or adapter, 503 while
the engine loads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from langgraph_art.config import check_name
from langgraph_art.errors import (
    AdapterError,
    EngineNotReadyError,
    ModelNotFoundError,
    RequestError,
    ServiceBusyError,
)
from langgraph_art.serve.chat import (
    StreamedText,
    TokenText,
    assistant_message,
    logprob_content,
    render_prompt,
)
from langgraph_art.serve.engines.base import Engine, FinishedEvent, GenerationRequest, GenerationResult
from langgraph_art.serve.protocol import ChatCompletionRequest, error_body
from langgraph_art.types import ModelRef

log = logging.getLogger(__name__)
CALL_ID_HEADER = "x-langgraph-art-call-id"


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


def create_app(
    engine: Engine, *, api_key: str | None = None, adapter_roots: Sequence[str | os.PathLike[str]] | None = None
) -> FastAPI:
    """Build the app. The engine starts loading when the app starts; until it is ready, requests get 503.

    ``adapter_roots``: ``POST /v1/adapters`` loads only folders under these (``langgraph-art serve`` passes its home
    and each ``--adapter-root``); ``None`` allows any folder (an app built in your own process)."""
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
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
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

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Any:
        path, sent = request.url.path, request.headers.get("authorization", "")
        if api_key and path.startswith("/v1") and sent != f"Bearer {api_key}":
            message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
            return JSONResponse(error_body(message, "authentication_error", code="invalid_api_key"), 401)
        return await call_next(request)

    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state["error"]:
            return JSONResponse({"status": "error", "error": state["error"]}, 503)
        if state["token_text"] is None:
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ok", "model": engine.base_model, "adapters": sorted(engine.adapters())})

    @app.get("/v1/models")
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

    @app.get("/v1/policies")
    async def list_policies() -> dict[str, Any]:
        return {"data": [{"name": n, "serves": resolve_adapter(engine, n, policies) or engine.base_model}
                         for n in sorted(policies)]}  # fmt: skip

    @app.post("/v1/policies")
    async def register_policy(body: PolicyRegistration) -> dict[str, Any]:
        ready()
        try:
            check_name(body.name)
        except ValueError as exc:
            raise RequestError(f"a policy name is a plain name like 'agent-001': {exc}", "name") from None
        if body.name == engine.base_model:
            raise RequestError(f"{body.name!r} is the base model's name; a policy needs its own name", "name")
        policies.add(body.name)
        return {"name": body.name, "serves": resolve_adapter(engine, body.name, policies) or engine.base_model}

    @app.get("/v1/adapters")
    async def list_adapters() -> dict[str, Any]:
        ready()
        return {"data": [{"name": n, "path": p} for n, p in sorted(engine.adapters().items())]}

    @app.post("/v1/adapters")
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

    @app.delete("/v1/adapters/{name:path}")
    async def unload_adapter(name: str) -> dict[str, Any]:
        ready()
        await engine.unload_adapter(name)
        return {"name": name, "unloaded": True}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        token_text = ready()
        body.check_supported()
        adapter = resolve_adapter(engine, body.model, policies)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        prompt = render_prompt(engine.tokenizer, body.template_messages(), tools)
        call_id = uuid.uuid4().hex
        request = GenerationRequest(prompt, body.sampling_params(), adapter, call_id)
        headers = {CALL_ID_HEADER: call_id}
        if body.stream:
            events = engine.stream(request)
            first = await anext(aiter(events))  # errors before the first token still become proper 4xx/5xx
            return StreamingResponse(
                _sse(body, events, first, engine, token_text, call_id, prompt, adapter or body.model),
                media_type="text/event-stream",
                headers=headers,
            )
        result = await engine.generate(request)
        return JSONResponse(_completion(body, result, token_text, call_id), headers=headers)

    return app


def resolve_adapter(engine: Engine, model: str, policies: set[str] | frozenset[str] = frozenset()) -> str | None:
    """``None`` for the base model, the adapter name otherwise.

    ``"agent"`` means its latest loaded ``"agent@N"``; a registered policy name with no checkpoint yet means the
    base model (a trainable model starts as its base model).
    """
    if model == engine.base_model:
        return None
    loaded = engine.adapters()
    if model in loaded:
        return model
    steps = [ref for ref in map(ModelRef.parse, loaded) if ref.name == model and ref.step is not None]
    if steps:
        return str(max(steps, key=lambda ref: ref.step or 0))
    if model in policies:
        return None
    raise ModelNotFoundError(
        f"model {model!r} is not served; available: {[engine.base_model, *sorted(policies), *sorted(loaded)]}"
        " (load an adapter with POST /v1/adapters, or register a policy with POST /v1/policies)"
    )


def _completion(
    body: ChatCompletionRequest, result: GenerationResult, token_text: TokenText, call_id: str
) -> dict[str, Any]:
    choices = []
    for sample in result.samples:
        message, finish = assistant_message(sample, body.tools_enabled())
        choice: dict[str, Any] = {
            "index": sample.index,
            "message": message,
            "finish_reason": finish,
            "logprobs": None,
        }
        if body.logprobs:
            choice["logprobs"] = {
                "content": logprob_content(sample.token_ids, sample.logprobs, sample.top_logprobs, token_text)
            }
        if body.return_token_ids:
            choice["token_ids"] = sample.token_ids
        choices.append(choice)
    completion_tokens = sum(len(s.token_ids) for s in result.samples)
    response = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.adapter or body.model,  # the adapter that answered: "agent" resolves to "agent@7"
        "choices": choices,
        "usage": _usage(len(result.prompt_token_ids), completion_tokens),
    }
    if body.return_token_ids:
        response["prompt_token_ids"] = result.prompt_token_ids
    return response


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _sse(
    body: ChatCompletionRequest,
    events: AsyncIterator[Any],
    first: Any,
    engine: Engine,
    token_text: TokenText,
    call_id: str,
    prompt_ids: list[int],
    served: str,
) -> AsyncIterator[str]:
    created = int(time.time())
    base = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": served,  # the adapter that answers: "agent" resolves to "agent@7"
    }
    tools = body.tools_enabled()
    texts = [StreamedText(engine.tokenizer, body.sampling_params().stop, tools) for _ in range(body.n)]

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

    for i in range(body.n):
        opening = chunk(i, {"role": "assistant", "content": ""})
        if body.return_token_ids:  # vLLM puts the prompt ids on the first chunk
            opening = opening.replace('"choices"', f'"prompt_token_ids": {json.dumps(prompt_ids)}, "choices"', 1)
        yield opening
    event = first
    try:
        while True:
            if isinstance(event, FinishedEvent):
                for sample in event.result.samples:
                    message, finish = assistant_message(sample, tools)
                    rest = texts[sample.index].rest(message.get("content"))
                    if rest:
                        yield chunk(sample.index, {"content": rest})
                    for k, call in enumerate(message.get("tool_calls", [])):
                        yield chunk(sample.index, {"tool_calls": [{"index": k, **call}]})
                    yield chunk(sample.index, {}, finish)
                if body.stream_options and body.stream_options.include_usage:
                    result = event.result
                    usage = _usage(len(result.prompt_token_ids), sum(len(s.token_ids) for s in result.samples))
                    yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
                break
            delta = texts[event.index].push(event.token_id)
            logprobs = None
            if body.logprobs:
                logprobs = {
                    "content": logprob_content([event.token_id], [event.logprob], [event.top_logprobs], token_text)
                }
            yield chunk(event.index, {"content": delta}, None, logprobs)
            event = await anext(events)
    except Exception as exc:
        log.exception("streaming call %s failed", call_id)
        yield f"data: {json.dumps(error_body(str(exc), 'server_error'))}\n\n"
    yield "data: [DONE]\n\n"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ())]
        loc = loc[1:] if loc and loc[0] in ("body", "path", "query") else loc
        if first.get("type") == "json_invalid":
            return JSONResponse(
                error_body(
                    f"the request body is not valid JSON: {first.get('msg')}",
                    "invalid_request_error",
                    None,
                    "invalid_json",
                ),
                400,
            )
        param = _param_path(loc)
        message = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
        return JSONResponse(error_body(message, "invalid_request_error", param, "invalid_value"), 400)

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, "invalid_request_error", exc.param, exc.code), 400)

    @app.exception_handler(ModelNotFoundError)
    async def not_found(_: Request, exc: ModelNotFoundError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, "invalid_request_error", exc.param, "model_not_found"), 404)

    @app.exception_handler(AdapterError)
    async def bad_adapter(_: Request, exc: AdapterError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error", "path", "invalid_adapter"), 400)

    @app.exception_handler(EngineNotReadyError)
    async def not_ready(_: Request, exc: EngineNotReadyError) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc), "service_unavailable", None, "loading"), 503, headers={"retry-after": "2"}
        )

    @app.exception_handler(ServiceBusyError)
    async def busy(_: Request, exc: ServiceBusyError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "rate_limit_error", None, "busy"), 429, headers={"retry-after": "5"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), 500)


def _param_path(loc: list[str]) -> str | None:
    """``["messages", "0", "role"]`` -> ``"messages[0].role"``; drops pydantic's union-branch labels."""
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif part.startswith(("function-after", "function-before", "literal[", "str", "list[", "dict[")):
            continue
        else:
            out += f".{part}" if out else part
    return out or None
