"""``POST /v1/chat/completions``, streaming or not: prompts rendered once for every engine, every completion token
with its ``token_id`` inside ``logprobs.content[i]``, and the call named in the ``x-langgraph-art-call-id`` header."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse

from langgraph_art.errors import ModelNotFoundError
from langgraph_art.serve.chat import PromptCache, StreamedText, TokenText, assistant_message, logprob_content
from langgraph_art.serve.engines.base import Engine, FinishedEvent, GenerationRequest, GenerationResult
from langgraph_art.serve.protocol import ChatCompletionRequest, error_body
from langgraph_art.types import ModelRef

log = logging.getLogger(__name__)
CALL_ID_HEADER = "x-langgraph-art-call-id"


def completions_router(engine: Engine, ready: Callable[[], TokenText], policies: set[str]) -> APIRouter:
    router = APIRouter()
    prompts = PromptCache()

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        token_text = ready()
        body.check_supported()
        adapter = resolve_adapter(engine, body.model, policies)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        prompt = prompts.render(engine.tokenizer, body.template_messages(), tools)
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

    return router


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
