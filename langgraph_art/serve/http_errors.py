"""Every error the service answers in OpenAI's error JSON, by the one table both sides read (``errors.HTTP_ERRORS``):
400 naming the field (``param``), 404 unknown model or adapter, 422 training aborted, 429 busy, 503 loading (both
with ``retry-after``), 500 (logged) for anything unexpected."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from langgraph_art.errors import RETRY_AFTER, AdapterError, LangGraphArtError, http_row
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

    @app.exception_handler(LangGraphArtError)
    async def known(_: Request, exc: LangGraphArtError) -> JSONResponse:
        """Every error of ours by its row of ``errors.HTTP_ERRORS`` (500 and logged for one not in it)."""
        status, kind, code = http_row(exc)
        if status == 500:
            log.error("unhandled error", exc_info=exc)
            return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", kind), 500)
        message = getattr(exc, "message", None) or str(exc)
        param = getattr(exc, "param", "path" if isinstance(exc, AdapterError) else None)
        wait = RETRY_AFTER.get(status)
        headers = {"retry-after": str(wait)} if wait else None
        return JSONResponse(error_body(message, kind, param, code), status, headers=headers)

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
