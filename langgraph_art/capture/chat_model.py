"""``ChatART``: a drop-in LangChain chat model serving the current policy, built on langchain-openai's ChatOpenAI.

It talks to the langgraph-art service (or any OpenAI-compatible server), always asks for logprobs and token ids,
and records each of its calls in its ``recorder`` so that calls which callbacks never see are not lost.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages import content as content_types
from langchain_core.messages.block_translators import openai as openai_blocks
from langchain_core.messages.block_translators import register_translator
from langchain_core.outputs import ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_openai import ChatOpenAI
from pydantic import Field, model_validator

from langgraph_art.capture.http import loop_safe_async_client, replica_clients
from langgraph_art.capture.messages import to_openai_messages
from langgraph_art.capture.recorder import (
    ART_LLM_TYPE,
    TurnRecorder,
    build_turns,
    call_id_of,
    choices_of,
    policy_step,
)
from langgraph_art.errors import ConfigError
from langgraph_art.types import ModelRef

log = logging.getLogger(__name__)
ENV_BASE_URL = "LANGGRAPH_ART_BASE_URL"
ENV_API_KEY = "LANGGRAPH_ART_API_KEY"


PROVIDER = "langgraph_art"  # ChatART's messages' model_provider: OpenAI's content blocks, and the reasoning block


def _blocks(message: AIMessage) -> list[content_types.ContentBlock]:
    """A ChatART message's standard content blocks: langchain-openai's, after a ``reasoning`` block for the
    thinking the service's reasoning parser split off (``additional_kwargs["reasoning_content"]``, vLLM's field)."""
    blocks = openai_blocks.translate_content(message)
    return [*_reasoning(message), *blocks]


def _chunk_blocks(message: AIMessageChunk) -> list[content_types.ContentBlock]:
    return [*_reasoning(message), *openai_blocks.translate_content_chunk(message)]


def _reasoning(message: AIMessage) -> list[content_types.ContentBlock]:
    thinking = message.additional_kwargs.get("reasoning_content")
    return [{"type": "reasoning", "reasoning": thinking}] if isinstance(thinking, str) else []


register_translator(PROVIDER, _blocks, _chunk_blocks)


def sampled_token_ids(message: BaseMessage, model: str) -> list[int] | None:
    """The ids a ChatART answer of served model ``model`` (at any checkpoint) was sampled as: its logprobs'
    ``token_id``s, closing tokens included. None for any other message: another model's answer (another vocabulary,
    a supervisor reading a worker's history) goes as text, for the template to render."""
    if not isinstance(message, AIMessage) or message.response_metadata.get("model_provider") != PROVIDER:
        return None
    served = message.response_metadata.get("model_name")
    if not isinstance(served, str) or ModelRef.parse(served).name != ModelRef.parse(model).name:
        return None
    entries = (message.response_metadata.get("logprobs") or {}).get("content") or []
    ids = [int(e["token_id"]) for e in entries if isinstance(e, dict) and isinstance(e.get("token_id"), int)]
    return ids if ids and len(ids) == len(entries) else None  # every token's id, or none sent


