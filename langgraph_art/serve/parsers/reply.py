"""A sample read as an OpenAI assistant message with one engine's parsers: ``ReplyReader``.

The text a parser reads is the engine's (decoded without special tokens), except where a parser's format is made of
special tokens (harmony's channels, Mistral's ``[TOOL_CALLS]``): those tokens are kept in the text it reads.
With ``parallel_tool_calls=False`` a reply keeps its tokens up to the end of its first call (``first_call``): the
same tokens, with the same logprobs, as a sampler that stopped there, so what is trained is what was executed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from langgraph_art.serve.engines.base import Sample
from langgraph_art.serve.parsers import reasoning_parser, tool_call_parser
from langgraph_art.serve.parsers.auto import detect_reasoning_parser, detect_tool_call_parser
from langgraph_art.serve.parsers.reasoning import ReasoningParser
from langgraph_art.serve.parsers.tool_calls import ToolCallParser

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """An assistant message (OpenAI's shape, plus ``reasoning_content`` where there was thinking), its finish reason,
    and how many call-like spans its text held that were not read as calls."""

    message: dict[str, Any]
    finish_reason: str
    unparsed: int = 0


class ReplyReader:
    """One tokenizer's tool-call and reasoning parsers (chosen from its template for ``"auto"``, logged once)."""

    def __init__(
        self, tokenizer: Any, tool_call_parser_name: str = "auto", reasoning_parser_name: str | None = "auto"
    ) -> None:
        self.tokenizer = tokenizer
        if tool_call_parser_name == "auto":
            tool_call_parser_name, why = detect_tool_call_parser(tokenizer)
            log.info("tool_call_parser='auto': %r (%s)", tool_call_parser_name, why)
        self.tool_call_parser_name = tool_call_parser_name
        self.tool_parser: ToolCallParser = tool_call_parser(tool_call_parser_name)
        if reasoning_parser_name == "auto":
            reasoning_parser_name, reason = detect_reasoning_parser(tokenizer)
            log.info("reasoning_parser='auto': %r (%s)", reasoning_parser_name, reason)
        self.reasoning_parser_name = reasoning_parser_name
        self.reasoning: ReasoningParser | None = (
            reasoning_parser(reasoning_parser_name) if reasoning_parser_name else None
        )
        kept = set(self.tool_parser.kept_tokens) | set(self.reasoning.kept_tokens if self.reasoning else ())
        special = set(getattr(tokenizer, "all_special_tokens", ()) or ())
        special |= {str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
        vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        # special tokens a format is made of: decoding without special tokens would drop them
        self._kept = {int(vocabulary[t]): t for t in kept if t in vocabulary and t in special}
        self.parsed = self.unparsed = 0
        self._warned = False
        self._lock = threading.Lock()

    @property
    def keeps_tokens(self) -> bool:
        """True when the format is made of special tokens the engine's text leaves out (harmony, Mistral)."""
        return bool(self._kept)

    def keeps(self, token_id: int) -> bool:
        """True for a special token the format keeps in its text (``<|call|>``, ``[TOOL_CALLS]``)."""
        return token_id in self._kept

    def visible(self, text: str) -> str:
        """What of a reply's text so far may be streamed as content: what follows the thinking (nothing while a
        thinking block is open, or may be opening)."""
        if self.reasoning is None:
            return text
        opening = self.reasoning.opens
        if opening and text.strip() and opening.startswith(text.lstrip()):
            return ""
        return self.reasoning.split(text)[1]

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/models`` shows of the parsers."""
        return {"tool_call_parser": self.tool_call_parser_name, "reasoning_parser": self.reasoning_parser_name}

    def text(self, token_ids: Sequence[int], default: str | None = None) -> str:
        """The text the parsers read: ``default`` (the engine's text) unless the format keeps special tokens."""
        if default is not None and not (self._kept and any(i in self._kept for i in token_ids)):
            return default
        pieces: list[str] = []
        run: list[int] = []
        for token in token_ids:
            if token in self._kept:
                pieces.append(self.tokenizer.decode(run, skip_special_tokens=True) if run else "")
                pieces.append(self._kept[token])
                run = []
            else:
                run.append(token)
        if run:
            pieces.append(self.tokenizer.decode(run, skip_special_tokens=True))
        return "".join(pieces)

    def read(self, sample: Sample, tools: Sequence[str] | None) -> Reply:
        """``sample`` as a message; ``tools``: the bound tools' names when calls may be read (None: no tools, or
        ``tool_choice="none"``). Counts what it read (``stats``) and warns once about text it could not read."""
        text = self.text(sample.token_ids, sample.text)
        thinking, rest = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        message: dict[str, Any] = {"role": "assistant"}
        finish: str = sample.finish_reason
        unparsed = 0
        if tools is None:
            message["content"] = self.tool_parser.content(rest)
        else:
            parsed = self.tool_parser.parse(rest, tools)
            message["content"] = parsed.content
            unparsed = parsed.unparsed
            if parsed.calls:
                message["tool_calls"] = self.tool_parser.tool_calls(parsed)
                finish = "tool_calls"
            self._count(len(parsed.calls), unparsed)
        if thinking is not None:
            message["reasoning_content"] = thinking
        return Reply(message, finish, unparsed)

    def _count(self, parsed: int, unparsed: int) -> None:
        with self._lock:
            self.parsed += parsed
            self.unparsed += unparsed
            warn = unparsed and not self._warned
            self._warned = self._warned or bool(unparsed)
        if warn:
            log.warning(
                "a reply held %d tool call(s) the %r parser could not read: they stay in the message's content, "
                "are counted (tool_calls/unparsed in /metrics and in each training step's record) and warned about "
                "once. Check tool_call_parser= for this model (docs: guides/models.md)",
                unparsed,
                self.tool_call_parser_name,
            )

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"tool_calls_parsed": float(self.parsed), "tool_calls_unparsed": float(self.unparsed)}

    def has_call(self, token_ids: Sequence[int], tools: Sequence[str]) -> bool:
        """True when the text of ``token_ids`` holds a whole call (after any thinking)."""
        text = self.text(token_ids)
        if self.reasoning is not None:
            text = self.reasoning.split(text)[1]
        return bool(self.tool_parser.parse_prefix(text, tools).calls)

    def first_call(self, sample: Sample, tools: Sequence[str]) -> Sample:
        """``sample`` up to the token that completes its first call (all of it when it holds none): the prefix a
        sampler stopping there would have given, token for token."""
        if not self.has_call(sample.token_ids, tools):
            return sample
        calls = FirstCall(self, tools)
        for k, token in enumerate(sample.token_ids):
            if calls.push(token):
                return cut(sample, k + 1, self.tokenizer)
        return sample  # pragma: no cover - has_call found one in the whole


class FirstCall:
    """Token by token: ``push`` is True for the token that completes the first call (streaming stops there)."""

    def __init__(self, reader: ReplyReader, tools: Sequence[str]) -> None:
        self.reader, self.tools = reader, tools
        self.ids: list[int] = []
        self.done = False

    def push(self, token_id: int) -> bool:
        if self.done:
            return False
        self.ids.append(token_id)
        ends = self.reader.tool_parser.call_ends
        if ends is not None and not self.reader.keeps(token_id):  # read again only where a call can end
            piece = self.reader.tokenizer.decode([token_id], skip_special_tokens=False)
            if not any(c in piece for c in ends):
                return False
        self.done = self.reader.has_call(self.ids, self.tools)
        return self.done


def cut(sample: Sample, keep: int, tokenizer: Any) -> Sample:
    """``sample``'s first ``keep`` tokens, its text decoded again; stopped by its call (``read`` then says
    ``tool_calls``)."""
    ids = sample.token_ids[:keep]
    return replace(
        sample,
        token_ids=ids,
        logprobs=sample.logprobs[:keep],
        top_logprobs=sample.top_logprobs[:keep],
        text=tokenizer.decode(ids, skip_special_tokens=True),
        finish_reason="stop",
        closing_tokens=max(0, sample.closing_tokens - (len(sample.token_ids) - keep)),
    )
