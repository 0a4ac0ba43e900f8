"""Tool-call parsers, one per way a model family writes calls, named as vLLM's ``--tool-call-parser`` names them.

A parser turns the text a model sampled into OpenAI ``tool_calls`` and the content left around them. It never
changes what was sampled: the trainer trains the token ids as sampled, whatever the parser read from them.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes, SmolLM2
  with the bundled ``chatml-tools`` template).
- ``xlam``: lenient. Hermes blocks, and also a call in a Markdown fence (```` ```json {...} ``` ````) or as bare
  JSON, an object or a list of objects, anywhere in the reply: how Qwen2.5-Coder answers under ``tool_choice="auto"``
  in a Qwen2.5 template (vLLM issue 32926). Only the bound tools' names are read as calls.
- ``llama3_json``: Llama 3.1/3.2, the whole reply one or more ``{"name": ..., "parameters": {...}}`` objects joined
  by ``;`` (``<|python_tag|>``, a special token, is left out of the text already).
- ``pythonic``: the whole reply a Python list of calls, ``[get_weather(city="Paris"), ...]`` (Llama 3.2/4's pythonic
  templates, ToolACE).
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of calls (v3 tokenizers), or ``[TOOL_CALLS]name[ARGS]{...}`` (v11);
  call ids are 9 letters and digits, the only ids Mistral's templates accept.
- ``phi4_mini_json``: ``functools[{"name": ..., "arguments": {...}}, ...]``.
- ``openai``: gpt-oss's harmony format: a call is a message on the ``commentary`` channel addressed
  ``to=functions.NAME``, the answer the ``final`` channel's message (the ``analysis`` channel is reasoning:
  ``reasoning.py``).

Formats with a marker of their own (hermes tags, ``[TOOL_CALLS]``, ``functools``, harmony's recipient) read any
function name; formats without one (bare JSON, a fence, a Python list) read only the names of the request's tools,
so prose that shows JSON is not mistaken for a call. What looks like a call but could not be read (a block whose
JSON is broken, a fence naming a function that is not bound) stays in the content and is counted: ``unparsed``.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedCall:
    """One call read from the text: its function name, its arguments as a JSON string, and the span of the text
    it was written in (``start``, ``end``: what was cut out of the content)."""

    name: str
    arguments: str
    start: int
    end: int


@dataclass(frozen=True)
class ParsedReply:
    """What a parser read: the content left (None when nothing but calls was said), the calls, and how many
    call-like spans it could not read (left in the content)."""

    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)
    unparsed: int = 0


class ToolCallParser:
    """The base of every parser: ``parse`` reads calls out of a reply's text. A parser of your own subclasses it
    (``register_tool_call_parser``) and sets ``name``, ``markers`` and ``parse``; ``kept_tokens`` when its format
    uses special tokens the text would otherwise lose; ``call_id`` when the chat template wants ids of a shape."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()  # text that may begin a call: streamed content is held back from there
    kept_tokens: ClassVar[tuple[str, ...]] = ()  # special tokens kept in the text this parser reads
    # the characters a call of this format can end with (None: any): with parallel calls off, a reply is read again
    # only at a token holding one of them (or a kept token), to find where its first call ends
    call_ends: ClassVar[str | None] = None

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:  # pragma: no cover - every parser has one
        raise NotImplementedError

    def parse_prefix(self, text: str, tools: Collection[str]) -> ParsedReply:
        """``parse`` of a reply still being sampled (``parallel_tool_calls=False`` stops at its first whole call): a
        parser that repairs a reply's end reads a prefix without that repair."""
        return self.parse(text, tools)

    def content(self, text: str) -> str:
        """The reply's text as content when no tools are in play (the kept tokens removed)."""
        for token in self.kept_tokens:
            text = text.replace(token, "")
        return text

    def call_id(self) -> str:
        """A fresh id for a call (OpenAI's shape, ``call_`` and 24 hex digits)."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def tool_calls(self, reply: ParsedReply) -> list[dict[str, Any]]:
        """``reply``'s calls as OpenAI ``tool_calls``, each with a fresh id."""
        return [
            {"id": self.call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls
        ]


def reply_of(text: str, calls: list[ParsedCall], unparsed: int = 0) -> ParsedReply:
    """The reply with ``calls``' spans cut out of ``text``; content None when only white space is left."""
    if not calls:
        return ParsedReply(text, [], unparsed)
    kept, last = [], 0
    for call in sorted(calls, key=lambda c: c.start):
        kept.append(text[last : call.start])
        last = call.end
    kept.append(text[last:])
    content = "".join(kept)
    return ParsedReply(content if content.strip() else None, calls, unparsed)


def call_of(data: Any, tools: Collection[str] | None, *, key: str = "arguments") -> tuple[str, str] | None:
    """``(name, arguments JSON)`` when ``data`` is a call object (``{"name": str, "arguments"|"parameters": ...}``)
    whose name is among ``tools`` (any name for None); None otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    if tools is not None and data["name"] not in tools:
        return None
    arguments = data.get(key, data.get("arguments", data.get("parameters", {})))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return data["name"], json.dumps(arguments, ensure_ascii=False)


def json_at(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``at`` (after white space) and the index just past it; None when there is none."""
    while at < len(text) and text[at].isspace():
        at += 1
    try:
        return _JSON.raw_decode(text, at)
    except json.JSONDecodeError:
        return None


def list_at(text: str, at: int) -> tuple[Any, int] | None:
    """``json_at``, and also a JSON list left open at the end of the text: its whole items, and the end of the text.
    A reply read as it is sampled (``parallel_tool_calls=False`` stops at its first call) ends like that, and so
    does the reply cut there."""
    found = json_at(text, at)
    if found is not None:
        return found
    at = len(text) - len(text[at:].lstrip())
    if not text.startswith("[", at):
        return None
    items, at = [], at + 1
    while True:
        at = len(text) - len(text[at:].lstrip())
        if at >= len(text):
            break
        try:
            item, at = _JSON.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        items.append(item)
        at = len(text) - len(text[at:].lstrip())
        if at < len(text) and text[at] == ",":
            at += 1
        elif at < len(text):
            return None
    return (items, len(text)) if items else None


def calls_in(value: Any, tools: Collection[str] | None) -> list[tuple[str, str]] | None:
    """The calls a decoded JSON value holds: one call object, or a non-empty list of them; None when it is not
    that (every item must be a call)."""
    items = value if isinstance(value, list) else [value]
    calls = [call_of(item, tools) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


_LOOKS_LIKE_CALL = re.compile(r'"name"\s*:\s*"[^"]*"\s*,\s*"(?:arguments|parameters)"\s*:')


def looks_like_calls(text: str, markers: Collection[str] = ()) -> int:
    """How many places in ``text`` look like a call: a marker of the format, or a ``"name": ..., "arguments":``
    pair not within 64 characters after a marker (one broken block counts once); counted over what a parser left in
    the content."""
    marked = sorted(m.start() for marker in markers for m in re.finditer(re.escape(marker), text))
    pairs = [m.start() for m in _LOOKS_LIKE_CALL.finditer(text)]
    return len(marked) + sum(1 for p in pairs if not any(0 <= p - m <= 64 for m in marked))


class Hermes(ToolCallParser):
    """``<tool_call>{json}</tool_call>`` blocks. A block's JSON is read as JSON, so a string in the arguments may
    itself contain ``</tool_call>``. A block whose JSON is invalid, lacks a name or is not closed right after stays
    in the content, counted as unparsed."""

    name = "hermes"
    call_ends = ">"
    markers: ClassVar[tuple[str, ...]] = ("<tool_call>",)
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _closing = re.compile(r"\s*</tool_call>")

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        calls, broken = self.blocks(text)
        return reply_of(text, calls, len(broken))

    def blocks(self, text: str) -> tuple[list[ParsedCall], list[tuple[int, int]]]:
        """The blocks read as calls, and the spans of those that could not be (from the opening tag through the
        next closing one, or to the end of the text)."""
        calls: list[ParsedCall] = []
        broken: list[tuple[int, int]] = []
        at = 0
        while (start := text.find(self.OPEN, at)) != -1:
            at = start + len(self.OPEN)
            found = json_at(text, at)
            closing = self._closing.match(text, found[1]) if found else None
            call = call_of(found[0], None) if found else None
            if closing is None or call is None:
                end = text.find(self.CLOSE, at)
                broken.append((start, len(text) if end < 0 else end + len(self.CLOSE)))
                continue
            calls.append(ParsedCall(call[0], call[1], start, closing.end()))
            at = closing.end()
        return calls, broken


class Xlam(Hermes):
    """Hermes blocks, then Markdown fences and bare JSON holding calls of the bound tools (see the module)."""

    name = "xlam"
    call_ends = ">}]`"
    markers = ("<tool_call>", "```", "{", "[")
    _fence = re.compile(r"```[ \t]*(?:json|tool_call|tool_code|JSON)?[ \t]*\n?")

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        return self._parse(text, tools, repair=True)

    def parse_prefix(self, text: str, tools: Collection[str]) -> ParsedReply:
        return self._parse(text, tools, repair=False)

    def _parse(self, text: str, tools: Collection[str], repair: bool) -> ParsedReply:
        calls, broken = self.blocks(text)
        # a block that could not be read (or is not closed yet) is not looked into for bare JSON
        taken = [(c.start, c.end) for c in calls] + broken
        at = 0
        while at < len(text):
            inside = next((end for start, end in taken if start <= at < end), None)
            if inside is not None:
                at = inside
                continue
            fence = self._fence.match(text, at)
            if fence is not None:
                found = self._fenced(text, at, fence.end(), tools, repair)
                if found:
                    calls.extend(found)
                    at = found[-1].end
                    continue
                at = fence.end()
                continue
            if text[at] in "{[":
                found = self._bare(text, at, tools, repair)
                if found:
                    calls.extend(found)
                    at = found[-1].end
                    continue
            at += 1
        calls.sort(key=lambda c: c.start)
        reply = reply_of(text, calls)
        return ParsedReply(reply.content, reply.calls, looks_like_calls(reply.content or "", (self.OPEN,)))

    def _fenced(self, text: str, start: int, body: int, tools: Collection[str], repair: bool) -> list[ParsedCall]:
        """The calls of a fence whose body is one JSON value holding calls, the span through its closing fence
        (or the end of the text, where the reply stops inside the fence)."""
        found = json_at(text, body)
        if found is None and not repair:
            return []
        if found is None:
            closing_fence = text.find("```", body)
            inside = text[body : closing_fence if closing_fence >= 0 else len(text)]
            found = _closed(inside)
            if found is None:
                return []
            end = body + len(inside) if closing_fence < 0 else closing_fence + 3
            calls = calls_in(found[0], tools)
            return [ParsedCall(name, arguments, start, end) for name, arguments in calls or []]
        calls = calls_in(found[0], tools)
        if calls is None:
            return []
        end = found[1]
        closing = re.compile(r"\s*```").match(text, end)
        if closing is not None:
            end = closing.end()
        elif text[end:].strip():  # something else before the fence closes: not a fenced call
            return []
        return [ParsedCall(name, arguments, start, end) for name, arguments in calls]

    def _bare(self, text: str, start: int, tools: Collection[str], repair: bool) -> list[ParsedCall]:
        found = list_at(text, start)
        if found is None and repair:
            found = _closed(text[start:])
            found = (found[0], len(text)) if found else None
        calls = calls_in(found[0], tools) if found else None
        if not found or calls is None:
            return []
        return [ParsedCall(name, arguments, start, found[1]) for name, arguments in calls]


def _closed(text: str) -> tuple[Any, int] | None:
    """``text`` (a call's JSON up to the end of the reply, or of its fence) read with its outer object closed, when
    that one ``}`` is all it lacks: a small model sometimes ends a call right after its arguments (Qwen2.5-Coder-0.5B
    did in about 1 of 20 sampled calls). The tokens stay as sampled; only the reading is lenient."""
    body = text.rstrip()
    if not body.startswith("{") or body.endswith("}}"):
        return None
    found = json_at(body + "}", 0)
    return found if found is not None and found[1] == len(body) + 1 else None


class Llama3Json(ToolCallParser):
    """The whole reply is calls: JSON objects ``{"name": ..., "parameters": {...}}`` joined by ``;`` (Llama 3.1 and
    3.2's JSON tool calling). Only bound tools' names are read; anything else is content."""

    name = "llama3_json"
    call_ends = "};"
    markers = ("{",)

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        calls: list[ParsedCall] = []
        at = len(text) - len(text.lstrip())
        while at < len(text):
            found = json_at(text, at)
            call = call_of(found[0], tools, key="parameters") if found else None
            if found is None or call is None:
                return ParsedReply(text, [], looks_like_calls(text))
            rest = re.compile(r"\s*;?\s*").match(text, found[1])
            end = rest.end() if rest else found[1]
            calls.append(ParsedCall(call[0], call[1], at, end))  # the separator goes with the call
            at = end
        return reply_of(text, calls)


class Pythonic(ToolCallParser):
    """The whole reply is a Python list of calls with keyword arguments of literal values,
    ``[get_weather(city="Paris", days=2)]``, read with ``ast`` (never evaluated). Only bound tools' names."""

    name = "pythonic"
    call_ends = ")]"
    markers = ("[",)

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        stripped = text.strip()
        if not stripped.startswith("["):
            return ParsedReply(text, [], 0)
        closed = stripped if stripped.endswith("]") else stripped.rstrip(", ") + "]"  # left open: see list_at
        try:
            tree = ast.parse(closed, mode="eval").body
        except SyntaxError:
            return ParsedReply(text, [], 1)
        if not isinstance(tree, ast.List) or not tree.elts:
            return ParsedReply(text, [], 0)
        calls: list[ParsedCall] = []
        start = text.index("[")
        for node in tree.elts:
            call = _python_call(node, tools)
            if call is None:
                return ParsedReply(text, [], 1)
            calls.append(ParsedCall(call[0], call[1], start, start + len(stripped)))
        return ParsedReply(None, calls, 0)


def _python_call(node: ast.expr, tools: Collection[str]) -> tuple[str, str] | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if node.func.id not in tools:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            if isinstance(keyword.value, ast.Name) and keyword.value.id in ("true", "false", "null"):
                arguments[keyword.arg] = json.loads(keyword.value.id)  # JSON's spellings, as models write them
            else:
                return None
    return node.func.id, json.dumps(arguments, ensure_ascii=False)


class Mistral(ToolCallParser):
    """``[TOOL_CALLS]`` (a special token, kept in the text this parser reads) followed by a JSON list of calls, or
    by ``name[ARGS]{...}`` once per call (v11 tokenizers). Ids are 9 letters and digits."""

    name = "mistral"
    call_ends = "}]"
    TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
    markers = (TOOL_CALLS,)
    kept_tokens = (TOOL_CALLS, ARGS, "[CALL_ID]")
    _alphabet = string.ascii_letters + string.digits

    def call_id(self) -> str:
        return "".join(secrets.choice(self._alphabet) for _ in range(9))

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        calls: list[ParsedCall] = []
        unparsed = at = 0
        while (start := text.find(self.TOOL_CALLS, at)) != -1:
            at = start + len(self.TOOL_CALLS)
            found = list_at(text, at)
            listed = calls_in(found[0], None) if found else None
            if found is not None and listed is not None:
                calls.extend(ParsedCall(name, arguments, start, found[1]) for name, arguments in listed)
                at = found[1]
                continue
            named = re.compile(r"\s*([A-Za-z0-9_.\-]{1,64})\[ARGS\]").match(text, at)
            found = json_at(text, named.end()) if named else None
            if named is None or found is None or not isinstance(found[0], dict):
                unparsed += 1
                continue
            arguments = json.dumps(found[0], ensure_ascii=False)
            calls.append(ParsedCall(named.group(1), arguments, start, found[1]))
            at = found[1]
        reply = reply_of(text, calls, unparsed)
        content = None if reply.content is None else self.content(reply.content)
        return ParsedReply(content if content and content.strip() else None, reply.calls, reply.unparsed)


class Phi4MiniJson(ToolCallParser):
    """``functools[...]``: a JSON list of calls after the word ``functools`` (Phi-4-mini)."""

    name = "phi4_mini_json"
    call_ends = "}]"
    MARKER = "functools"
    markers = (MARKER,)

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        calls: list[ParsedCall] = []
        unparsed = at = 0
        while (start := text.find(self.MARKER, at)) != -1:
            at = start + len(self.MARKER)
            found = list_at(text, at) if text[at : at + 1] == "[" else None
            listed = calls_in(found[0], None) if found else None
            if found is None or listed is None:
                unparsed += 1
                continue
            calls.extend(ParsedCall(name, arguments, start, found[1]) for name, arguments in listed)
            at = found[1]
        return reply_of(text, calls, unparsed)


class Harmony(ToolCallParser):
    """gpt-oss's harmony format. The text is the reply's messages with their special tokens (``kept_tokens``):
    ``<|channel|>CHANNEL [to=functions.NAME] [<|constrain|>json]<|message|>BODY`` ended by ``<|end|>``, ``<|call|>``
    or ``<|return|>``, each later message opened by ``<|start|>assistant``. A message addressed
    ``to=functions.NAME`` is a call (its body the arguments); the content is the ``final`` channel's text."""

    name = "openai"
    call_ends = "}>"
    START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
    ENDS = ("<|end|>", "<|call|>", "<|return|>")
    markers = (CHANNEL, START)
    kept_tokens = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
    _recipient = re.compile(r"to=functions\.([A-Za-z0-9_\-]+)")

    def messages(self, text: str) -> Iterator[tuple[str, str, int, int]]:
        """Each message's ``(header, body, start, end)``; a text without harmony's tokens is one final message."""
        if self.MESSAGE not in text:
            yield "<|channel|>final", text, 0, len(text)
            return
        at = 0
        while at < len(text):
            opened = text.find(self.MESSAGE, at)
            if opened < 0:
                break
            header = text[at:opened]
            body_at = opened + len(self.MESSAGE)
            ends = [p for p in (text.find(end, body_at) for end in self.ENDS) if p >= 0]
            stop = min(ends) if ends else len(text)
            closing = next((e for e in self.ENDS if text.startswith(e, stop)), "")
            end = stop + len(closing)
            if text.startswith(self.START, end):
                end += len(self.START)
            yield header, text[body_at:stop], at, end
            at = end

    @staticmethod
    def channel(header: str) -> str:
        found = re.search(r"<\|channel\|>\s*([A-Za-z_]+)", header)
        return found.group(1) if found else ""

    def parse(self, text: str, tools: Collection[str]) -> ParsedReply:
        calls: list[ParsedCall] = []
        final: list[str] = []
        unparsed = 0
        for header, body, start, end in self.messages(text):
            recipient = self._recipient.search(header)
            if recipient is None:
                if self.channel(header) != "analysis":
                    final.append(body)
                continue
            found = json_at(body, 0)
            if found is None or not isinstance(found[0], dict) or body[found[1] :].strip():
                unparsed += 1
                final.append(body)
                continue
            calls.append(ParsedCall(recipient.group(1), json.dumps(found[0], ensure_ascii=False), start, end))
        content = "".join(final)
        return ParsedReply(content if content.strip() or not calls else None, calls, unparsed)

    def content(self, text: str) -> str:
        return "".join(body for header, body, _, _ in self.messages(text) if self.channel(header) != "analysis")


PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    parser.name: parser for parser in (Hermes, Xlam, Llama3Json, Pythonic, Mistral, Phi4MiniJson, Harmony)
}
