"""The OpenAI chat-completions wire format: request validation and response shapes (pydantic, no fastapi).

Fields we cannot honour without changing what the sampled logprobs mean (penalties, logit_bias) are refused
with a 400 naming the field instead of being silently ignored. ``response_format`` (JSON schema, JSON object) and
``tool_choice`` ("required", a named function) are enforced by constrained decoding (``structured.py``); the
response schema is parsed once per request (``schemas.py``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from langgraph_art.errors import RequestError
from langgraph_art.serve.engines.base import SamplingParams
from langgraph_art.serve.schemas import response_schema

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# apply_chat_template's own arguments: what the request's messages and tools decide, not a template variable
_TEMPLATE_ARGUMENTS = frozenset(
    {"messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize",
     "return_dict", "continue_final_message", "return_assistant_tokens_mask", "padding", "truncation"}
)  # fmt: skip


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # an earlier answer's sampled ids (``return_token_ids``), sent back by ChatART: the next prompt continues them
    # instead of the template's rendering of the message (``serve/continuation.py``)
    token_ids: list[int] | None = None

    def text(self, where: str) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for i, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise RequestError(
                    f"only text content parts are supported, got type {part.type!r}", f"{where}.content[{i}]"
                )
            parts.append(part.text)
        return "".join(parts)


class FunctionDefinition(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _FUNCTION_NAME.match(value):
            raise ValueError("function names are 1-64 characters of letters, digits, '_', '-' or '.'")
        return value

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "object") != "object":
            raise ValueError(f"parameters must be a JSON Schema of type 'object', got type {value.get('type')!r}")
        if value is not None and not isinstance(value.get("properties", {}), dict):
            raise ValueError("parameters.properties must be an object mapping argument names to schemas")
        return value


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: dict[str, str]


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    ignore_eos: bool = False  # vLLM's extra parameter: sample up to max_tokens even past an end-of-turn token
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the chat template (enable_thinking)
    _answer_schema: tuple[dict[str, Any] | None] | None = PrivateAttr(default=None)

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema ``response_format`` asks for (``schemas.response_schema``), None for text; parsed once per
        request. Raises ``RequestError`` naming what is malformed."""
        if self._answer_schema is None:
            self._answer_schema = (response_schema(self.response_format),)
        return self._answer_schema[0]

    def check_supported(self) -> None:
        """Refuse fields we cannot honour, naming the field (a 400, not a silent no-op)."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise RequestError(f"{name} is not supported (it would change what the logprobs mean); omit it", name)
        if self.logit_bias:
            raise RequestError("logit_bias is not supported; omit it", "logit_bias")
        structured = self.answer_schema() is not None  # a malformed one is a 400 here
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
        if self.ignore_eos and (structured or forced):
            raise RequestError(
                "ignore_eos cannot be combined with structured output or a forced tool call", "ignore_eos"
            )
        if self.ignore_eos and self.max_tokens is None and self.max_completion_tokens is None:
            raise RequestError("ignore_eos needs max_tokens (it would sample to the end of the context)", "ignore_eos")
        taken = sorted(set(self.chat_template_kwargs or {}) & _TEMPLATE_ARGUMENTS)
        if taken:
            raise RequestError(
                f"chat_template_kwargs may not set {taken}: the request's own fields decide them",
                "chat_template_kwargs",
            )
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
        if isinstance(self.tool_choice, NamedToolChoice):
            wanted = self.tool_choice.function.get("name")
            if wanted not in {tool.function.name for tool in self.tools or []}:
                raise RequestError(f"tool_choice names {wanted!r}, which is not among the tools", "tool_choice")
        if self.tool_choice == "required" and not self.tools:
            raise RequestError("tool_choice 'required' needs at least one tool", "tool_choice")

    def sampling_params(self) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            max_tokens=max_tokens,
            stop=stop,
            n=self.n,
            seed=self.seed,
            top_logprobs=self.top_logprobs or 0,
            ignore_eos=self.ignore_eos,
        )

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages as chat templates expect them: text content, and tool-call arguments as objects (the OpenAI
        format's JSON strings parsed, as vLLM does: Qwen's template applies ``tojson`` to them, which would write a
        string twice encoded; templates that take a string render an object with ``tojson`` as well)."""
        out: list[dict[str, Any]] = []
        for i, message in enumerate(self.messages):
            where = f"messages[{i}]"
            role = "system" if message.role == "developer" else message.role
            if role == "tool" and message.content is None:
                raise RequestError("a tool message needs content (the tool's result)", f"{where}.content")
            item: dict[str, Any] = {"role": role, "content": message.text(where)}
            if message.tool_calls:
                if role != "assistant":
                    raise RequestError("only assistant messages may carry tool_calls", f"{where}.tool_calls")
                item["tool_calls"] = [_arguments_as_object(call.model_dump()) for call in message.tool_calls]
            if message.tool_call_id:
                item["tool_call_id"] = message.tool_call_id
            if message.name:
                item["name"] = message.name
            out.append(item)
        return out

    def sampled_ids(self) -> dict[int, list[int]]:
        """The messages sent with their sampled ``token_ids``, by index."""
        return {i: m.token_ids for i, m in enumerate(self.messages) if m.token_ids}

    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def _arguments_as_object(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call whose ``arguments`` JSON string holds an object, with the object in its place (other arguments,
    such as text a model wrote that is not JSON, stay as they are)."""
    arguments = call["function"]["arguments"]
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return call
        if isinstance(parsed, dict):
            return {**call, "function": {**call["function"], "arguments": parsed}}
    return call


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
