"""Structured output and forced tool calls as one grammar, in llguidance's Lark dialect, built from the request.

A request is constrained when it asks for
- ``response_format={"type": "json_schema", "json_schema": {"schema": ...}}``: JSON valid against the schema;
- ``response_format={"type": "json_object"}``: a JSON object; with a ``"schema"`` beside the type (the extension
  llama.cpp and Together accept, and what ChatART's ``json_mode`` sends), one valid against that schema;
- ``tool_choice="required"``: one or more tool calls (exactly one with ``parallel_tool_calls=false``);
- ``tool_choice={"type": "function", "function": {"name": ...}}``: exactly one call of that function.
With tools under ``tool_choice="auto"`` and a JSON response format the answer is either tool calls or the JSON.

Tool calls are written the way the model's chat template writes them (``ToolCallFormat.probe``: the template renders
a probe call once, and its markers, whitespace and key order become the grammar's; markers that are tokens of the
vocabulary are matched as those tokens), so a sampled call is exactly what the template renders into the next
prompt. JSON is compact with ``", "`` and ``": "`` (what ``json.dumps`` and ``tojson`` write), properties in schema
order, and an object schema that lists ``properties`` but does not say otherwise gets ``additionalProperties:
false`` (OpenAI's strict mode: a model cannot invent keys). A bare ``{"type": "object"}`` stays open.

The grammar is text: the server hands it to the engine (``GenerationRequest.grammar``), returns it with the response
(``return_token_ids``), and the trainer recomputes each sampled token's logprob under the same mask.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph_art.errors import RequestError
from langgraph_art.serve.schemas import strict_schema

if TYPE_CHECKING:
    from langgraph_art.serve.protocol import ChatCompletionRequest

log = logging.getLogger(__name__)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME, _ARGS = "__langgraph_art_probe__", {"__langgraph_art_argument__": 1}


@dataclass(frozen=True)
class Constraint:
    """A request's grammar, and each JSON schema in it with the request field it came from (to name it in errors)."""

    grammar: str
    schemas: tuple[tuple[str, dict[str, Any]], ...]


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model's chat template writes tool calls: ``open head(name) <arguments> tail close``, calls joined by
    ``between``. ``open``/``close`` are Lark terms: ``<tool_call>`` where the marker is a token, else a string."""

    open: str
    close: str
    head: tuple[str, str]  # the text before the arguments, split where the function's name goes
    tail: str
    between: str

    @classmethod
    def probe(cls, tokenizer: Any) -> ToolCallFormat | None:
        """The format the tokenizer's chat template renders (two probe calls, their arguments a dict as the templates
        expect: Qwen's applies ``tojson`` to them), or None when it does not write hermes-style
        ``<tool_call>...</tool_call>`` blocks."""
        call = {"type": "function", "function": {"name": _NAME, "arguments": _ARGS}}
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call, call]}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception as exc:  # noqa: BLE001 - whatever the template raises, it cannot write tool calls
            log.info("the chat template cannot render tool calls (%s): tool_choice cannot be enforced", exc)
            return None
        arguments = json.dumps(_ARGS)
        first = text.find(OPEN)
        if first < 0 or text.count(_NAME) != 2 or text.count(arguments) != 2:
            return None
        end = text.find(CLOSE, first)
        second = text.find(OPEN, end)
        if end < 0 or second < 0:
            return None
        body = text[first + len(OPEN) : end]
        head, _, tail = body.partition(arguments)
        before, _, after = head.partition(_NAME)
        vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        marker = lambda m: m if m in vocabulary else json.dumps(m)  # noqa: E731 - a token, or text to spell out
        return cls(marker(OPEN), marker(CLOSE), (before, after), tail, text[end + len(CLOSE) : second])


def request_constraint(body: ChatCompletionRequest, calls: ToolCallFormat | None) -> Constraint | None:
    """The grammar ``body`` asks for (see the module's docstring), None for free text. Raises ``RequestError`` for
    a response format or tool choice that cannot be enforced."""
    answer = body.answer_schema()  # parsed once, when the request was checked
    tools = body.tools or []
    choice = body.tool_choice
    named = not (choice is None or isinstance(choice, str))
    forced = named or choice == "required"
    if named:
        name = getattr(choice, "function", {}).get("name")
        wanted = [tool for tool in tools if tool.function.name == name]
    elif forced or (choice != "none" and answer is not None):
        wanted = list(tools)
    else:
        wanted = []
    if answer is None and not forced:
        return None
    if wanted and calls is None:
        raise RequestError(
            "this model's chat template does not write tool calls as <tool_call>{...}</tool_call> blocks, so calls "
            "cannot be enforced; use tool_choice='auto' or a model whose template renders tool_calls",
            "tool_choice",
        )
    rules: list[str] = []
    schemas: list[tuple[str, dict[str, Any]]] = []
    alternatives: list[str] = []
    if wanted and calls is not None:
        names: list[str] = []
        for tool in wanted:
            name = tool.function.name
            params = strict_schema(tool.function.parameters or {"type": "object", "properties": {}})
            schemas.append((f"tools[{tools.index(tool)}].function.parameters", params))
            head = calls.head[0] + json.dumps(name)[1:-1] + calls.head[1]
            names.append(f"call_{len(names)}")
            rules.append(f"{names[-1]}: {_join(_text(head), _json(params), _text(calls.tail))}")
        rules.append(f"call: {calls.open} ({' | '.join(names)}) {calls.close}")
        single = named or body.parallel_tool_calls is False
        rules.append("calls: call" if single else f"calls: call ({_join(_text(calls.between), 'call')})*")
        alternatives.append("calls")
    if answer is not None and not forced:
        schemas.append(("response_format", answer))
        rules.append(f"answer: {_json(answer)}")
        alternatives.append("answer")
    return Constraint("\n".join([f"start: {' | '.join(alternatives)}", *rules]) + "\n", tuple(schemas))


def _json(schema: dict[str, Any]) -> str:
    """An inline JSON schema in compact style (a schema's own ``x-guidance`` options win)."""
    style = {**JSON_STYLE, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps({**schema, "x-guidance": style}, ensure_ascii=False)


def _text(text: str) -> str:
    """A Lark string literal; nothing for no text."""
    return json.dumps(text, ensure_ascii=False) if text else ""


def _join(*terms: str) -> str:
    return " ".join(term for term in terms if term)
