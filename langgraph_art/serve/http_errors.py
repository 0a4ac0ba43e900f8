"""Every error the service answers in OpenAI's error JSON: 400 naming the field (``param``), 404 unknown model or
adapter, 429 busy, 503 loading, 500 (logged) for anything unexpected."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from langgraph_art.errors import (
    AdapterError,
    EngineNotReadyError,
    ModelNotFoundError,
    RequestError,
    ServiceBusyError,
)
from langgraph_art.serve.protocol import error_body

log = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
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
