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


class ChatCompletions:
    """The chat completions endpoint: ``router()`` serves it over HTTP; ``complete`` answers a non-streaming
    request as the route does (the in-process client of ``inprocess.py`` calls it directly)."""

    def __init__(self, engine: Engine, ready: Callable[[], TokenText], policies: set[str]) -> None:
        self.engine, self.ready, self.policies = engine, ready, policies
        self.prompts = PromptCache()

    def prepare(self, body: ChatCompletionRequest) -> tuple[TokenText, GenerationRequest]:
        """Check the request and render its prompt; the errors are the route's (400, 404, 503)."""
        token_text = self.ready()
        body.check_supported()
        adapter = resolve_adapter(self.engine, body.model, self.policies)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        prompt = self.prompts.render(self.engine.tokenizer, body.template_messages(), tools)
        return token_text, GenerationRequest(prompt, body.sampling_params(), adapter, uuid.uuid4().hex)

    async def complete(self, body: ChatCompletionRequest) -> tuple[dict[str, Any], dict[str, str]]:
        """The response body and headers of a non-streaming request."""
        token_text, request = self.prepare(body)
        result = await self.engine.generate(request)
        return _completion(body, result, token_text, request.request_id), {CALL_ID_HEADER: request.request_id}

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.post("/v1/chat/completions")
        async def chat_completions(body: ChatCompletionRequest) -> Any:
            if not body.stream:
                response, headers = await self.complete(body)
                return JSONResponse(response, headers=headers)
            token_text, request = self.prepare(body)
            call_id = request.request_id
            events = self.engine.stream(request)
            first = await anext(aiter(events))  # errors before the first token still become proper 4xx/5xx
            served = request.adapter or body.model
            return StreamingResponse(
                _sse(body, events, first, self.engine, token_text, call_id, request.prompt_token_ids, served),
                media_type="text/event-stream",
                headers={CALL_ID_HEADER: call_id},
            )

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
    """The response body, with the null fields OpenAI's API sends (``refusal``, ``system_fingerprint``, token
    details): the openai SDK fills them in when it parses the JSON, and the in-process client hands this dict
    to langchain-openai as it is, so both paths give the same message."""
    choices = []
    for sample in result.samples:
        message, finish = assistant_message(sample, body.tools_enabled())
        choice: dict[str, Any] = {
            "index": sample.index,
            "message": {**message, "refusal": None},
            "finish_reason": finish,
            "logprobs": None,
        }
        if body.logprobs:
            content = logprob_content(sample.token_ids, sample.logprobs, sample.top_logprobs, token_text)
            choice["logprobs"] = {"content": content, "refusal": None}
        if body.return_token_ids:
            choice["token_ids"] = sample.token_ids
        choices.append(choice)
    completion_tokens = sum(len(s.token_ids) for s in result.samples)
    usage = _usage(len(result.prompt_token_ids), completion_tokens)
    response = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.adapter or body.model,  # the adapter that answered: "agent" resolves to "agent@7"
        "choices": choices,
        "system_fingerprint": None,
        "usage": {**usage, "prompt_tokens_details": None, "completion_tokens_details": None},
    }
    if body.return_token_ids:  # a copy: the prompt's list may be the prompt cache's own
        response["prompt_token_ids"] = list(result.prompt_token_ids)
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
