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
PROBE_NAME, _ARGS = "__langgraph_art_probe__", {"__langgraph_art_argument__": 1}
_USER = {"role": "user", "content": "x"}
_PYTHON_ARGS = "__langgraph_art_argument__=1"  # how a pythonic template writes _ARGS
_CALL_ID, _ANSWER = "pr0be0001", "__langgraph_art_answer__"  # a call id as Mistral's templates want it: 9 characters


@dataclass(frozen=True)
class Constraint:
    """A request's grammar, and each JSON schema in it with the request field it came from (to name it in errors)."""

    grammar: str
    schemas: tuple[tuple[str, dict[str, Any]], ...]


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model's chat template writes tool calls, as Lark terms: ``prefix call (between call)* suffix`` where
    ``call`` is ``head[0] NAME head[1] <arguments JSON> tail``. Text the vocabulary holds as one added token (a
    ``<tool_call>``, ``[TOOL_CALLS]``, ``<|channel|>``) is that token (``<[id]>``), the rest string literals; a call
    id the template writes becomes ``CALL_ID`` (9 letters and digits, what Mistral's templates accept). ``single``:
    the template renders one call a message (Llama 3.1, gpt-oss), so the grammar allows one."""

    prefix: str
    head: tuple[str, str]
    tail: str
    between: str
    suffix: str
    single: bool = False
    python: bool = False  # arguments written as Python keywords, ``name(city="Paris")`` (pythonic templates)

    @classmethod
    def probe(cls, tokenizer: Any) -> ToolCallFormat | None:
        """The format the tokenizer's chat template renders (two probe calls, else one; their arguments a dict as
        the templates expect: Qwen's applies ``tojson`` to them), or None when it renders no call whose name and
        arguments can be found. Arguments are JSON, or Python keywords where a pythonic template writes them so."""
        rendered = _probe_reply(tokenizer, 2)
        single = rendered is None
        if single:
            rendered = _probe_reply(tokenizer, 1)
        if rendered is None:
            return None
        reply, end = rendered
        arguments = json.dumps(_ARGS)
        python = arguments not in reply and _PYTHON_ARGS in reply
        arguments = _PYTHON_ARGS if python else arguments
        names = _positions(reply, PROBE_NAME)
        args = _positions(reply, arguments)
        calls = 1 if single else 2
        if len(names) != calls or len(args) != calls or not all(n < a for n, a in zip(names, args, strict=True)):
            return None
        if reply.endswith(end) and end:
            reply = reply[: len(reply) - len(end)]
        first = reply[: names[0]]
        middle = reply[names[0] + len(PROBE_NAME) : args[0]]
        if single:
            after = reply[args[0] + len(arguments) :]
            opening, closing, between, prefix, suffix = first, after, "", "", ""
        else:
            if reply[names[1] + len(PROBE_NAME) : args[1]] != middle:
                return None
            gap = reply[args[0] + len(arguments) : names[1]]
            opening = _common_suffix(first, gap)
            prefix, gap = first[: len(first) - len(opening)], gap[: len(gap) - len(opening)]
            after = reply[args[1] + len(arguments) :]
            closing = _common_prefix(gap, after)
            between, suffix = gap[len(closing) :], after[len(closing) :]
        term = _Terms(tokenizer)
        pieces = (term(prefix), (term(opening), term(middle)), term(closing), term(between), term(suffix))
        return cls(*pieces, single=single, python=python)


def render_probe_calls(tokenizer: Any, calls: int) -> str | None:
    """The template's rendering of a user turn and an assistant turn of ``calls`` probe calls (named ``PROBE_NAME``);
    None when the template cannot render that. What the grammar is read from, and what ``parsers.auto`` reads the
    family from."""
    call = {"id": _CALL_ID, "type": "function", "function": {"name": PROBE_NAME, "arguments": _ARGS}}
    turn = {"role": "assistant", "content": "", "tool_calls": [call] * calls}
    try:
        return str(tokenizer.apply_chat_template([_USER, turn], tokenize=False))
    except Exception as exc:  # noqa: BLE001 - whatever the template raises, it cannot write these tool calls
        log.info("the chat template cannot render %d tool call(s) (%s)", calls, exc)
        return None


def _probe_reply(tokenizer: Any, calls: int) -> tuple[str, str] | None:
    """The text the template renders for an assistant turn of ``calls`` probe calls (after the generation prompt),
    and the end-of-turn text it writes after a plain answer (to leave out: the engine ends the turn)."""
    text = render_probe_calls(tokenizer, calls)
    if text is None:
        return None
    try:
        prompt = tokenizer.apply_chat_template([_USER], add_generation_prompt=True, tokenize=False)
        plain = tokenizer.apply_chat_template([_USER, {"role": "assistant", "content": _ANSWER}], tokenize=False)
    except Exception as exc:  # noqa: BLE001 - it rendered the calls; a template failing here has no reply to read
        log.info("the chat template cannot render a plain answer (%s)", exc)
        return None
    if not text.startswith(prompt):
        return None
    end = plain[plain.find(_ANSWER) + len(_ANSWER) :] if _ANSWER in plain else ""
    return text[len(prompt) :], end


class _Terms:
    """Text as a sequence of Lark terms: the vocabulary's added tokens found in it as ``<[id]>``, the probe's call
    id as ``CALL_ID``, the rest as string literals."""

    def __init__(self, tokenizer: Any) -> None:
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.tokens = sorted(((str(t), int(i)) for i, t in added.items() if len(str(t)) > 1), key=lambda p: -len(p[0]))

    def __call__(self, text: str) -> str:
        terms: list[str] = []
        plain = ""
        at = 0
        while at < len(text):
            if text.startswith(_CALL_ID, at):
                terms += [_text(plain), "CALL_ID"]
                plain, at = "", at + len(_CALL_ID)
                continue
            token = next(((t, i) for t, i in self.tokens if text.startswith(t, at)), None)
            if token is not None:
                terms += [_text(plain), f"<[{token[1]}]>"]
                plain, at = "", at + len(token[0])
                continue
            plain += text[at]
            at += 1
        terms.append(_text(plain))
        return _join(*terms)


def _positions(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + len(part))
    return found


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n :]


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


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
            "this model's chat template renders no tool call whose name and arguments can be found, so calls cannot "
            "be enforced; use tool_choice='auto' or a chat_template that renders tool_calls",
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
            head = _join(calls.head[0], _text(json.dumps(name)[1:-1]), calls.head[1])
            names.append(f"call_{len(names)}")
            arguments = _python_arguments(params) if calls.python else _json(params)
            rules.append(f"{names[-1]}: {_join(head, arguments, calls.tail)}")
        rules.append(f"call: {' | '.join(names)}")
        single = named or body.parallel_tool_calls is False or calls.single
        several = "" if single else f" ({_join(calls.between, 'call')})*"
        rules.append(f"calls: {_join(calls.prefix, 'call' + several, calls.suffix)}")
        if any("CALL_ID" in rule for rule in rules):
            rules.append("CALL_ID: /[A-Za-z0-9]{9}/")
        alternatives.append("calls")
    if answer is not None and not forced:
        schemas.append(("response_format", answer))
        rules.append(f"answer: {_json(answer)}")
        alternatives.append("answer")
    return Constraint("\n".join([f"start: {' | '.join(alternatives)}", *rules]) + "\n", tuple(schemas))


def _python_arguments(schema: dict[str, Any]) -> str:
    """Keyword arguments ``key=<JSON value>`` for a pythonic call: the required ones in the schema's order, then
    each optional one, in order, or not at all (a model that writes them in another order is held to this one;
    with none required, the later optional ones only after the first).
    Values are JSON valid against the property's schema (JSON's strings and numbers are Python's; the pythonic
    parser reads ``true``/``false``/``null`` as well)."""
    properties = schema.get("properties") or {}
    required = [key for key in properties if key in set(schema.get("required") or ())]
    optional = [key for key in properties if key not in required]

    def argument(key: str) -> str:
        return _join(_text(f"{key}="), _json(properties[key] or {}))

    if not properties:
        return ""
    terms = [argument(key) for key in required] or [argument(optional.pop(0))]
    text = _join(terms[0], *(_join('", "', t) for t in terms[1:]), *(f'(", " {argument(k)})?' for k in optional))
    return text if required else f"({text})?"


def _json(schema: dict[str, Any]) -> str:
    """An inline JSON schema in compact style (a schema's own ``x-guidance`` options win)."""
    style = {**JSON_STYLE, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps({**schema, "x-guidance": style}, ensure_ascii=False)


def _text(text: str) -> str:
    """A Lark string literal; nothing for no text."""
    return json.dumps(text, ensure_ascii=False) if text else ""


def _join(*terms: str) -> str:
    return " ".join(term for term in terms if term)
