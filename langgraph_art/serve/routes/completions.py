"""``POST /v1/chat/completions``, streaming or not: prompts rendered once for every engine, every completion token
with its ``token_id`` inside ``logprobs.content[i]``, and the call named in the ``x-langgraph-art-call-id`` header.

Structured output and forced tool calls (``serve/structured.py``) become a grammar the engine samples under; a
sample the budget cut short is closed (``serve/closing.py``). With ``return_token_ids`` the response also carries
the grammar (``"grammar"``, beside ``prompt_token_ids``) and each choice its ``closing_tokens``: what the trainer
needs to recompute the turn's logprobs under the same mask.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse

from langgraph_art.errors import ModelNotFoundError, RequestError
from langgraph_art.models.templates import renders_tools
from langgraph_art.serve.chat import PromptCache, StreamedText, TokenText, logprob_content
from langgraph_art.serve.closing import HOLD, close_result, needs_closing
from langgraph_art.serve.engines.base import (
    Engine,
    FinishedEvent,
    GenerationRequest,
    GenerationResult,
    Sample,
    token_budget,
)
from langgraph_art.serve.parsers.reply import FirstCall, ReplyReader
from langgraph_art.serve.protocol import ChatCompletionRequest, error_body
from langgraph_art.serve.structured import ToolCallFormat, request_constraint
from langgraph_art.types import ModelRef

log = logging.getLogger(__name__)
CALL_ID_HEADER = "x-langgraph-art-call-id"


class ChatCompletions:
    """The chat completions endpoint: ``router()`` serves it over HTTP; ``complete`` answers a non-streaming
    request as the route does (the in-process client of ``inprocess.py`` calls it directly)."""

    def __init__(
        self,
        engine: Engine,
        ready: Callable[[], TokenText],
        policies: set[str],
        tool_call_parser: str = "auto",
        reasoning_parser: str | None = "auto",
    ) -> None:
        self.engine, self.ready, self.policies = engine, ready, policies
        self.prompts = PromptCache()
        self._parsers = (tool_call_parser, reasoning_parser)
        self._reader: ReplyReader | None = None  # chosen once the engine's tokenizer is loaded
        self._calls: tuple[ToolCallFormat | None] | None = None  # probed once, from the engine's chat template
        self._renders_tools: bool | None = None  # likewise: does the template write a request's tools at all
        self._grammars: Any = None  # the engine's, once a request asked for a grammar

    @property
    def reader(self) -> ReplyReader:
        """The engine's tool-call and reasoning parsers (``parsers/``), chosen from its template for ``"auto"``."""
        if self._reader is None:
            self._reader = ReplyReader(self.engine.tokenizer, *self._parsers)
        return self._reader

    def tool_call_format(self) -> ToolCallFormat | None:
        if self._calls is None:
            self._calls = (ToolCallFormat.probe(self.engine.tokenizer),)
        return self._calls[0]

    def stats(self) -> dict[str, float]:
        """The parsers' counters (``tool_calls_parsed``, ``tool_calls_unparsed``) and the prompts that continued
        earlier answers' sampled ids (``prompts_continued``, ``prompts_rerendered``) for ``/metrics``."""
        return {**(self.reader.stats() if self._reader is not None else {}), **self.prompts.counts}

    def check_tools_rendered(self, body: ChatCompletionRequest) -> None:
        """A request whose tools the chat template would drop is refused: the model would never see them."""
        if not body.tools or body.tool_choice == "none":
            return
        if self._renders_tools is None:
            self._renders_tools = renders_tools(self.engine.tokenizer)
        if not self._renders_tools:
            raise RequestError(
                "this model's chat template does not write tools into the prompt, so the model would never see them "
                "(SmolLM2's own template, for one). Serve it with a chat_template that does: "
                "TrainableModel(..., chat_template='chatml-tools') or LocalBackend(chat_template=...), "
                "`langgraph-art serve --chat-template chatml-tools` (or a .jinja file); or send no tools",
                "tools",
                code="chat_template_drops_tools",
            )

    async def prepare(self, body: ChatCompletionRequest) -> tuple[TokenText, GenerationRequest]:
        """Check the request and render its prompt; the errors are the route's (400, 404, 503)."""
        token_text = self.ready()
        body.check_supported()
        self.check_tools_rendered(body)
        adapter = resolve_adapter(self.engine, body.model, self.policies)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        prompt = self.prompts.render(
            self.engine.tokenizer, body.template_messages(), tools, body.chat_template_kwargs, body.sampled_ids()
        )
        request = GenerationRequest(prompt, body.sampling_params(), adapter, uuid.uuid4().hex)
        constraint = request_constraint(body, self.tool_call_format())
        if constraint is not None:
            request.grammar = constraint.grammar
            if self._grammars is None:  # llguidance's view of the tokenizer: ~1 s to build on a 150k vocabulary
                self._grammars = await asyncio.to_thread(self.engine.grammars)
            if not self._grammars.compiled(constraint.grammar):  # a GRPO group asks for one grammar: checked once
                await asyncio.to_thread(self._grammars.check, constraint.grammar, constraint.schemas)
        return token_text, request

    async def complete(self, body: ChatCompletionRequest) -> tuple[dict[str, Any], dict[str, str]]:
        """The response body and headers of a non-streaming request."""
        token_text, request = await self.prepare(body)
        result = await self.close(request, await self.engine.generate(request))
        completion = _completion(body, result, token_text, request.request_id, request.grammar, self.reader)
        return completion, {CALL_ID_HEADER: request.request_id}

    async def close(
        self, request: GenerationRequest, result: GenerationResult, sent: list[int] | None = None
    ) -> GenerationResult:
        """``result`` with the samples the budget cut short in the middle of their grammar completed (``closing``)."""
        if not needs_closing(result, request.grammar):
            return result
        assert request.grammar is not None
        budget = token_budget(request, self.engine.max_model_len)
        grammars, tokenizer = self._grammars or self.engine.grammars(), self.engine.tokenizer
        return await asyncio.to_thread(close_result, result, request.grammar, budget, grammars, tokenizer, sent)

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.post("/v1/chat/completions")
        async def chat_completions(body: ChatCompletionRequest) -> Any:
            if not body.stream:
                response, headers = await self.complete(body)
                return JSONResponse(response, headers=headers)
            token_text, request = await self.prepare(body)
            events = self.engine.stream(request)
            first = await anext(aiter(events))  # errors before the first token still become proper 4xx/5xx
            return _ClosingStreamingResponse(
                _sse(body, request, events, first, self, token_text),
                media_type="text/event-stream",
                headers={CALL_ID_HEADER: request.request_id},
            )

        return router


