"""How a reply's text becomes an OpenAI message, per model family: tool-call parsers and reasoning parsers under
vLLM's names (``tool_call_parser=``, ``reasoning_parser=``; ``langgraph-art serve --tool-call-parser``), chosen
from the chat template by default (``"auto"``), and a hook for your own (``register_tool_call_parser``).

``tool_calls.py`` and ``reasoning.py`` hold the parsers; ``auto.py`` how the default is chosen; ``reply.py`` how a
sample is read with them (special tokens a format needs kept, one call only when ``parallel_tool_calls=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from langgraph_art.errors import ConfigError
from langgraph_art.serve.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from langgraph_art.serve.parsers.tool_calls import PARSERS, ParsedCall, ParsedReply, ToolCallParser

__all__ = [
    "ParsedCall",
    "ParsedReply",
    "ReasoningParser",
    "ToolCallParser",
    "check_parsers",
    "reasoning_parser",
    "register_reasoning_parser",
    "register_tool_call_parser",
    "tool_call_parser",
    "tool_call_parser_names",
]

P = TypeVar("P")


def tool_call_parser(name: str) -> ToolCallParser:
    """A fresh parser registered as ``name``; ``ConfigError`` naming the registered ones otherwise."""
    return _found(PARSERS, name, "tool-call", "'auto': chosen from the chat template", "register_tool_call_parser")


def reasoning_parser(name: str) -> ReasoningParser:
    """A fresh reasoning parser registered as ``name``; ``ConfigError`` naming the registered ones otherwise."""
    others = "'auto': chosen from the chat template, or None: none"
    return _found(REASONING_PARSERS, name, "reasoning", others, "register_reasoning_parser")


def _found(table: dict[str, Callable[[], P]], name: str, kind: str, others: str, register: str) -> P:
    if name not in table:
        raise ConfigError(
            f"no {kind} parser {name!r}; registered: {sorted(table)} (or {others}). Register your own with "
            f"langgraph_art.serve.parsers.{register}"
        )
    return table[name]()


def check_parsers(tool_calls: str, reasoning: str | None) -> None:
    """``ConfigError`` for a parser name that is not registered (``"auto"`` and, for reasoning, ``"none"``/None are
    always fine)."""
    if tool_calls != "auto":
        tool_call_parser(tool_calls)
    if reasoning not in (None, "auto", "none"):
        reasoning_parser(reasoning)


def tool_call_parser_names() -> list[str]:
    return sorted(PARSERS)


def _register(table: dict[str, Callable[[], P]], kind: str, name: str) -> Callable[[type[P]], type[P]]:
    if not name or name == "auto":
        raise ConfigError(f"a {kind} parser needs a name other than {name!r}")

    def add(parser: type[P]) -> type[P]:
        table[name] = parser
        return parser

    return add


def register_tool_call_parser(name: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """A class decorator: ``@register_tool_call_parser("mine")`` on a ``ToolCallParser`` subclass makes it
    ``tool_call_parser="mine"`` (as vLLM's ``--tool-parser-plugin`` registers one). Registering a name again
    replaces that parser."""
    return _register(PARSERS, "tool-call", name)


def register_reasoning_parser(name: str) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    """The same for a ``ReasoningParser`` subclass: ``reasoning_parser="mine"``."""
    return _register(REASONING_PARSERS, "reasoning", name)
