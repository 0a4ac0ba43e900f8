"""The one LangChain -> OpenAI message conversion: the fast path agrees with LangChain's own converter."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, convert_to_openai_messages

from langgraph_art.capture.messages import _clean, _plain, to_jsonable, to_openai_message, to_openai_messages

MESSAGES = [
    SystemMessage("be brief"),
    HumanMessage("hi", name="alice"),
    AIMessage("plain answer"),
    AIMessage("", tool_calls=[{"name": "f", "args": {"a": 1, "b": "é"}, "id": "c1"}]),
    AIMessage("thinking", tool_calls=[{"name": "f", "args": {}, "id": "c2"}, {"name": "g", "args": {}, "id": "c3"}]),
    ToolMessage("result", tool_call_id="c1", name="f"),
    ToolMessage("result", tool_call_id="c2"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"{m.type}-{m.content[:5]}")
def test_fast_path_equals_langchain_conversion(message) -> None:
    assert _plain(message) is not None
    assert to_openai_message(message) == _clean(convert_to_openai_messages(message))


def test_rich_content_falls_back_to_langchain() -> None:
    blocks = HumanMessage(content=[{"type": "text", "text": "look"}, {"type": "text", "text": " here"}])
    assert _plain(blocks) is None
    assert to_openai_message(blocks) == _clean(convert_to_openai_messages(blocks))


def test_cache_converts_each_message_once() -> None:
    cache: dict = {}
    first = to_openai_messages(MESSAGES, cache)
    again = to_openai_messages(MESSAGES, cache)
    assert first == again and all(a is b for a, b in zip(first, again, strict=True))


@dataclass
class Point:
    x: int


def test_to_jsonable_never_raises() -> None:
    state = {"messages": [HumanMessage("hi")], "point": Point(1), "nan": math.nan, "blob": b"x", 3: {1, 2}}
    out = to_jsonable(state)
    assert out["messages"] == [{"role": "user", "content": "hi"}]
    assert out["point"] == {"x": 1} and out["nan"] == "nan" and out["blob"] == "b'x'" and out["3"] == [1, 2]