class _ClosingStreamingResponse(StreamingResponse):
    """Starlette leaves the body's generator open when a send fails (a reset socket; a caller gone): closing it here
    ends the engine's rows at once, where they would otherwise decode to their budget until garbage collection."""

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


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


def tool_names(body: ChatCompletionRequest) -> list[str] | None:
    """The names of the tools a reply may call: None when it may call none (no tools, ``tool_choice="none"``)."""
    return [tool.function.name for tool in body.tools or []] if body.tools_enabled() else None


def one_call(body: ChatCompletionRequest) -> bool:
    """True when the reply must hold at most one call (``parallel_tool_calls=false``, tools in play)."""
    return body.tools_enabled() and body.parallel_tool_calls is False


def replies(body: ChatCompletionRequest, result: GenerationResult, reader: ReplyReader) -> list[Sample]:
    """``result``'s samples as they are answered: each ending with its first call when ``one_call``."""
    if not one_call(body):
        return result.samples
    names = tool_names(body) or []
    return [reader.first_call(sample, names) for sample in result.samples]


def _completion(
    body: ChatCompletionRequest,
    result: GenerationResult,
    token_text: TokenText,
    call_id: str,
    grammar: str | None,
    reader: ReplyReader,
) -> dict[str, Any]:
    """The response body, with the null fields OpenAI's API sends (``refusal``, ``system_fingerprint``, token
    details): the openai SDK fills them in when it parses the JSON, and the in-process client hands this dict
    to langchain-openai as it is, so both paths give the same message. With ``parallel_tool_calls=false`` each
    sample ends with its first call (``ReplyReader.first_call``)."""
    choices = []
    names = tool_names(body)
    samples = replies(body, result, reader)
    for sample in samples:
        reply = reader.read(sample, names)
        choice: dict[str, Any] = {
            "index": sample.index,
            "message": {**reply.message, "refusal": None},
            "finish_reason": reply.finish_reason,
            "logprobs": None,
        }
        if reply.unparsed:
            choice["unparsed_tool_calls"] = reply.unparsed
        if body.logprobs:
            content = logprob_content(sample.token_ids, sample.logprobs, sample.top_logprobs, token_text)
            choice["logprobs"] = {"content": content, "refusal": None}
        if body.return_token_ids:
            choice["token_ids"] = sample.token_ids
            if grammar is not None:
                choice["closing_tokens"] = sample.closing_tokens
        choices.append(choice)
    completion_tokens = sum(len(s.token_ids) for s in samples)
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
        if grammar is not None:
            response["grammar"] = grammar
    return response


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _sse(
    body: ChatCompletionRequest,
    request: GenerationRequest,
    events: AsyncIterator[Any],
    first: Any,
    completions: ChatCompletions,
    token_text: TokenText,
) -> AsyncIterator[str]:
    engine, call_id = completions.engine, request.request_id
    base = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.adapter or body.model,  # the adapter that answers: "agent" resolves to "agent@7"
    }
    tools = body.tools_enabled()
    reader, names = completions.reader, tool_names(body)
    texts = [StreamedText(reader, request.params.stop, tools) for _ in range(body.n)]
    sent = [0] * body.n  # tokens streamed per choice
    # parallel_tool_calls=false: a choice streams no token after the one that completes its first call
    first_calls = [FirstCall(reader, names or []) if one_call(body) else None for _ in range(body.n)]
    # a constrained choice's tokens in the last HOLD positions of its budget wait for its end: closing.py
    held_from = token_budget(request, engine.max_model_len) - HOLD if request.grammar is not None else None

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs, **extra}
        return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

    def token(index: int, token_id: int, logprob: float, top: list[tuple[int, float]]) -> str:
        sent[index] += 1
        delta = texts[index].push(token_id)
        entries = logprob_content([token_id], [logprob], [top], token_text) if body.logprobs else None
        return chunk(index, {"content": delta}, None, {"content": entries} if entries is not None else None)

    for i in range(body.n):
        opening = chunk(i, {"role": "assistant", "content": ""})
        if body.return_token_ids:  # vLLM puts the prompt ids on the first chunk; the grammar goes beside them
            ids: dict[str, Any] = {"prompt_token_ids": list(request.prompt_token_ids)}
            if request.grammar is not None:
                ids["grammar"] = request.grammar
            opening = opening.replace('"choices"', json.dumps(ids)[1:-1] + ', "choices"', 1)
        yield opening
    event = first
    try:
        while True:
            if isinstance(event, FinishedEvent):
                result = await completions.close(request, event.result, sent)
                samples = replies(body, result, reader)
                for sample in samples:
                    for j in range(sent[sample.index], len(sample.token_ids)):  # held back, or the closing
                        yield token(sample.index, sample.token_ids[j], sample.logprobs[j], sample.top_logprobs[j])
                    reply = reader.read(sample, names)
                    message = reply.message
                    if message.get("reasoning_content") is not None:
                        yield chunk(sample.index, {"reasoning_content": message["reasoning_content"]})
                    rest = texts[sample.index].rest(message.get("content"))
                    if rest:
                        yield chunk(sample.index, {"content": rest})
                    for k, call in enumerate(message.get("tool_calls", [])):
                        yield chunk(sample.index, {"tool_calls": [{"index": k, **call}]})
                    closing = request.grammar is not None and body.return_token_ids
                    extra = {"closing_tokens": sample.closing_tokens} if closing else {}
                    if reply.unparsed:
                        extra["unparsed_tool_calls"] = reply.unparsed
                    yield chunk(sample.index, {}, reply.finish_reason, **extra)
                if body.stream_options and body.stream_options.include_usage:
                    usage = _usage(len(result.prompt_token_ids), sum(len(s.token_ids) for s in samples))
                    yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
                break
            first_call = first_calls[event.index]
            if first_call is not None and first_call.done:
                pass  # past its first call: cut from the choice at the end, never streamed
            elif held_from is None or sent[event.index] < held_from:
                if first_call is not None:
                    first_call.push(event.token_id)
                yield token(event.index, event.token_id, event.logprob, event.top_logprobs)
            event = await anext(events)
    except Exception as exc:
        log.exception("streaming call %s failed", call_id)
        yield f"data: {json.dumps(error_body(str(exc), 'server_error'))}\n\n"
    finally:
        close = getattr(events, "aclose", None)  # an engine's generator: its rows end now, however this stream ends
        if close is not None:
            await close()
    yield "data: [DONE]\n\n"
