"""``POST /v1/completions``, for scoring: the logprob of each token of a prompt of token ids, given the tokens before
it, under a served model (a teacher's logprobs of a student's sampled tokens). The request and the response are
vLLM's ``prompt_logprobs`` extension of OpenAI's completions API, so one client reads this server and a vLLM server:

    {"model": "project/teacher@3", "prompt": [1, 2, 3, ...], "max_tokens": 0, "prompt_logprobs": 0,
     "temperature": 0.7, "prompt_logprobs_start": 40}

answers ``choices[0].prompt_logprobs``: ``null`` for each token before ``prompt_logprobs_start`` (ours; default 1,
vLLM's: every token but the first), then ``{"<token id>": {"logprob": ..., "rank": null, "decoded_token": ...}}``
for each token. Only scoring is served here (``max_tokens`` 0, nothing generated: generate with
``/v1/chat/completions``), and only each token's own logprob (``prompt_logprobs`` 0).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from langgraph_art.errors import RequestError
from langgraph_art.serve.engines.base import Engine, Scorer, ScoreRequest
from langgraph_art.serve.routes.completions import resolve_adapter


class ScoreBody(BaseModel):
    """The completions request, as far as scoring reads it (other OpenAI fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: list[int] = Field(min_length=2)
    max_tokens: int = 0
    prompt_logprobs: int | None = None
    prompt_logprobs_start: int = 1
    temperature: float = 1.0


def scoring_router(engine: Engine, ready: Callable[[], Any], policies: set[str]) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(body: ScoreBody) -> dict[str, Any]:
        ready()  # 503 while loading
        if body.max_tokens != 0 or body.prompt_logprobs != 0:
            raise RequestError(
                "this server's /v1/completions scores a prompt of token ids only: send max_tokens=0 and "
                "prompt_logprobs=0 (each token's own logprob); to generate, use /v1/chat/completions",
                "max_tokens" if body.max_tokens != 0 else "prompt_logprobs",
            )
        if not isinstance(engine, Scorer):
            raise RequestError(f"the {type(engine).__name__} engine does not score token ids", "prompt")
        vocab = len(engine.tokenizer)
        outside = next((t for t in body.prompt if not 0 <= t < vocab), None)
        if outside is not None:
            raise RequestError(f"token id {outside} is not in this model's vocabulary (0..{vocab - 1})", "prompt")
        adapter = resolve_adapter(engine, body.model, policies)
        request = ScoreRequest(body.prompt, body.prompt_logprobs_start, adapter, body.temperature)
        logprobs = await engine.score(request)
        tokenizer = engine.tokenizer
        scored = [
            {str(token): {"logprob": value, "rank": None, "decoded_token": tokenizer.decode([token])}}
            for token, value in zip(body.prompt[request.start :], logprobs, strict=True)
        ]
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": "length",
                    "prompt_logprobs": [None] * request.start + scored,
                }
            ],
            "usage": {"prompt_tokens": len(body.prompt), "completion_tokens": 0, "total_tokens": len(body.prompt)},
        }

    return router