class ChatART(ChatOpenAI):
    """A LangChain chat model backed by the langgraph-art inference service.

    ``ChatART(model=trainable_model)`` serves the trainable model's current policy (its latest checkpoint);
    ``ChatART(base_url="http://host:8000/v1", model="agent@12")`` talks to any OpenAI-compatible server and pins
    a checkpoint. Everything ChatOpenAI supports keeps working: ``bind_tools``, ``with_structured_output``,
    ``invoke``/``ainvoke``/``stream``/``astream``/``batch``, retries and callbacks. Every call asks for logprobs and
    token ids and is recorded, so a ``Trainer`` (or a ``TrajectoryCallbackHandler``) can train on it.
    ``with_step(12)`` pins a checkpoint, ``with_step(None)`` follows the latest again.

    Args:
        model: A ``TrainableModel`` registered with a backend (its URL, key and served name come from there), or a
            served name: ``"project/name"`` (the latest checkpoint), ``"project/name@12"``, a base model's name.
        base_url: The server, ``http://host:8000/v1`` (with a ``TrainableModel``: its backend's; else
            ``$LANGGRAPH_ART_BASE_URL`` or ``$OPENAI_BASE_URL``).
        api_key: The server's key (with a ``TrainableModel``: its backend's; else ``$LANGGRAPH_ART_API_KEY``,
            ``$OPENAI_API_KEY``, or any value for a server started without one).
        temperature: Sampling temperature (the field's default is ChatART's own; None sends none, and the server
            samples at 1.0).
        max_tokens: Tokens per answer at most (None: up to the end of the context).
        trainable: False records this model's calls as context only (never trained on): a judge or a helper
            model inside the graph.
        recorder: ChatART's own log of its calls (with a ``TrainableModel``: the model's ``recorder``, shared by all
            its ChatARTs); a ``TrajectoryCallbackHandler(recorders=[...])`` adopts calls callbacks never saw.
        base_urls: Several servers of the same policy (replicas, e.g. ``RemoteBackend(replicas=[...])``): calls go
            to each in turn, and one that refuses the connection is skipped; ``base_url`` is the first.
        **kwargs: Any other ``ChatOpenAI`` argument (``max_retries``, ``timeout``, ``top_p``, ``stop``...).

    Raises:
        ConfigError: Nowhere to send the calls (no ``base_url``, no backend), or a ``model`` of another type.

    Example:
        ```python
        llm = art.ChatART(model=model, max_tokens=256)   # the latest checkpoint of a TrainableModel
        graph = create_agent(model=llm, tools=[get_weather])
        pinned = llm.with_step(12)                       # checkpoint 12, served as "project/name@12"
        ```
    """

    use_responses_api: bool | None = False
    logprobs: bool | None = True
    stream_usage: bool | None = True
    temperature: float | None = 0.7
    """Sampling temperature; 0.7, not the server's 1.0 (ChatOpenAI's None): at 1.0 a small model's tool arguments
    are noise and GRPO learns little (benchmarks/README.md, issue 35). None sends none: the server's default."""
    trainable: bool = True
    """False records this model's calls as context only (never trained on)."""
    recorder: TurnRecorder | None = Field(default_factory=TurnRecorder, exclude=True)
    """ChatART's own log of its calls; give it to a ``TrajectoryCallbackHandler`` (``recorders=[...]``)."""
    base_urls: list[str] | None = None
    """Several servers of the same policy (replicas, e.g. ``RemoteBackend(replicas=[...])``): calls go to each in
    turn, and one that refuses the connection is skipped; ``base_url`` is the first."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Variables for the served model's chat template (vLLM's request field), e.g. ``{"enable_thinking": False}``
    for Qwen3: sent with every call."""
    resend_token_ids: bool = False
    """Send each earlier answer of this served model back with the token ids it sampled (``token_ids`` on the
    message): the server's next prompt continues those tokens instead of the chat template's rendering of the
    message, so the model sees what it wrote and a run's turns train as one sequence, on the tokens sampled
    (``serve/continuation.py``), where a model writes calls unlike its template (Qwen2.5-Coder). Off by default for
    now: it changes what the model sees, and the untrained Qwen2.5-Coder-0.5B, greedy, repeats a call it sees in its
    own writing where it answers after the template's (docs/guides/agents.md). The ids stand for the message: edit an
    answer's text and drop its ``response_metadata["logprobs"]`` too."""
    in_process: Any = Field(default=None, exclude=True)
    """Set by a ``LocalBackend``: its server answers this model's non-streaming calls in this process, without
    the openai SDK (``serve/inprocess/``: an endpoint with ``wrap``, ``wraps`` and ``through_sdk``). None sends
    every call through the SDK."""

    @model_validator(mode="before")
    @classmethod
    def _resolve_served_model(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        values = dict(values)
        model = values.get("model", values.get("model_name"))
        settings = getattr(model, "chat_model_settings", None)
        if callable(settings):  # a TrainableModel (or anything serving one): it knows its URL and name
            values.pop("model_name", None)
            served = settings()
            values["model"] = served["model"]
            own_url = values.get("base_url") or values.get("openai_api_base")
            if not own_url or own_url == served["base_url"]:  # a server in this process: no sockets (inprocess.py)
                own_clients = any(
                    values.get(key) for key in ("client", "async_client", "http_client", "http_async_client")
                )
                for key in ("http_client", "http_async_client"):
                    if served.get(key) is not None and not values.get(key):
                        values[key] = served[key]
                if not own_clients and values.get("in_process") is None:  # the user's own clients see every call
                    values["in_process"] = served.get("in_process")
            values.setdefault("base_url", served["base_url"])
            if served.get("base_urls") and not values.get("base_urls"):
                values["base_urls"] = served["base_urls"]
            values.setdefault("api_key", served.get("api_key") or "unused")
            if served.get("recorder") is not None:
                values.setdefault("recorder", served["recorder"])
        elif model is not None and not isinstance(model, str):
            raise ConfigError(f"ChatART(model=...) takes a model name or a TrainableModel, got {type(model).__name__}")
        if values.get("base_urls"):
            spread_over_replicas(values)
        if not (values.get("base_url") or values.get("openai_api_base")) and os.environ.get(ENV_BASE_URL):
            values["base_url"] = os.environ[ENV_BASE_URL]
        if not (values.get("base_url") or values.get("openai_api_base") or os.environ.get("OPENAI_BASE_URL")):
            raise ConfigError(
                "ChatART needs to know where the model is served: pass base_url='http://127.0.0.1:8000/v1' (a "
                f"`langgraph-art serve`) or set {ENV_BASE_URL}, or pass model=<TrainableModel registered with a "
                "backend>"
            )
        own_async = ("http_async_client", "async_client", "openai_proxy")
        if not any(values.get(key) for key in own_async) and not os.environ.get("OPENAI_PROXY"):
            # langchain-openai's shared async client is bound to the first event loop that used it
            values["http_async_client"] = loop_safe_async_client()
        if not (values.get("api_key") or values.get("openai_api_key")):
            # the service's own key variable first; a local service started without a key accepts anything
            values["api_key"] = os.environ.get(ENV_API_KEY) or os.environ.get("OPENAI_API_KEY") or "unused"
        return values

    @model_validator(mode="after")
    def _answer_in_process(self) -> ChatART:
        """Wrap the SDK resources ChatOpenAI built (its own validator ran first) when a local server answers."""
        if self.in_process is not None:
            if self.client is not None:
                self.client = self.in_process.wrap(self.client)
            if self.async_client is not None:
                self.async_client = self.in_process.wrap(self.async_client)
        return self

    @property
    def _llm_type(self) -> str:
        return ART_LLM_TYPE

    def _resolve_model_profile(self) -> ModelProfile | None:
        """What the langgraph-art service does for every model it serves: tools, forced tool choice and structured
        output by constrained decoding (so LangChain's ``create_agent(response_format=Schema)`` asks for the answer
        as a JSON-schema response format, not through an extra tool)."""
        return ModelProfile(tool_calling=True, tool_choice=True, structured_output=True, text_inputs=True)

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: Literal["function_calling", "json_mode", "json_schema"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        tools: list | None = None,
        **kwargs: Any,
    ) -> Any:
        """ChatOpenAI's, except that ``method="json_mode"`` with a schema sends it along
        (``response_format={"type": "json_object", "schema": ...}``, the extension llama.cpp and Together accept):
        the service then constrains the JSON to the schema, so the parsed result validates, not just any object."""
        if method == "json_mode" and schema is not None and "response_format" not in kwargs:
            kwargs["response_format"] = {"type": "json_object", "schema": convert_to_json_schema(schema)}
        return super().with_structured_output(
            schema, method=method, include_raw=include_raw, strict=strict, tools=tools, **kwargs
        )

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langgraph_art", "capture", "chat_model"]

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """False: langchain-core's ``load`` only rebuilds classes on its own allow-list, which third-party chat
        models cannot join, so a ChatART would serialize but never load back."""
        return False

    @property
    def policy_step(self) -> int | None:
        """The pinned checkpoint step (``model="agent@12"`` -> 12); None follows the latest."""
        return policy_step(self.model_name)

    def with_step(self, step: int | None) -> ChatART:
        """A copy pinned to checkpoint ``step`` (``None``: follow the latest again)."""
        if step is not None and (not isinstance(step, int) or step < 0):
            raise ConfigError(f"step must be a non-negative int or None, got {step!r}")
        return self.model_copy(update={"model_name": str(ModelRef.parse(self.model_name).at(step))})

    @property
    def _default_params(self) -> dict[str, Any]:
        params = super()._default_params
        params["logprobs"] = True  # training needs every sampled token's logprob and id: never optional
        params["extra_body"] = {**(params.get("extra_body") or {}), "return_token_ids": True}
        if self.chat_template_kwargs is not None:
            params["extra_body"]["chat_template_kwargs"] = self.chat_template_kwargs
        return params

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if self.resend_token_ids and isinstance(payload.get("messages"), list):
            messages = self._convert_input(input_).to_messages()
            if len(messages) == len(payload["messages"]):
                for message, item in zip(messages, payload["messages"], strict=True):
                    ids = sampled_token_ids(message, self.model_name)
                    if ids is not None:
                        item["token_ids"] = ids
        return payload

    def _create_chat_result(self, response: Any, generation_info: dict | None = None) -> ChatResult:
        result = super()._create_chat_result(response, generation_info)
        body = response if isinstance(response, dict) else response.model_dump(warnings=False)
        choices = body.get("choices") or []
        for generation, choice in zip(result.generations, choices, strict=False):
            # ChatOpenAI shares one generation_info dict between choices (n > 1 would all carry the last
            # choice's logprobs): give each generation its own.
            info = dict(generation.generation_info or {})
            info["logprobs"] = choice.get("logprobs")
            info["finish_reason"] = choice.get("finish_reason")
            if body.get("prompt_token_ids") is not None:
                info["prompt_token_ids"] = body["prompt_token_ids"]
            if body.get("grammar") is not None:  # structured output: what the trainer recomputes the logprobs under
                info["grammar"] = body["grammar"]
                info["closing_tokens"] = choice.get("closing_tokens") or 0
            if choice.get("unparsed_tool_calls"):  # call-like text the server's parser could not read
                info["unparsed_tool_calls"] = choice["unparsed_tool_calls"]
            reasoning = (choice.get("message") or {}).get("reasoning_content")
            if reasoning is not None:  # thinking: LangChain's reasoning content block, never the text
                generation.message.additional_kwargs["reasoning_content"] = reasoning
            generation.message.response_metadata["model_provider"] = PROVIDER
            generation.generation_info = info
        if isinstance(response, dict) and result.generations and choices and "refusal" in choices[0]["message"]:
            # an in-process answer is a dict; from a parsed response langchain-openai copies this one field
            result.generations[0].message.additional_kwargs["refusal"] = choices[0]["message"]["refusal"]
        return result

    def _convert_chunk_to_generation_chunk(
        self, chunk: dict, default_chunk_class: type, base_generation_info: dict | None
    ) -> ChatGenerationChunk | None:
        result = super()._convert_chunk_to_generation_chunk(chunk, default_chunk_class, base_generation_info)
        raw = (chunk.get("chunk") if chunk.get("type") == "chunk" else chunk) or {}  # the SDK's structured stream
        choices = raw.get("choices") or []
        if result is None or not choices:
            return result
        info = dict(result.generation_info or {})
        if (choices[0].get("delta") or {}).get("role"):
            # langchain-openai drops the completion id of streamed chunks; keep it (once: equal strings in
            # generation_info are concatenated when chunks merge) so the turn knows its call id.
            if isinstance(raw.get("id"), str):
                info["call_id"] = raw["id"].removeprefix("chatcmpl-")
            for key in ("prompt_token_ids", "grammar"):
                if raw.get(key) is not None:
                    info[key] = raw[key]
        if choices[0].get("closing_tokens") is not None:  # on the last chunk of a structured choice
            info["closing_tokens"] = choices[0]["closing_tokens"]
        if choices[0].get("unparsed_tool_calls"):
            info["unparsed_tool_calls"] = choices[0]["unparsed_tool_calls"]
        reasoning = (choices[0].get("delta") or {}).get("reasoning_content")
        if reasoning is not None:
            result.message.additional_kwargs["reasoning_content"] = reasoning
        if result.message.response_metadata.get("model_provider") == "openai":
            result.message.response_metadata["model_provider"] = PROVIDER
        result.generation_info = info or None
        return result

    # -- recording this model's own calls --------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        start = time.time()
        result = super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        self._record(messages, stop, kwargs, _as_llm_result(result), run_manager, start)
        return result

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        start = time.time()
        result = await self._agenerate_in_process(messages, stop, kwargs)
        if result is None:
            with self.in_process.through_sdk() if self.in_process is not None else contextlib.nullcontext():
                # refused in process (or not for it): the endpoint is not asked twice
                result = await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
        self._record(messages, stop, kwargs, _as_llm_result(result), run_manager, start)
        return result

    async def _agenerate_in_process(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> ChatResult | None:
        """langchain-openai's ``_agenerate`` for a call the in-process endpoint answers, with the result built on
        the event loop: langchain-openai builds it in a worker thread, and that hop (a thread and the GIL to wait
        for, while the engine decodes) cost 16 runs of 3 calls about a tenth of their throughput. None: the call
        takes langchain-openai's own path (an error is replayed there, so it raises as it always does)."""
        if self.in_process is None or not self.in_process.wraps(self.async_client):
            return None
        payload = self._get_request_payload(messages, stop=stop, **kwargs)
        if "response_format" in payload or self._use_responses_api(payload):
            return None
        raw = await self.async_client.with_raw_response.answer(payload)
        if raw is None:
            return None
        generation_info = {"headers": dict(raw.headers)} if self.include_response_headers else {}
        return self._create_chat_result(raw.parse(), generation_info)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        start, merged = time.time(), None
        for chunk in super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs):
            merged = chunk if merged is None else merged + chunk
            yield chunk
        if merged is not None:
            self._record(messages, stop, kwargs, LLMResult(generations=[[merged]]), run_manager, start)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        start, merged = time.time(), None
        async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs):
            merged = chunk if merged is None else merged + chunk
            yield chunk
        if merged is not None:
            self._record(messages, stop, kwargs, LLMResult(generations=[[merged]]), run_manager, start)

    def _record(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        result: LLMResult,
        run_manager: Any,
        start: float,
    ) -> None:
        if self.recorder is None:
            return
        try:
            metadata = dict(getattr(run_manager, "metadata", None) or {})
            run_id = str(run_manager.run_id) if run_manager is not None else None
            invocation = {**self._default_params, **kwargs, "stop": stop}
            end = time.time()
            build = functools.partial(
                build_turns,
                invocation=invocation,
                metadata=metadata,
                start_time=start,
                end_time=end,
                trainable=self.trainable,
                run_id=run_id,
            )
            self.recorder.record(
                call_id_of(result),
                metadata,
                start,
                lambda: build(messages=to_openai_messages(messages), choices=choices_of(result, invocation)),
            )
        except Exception:
            log.exception("ChatART could not record a call (the call itself succeeded)")

    # -- pickling: a ChatART travels as its settings (to Ray workers, to another process) ------------------
    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the plain settings (every field but those bound to this process, so fields added later
        travel too): the copy talks over HTTP to ``base_url`` with its own clients, never in process, and records
        its calls in ``ChatART.unpickled_recorder()``. A ``LocalBackend``'s service listens on a loopback port
        (reachable from processes on this machine); on other machines point it at a reachable ``langgraph-art
        serve``."""
        bound = {"client", "async_client", "root_client", "root_async_client", "http_client", "http_async_client",
                 "in_process", "recorder"}  # fmt: skip
        settings = {
            (field.alias or name): getattr(self, name)
            for name, field in type(self).model_fields.items()
            if name not in bound
        }
        return (type(self)._from_pickle, (settings,))

    @classmethod
    def _from_pickle(cls, settings: dict[str, Any]) -> ChatART:
        return cls(**settings, recorder=cls.unpickled_recorder())

    @staticmethod
    @functools.cache
    def unpickled_recorder() -> TurnRecorder:
        """The recorder of every ChatART rebuilt from a pickle in this process (as ``TrainableModel.recorder`` is
        shared by its ChatARTs): give it to the handler (``recorders=[...]``) of runs in this process."""
        return TurnRecorder()


def spread_over_replicas(values: dict[str, Any]) -> None:
    """ChatART settings with ``base_urls``: ``base_url`` is the first, the clients take them in turn."""
    urls = [str(url).rstrip("/") for url in values["base_urls"]]
    if any(values.get(key) for key in ("client", "async_client", "http_client", "http_async_client")):
        raise ConfigError("ChatART(base_urls=[...]) brings its own HTTP clients: drop http_client/http_async_client")
    own = values.get("base_url") or values.get("openai_api_base")
    if own and str(own).rstrip("/") != urls[0]:
        raise ConfigError(f"base_url={own!r} is not the first of base_urls={urls}: give base_urls alone")
    values.pop("openai_api_base", None)
    values["base_url"], values["base_urls"] = urls[0], urls
    values["http_client"], values["http_async_client"] = replica_clients(urls)


def _as_llm_result(result: ChatResult) -> LLMResult:
    return LLMResult(generations=[list(result.generations)], llm_output=result.llm_output)
