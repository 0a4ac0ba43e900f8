"""The hermes tool-call parser (``serve/parsers/tool_calls.py``): blocks are read as JSON, so what a string in the
arguments says cannot end a block early, and nothing the model wrote is dropped (a block it cannot read is counted)."""

from __future__ import annotations

import json
from typing import Any

from langgraph_art.serve.parsers.tool_calls import Hermes


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The content and the OpenAI tool calls the hermes parser reads in ``text``."""
    parser = Hermes()
    reply = parser.parse(text, ["a", "b", "search"])
    return reply.content, parser.tool_calls(reply)


def called(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_a_closing_tag_inside_an_argument_string_does_not_end_the_block() -> None:
    # what SmolLM2 wrote under the forced-call grammar at temperature 1 (the JSON is valid; the old regex split it)
    query = "foo.r}}</tool_call> Input: {"
    text = f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}", "limit": 5000}}}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content is None
    assert called(calls) == [("search", {"query": query, "limit": 5000})]


def test_calls_and_the_text_around_them() -> None:
    text = (
        'Let me look. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call> {"name": "b", "parameters": {"y": [2]}} </tool_call> done'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me look.  and  done"
    assert called(calls) == [("a", {"x": 1}), ("b", {"y": [2]})]
    assert len({c["id"] for c in calls}) == 2


def test_string_arguments_are_passed_through() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"x": 1}'


def test_blocks_that_are_not_calls_stay_in_the_content() -> None:
    for text in (
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["a"]</tool_call>',
        '<tool_call>{"name": "a", "arguments": {}} trailing</tool_call>',  # not closed right after the JSON
        '<tool_call>{"name": "a", "arguments": {}}',  # never closed (cut by max_tokens)
        "no calls at all",
    ):
        assert parse_tool_calls(text) == (text, []), text
        assert Hermes().parse(text, []).unparsed == (text != "no calls at all"), text


def test_a_bad_block_before_a_good_one_keeps_both() -> None:
    text = '<tool_call>oops</tool_call> <tool_call>{"name": "a", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "<tool_call>oops</tool_call> "
    assert called(calls) == [("a", {})]
