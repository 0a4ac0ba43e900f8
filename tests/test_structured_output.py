"""Structured output and forced tool calls: the grammar a request asks for, the masks it samples under, a structure
closed within ``max_tokens``, and every way LangChain asks for it, on the random-init tiny model. That model never
follows an instruction (unconstrained, it loops inside a JSON string about half the time), so every valid answer
here is the grammar's doing, not luck. The same guarantees on both engines: ``test_engine_conformance.py``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from langgraph_art.errors import RequestError
from langgraph_art.serve.protocol import ChatCompletionRequest
from langgraph_art.serve.schemas import response_schema, strict_schema
from langgraph_art.serve.structured import ToolCallFormat, request_constraint
from tests.family_templates import QWEN2_5

JOKE = {
    "type": "object",
    "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}, "rating": {"type": "integer"}},
    "required": ["setup", "punchline"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "no_args", "parameters": {"type": "object", "properties": {}}}},
]
MESSAGES = [{"role": "user", "content": "Tell me a joke about cats"}]


class Joke(BaseModel):
    setup: str
    punchline: str
    rating: int | None = None


def body(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=MESSAGES, **fields)


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "Joke", "schema": schema}}


@pytest.fixture(scope="module")
def calls(tokenizer: Any) -> ToolCallFormat:
    found = ToolCallFormat.probe(tokenizer)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> Any:
    from langgraph_art.models.grammar import Grammars

    return Grammars(tokenizer)


# -- the grammar a request asks for ---------------------------------------------------------------------------
def test_the_template_s_tool_call_format_is_probed(calls: ToolCallFormat) -> None:
    """The tiny template writes <tool_call>{"name": ..., "arguments": ...}</tool_call>, the markers being tokens."""
    head = ('<[2044]> "{\\"name\\": \\""', '"\\", \\"arguments\\": "')  # <[2044]>: the <tool_call> token
    assert calls == ToolCallFormat("", head, '"}" <[2045]>', "", "")


def test_a_template_without_tool_calls_cannot_force_them() -> None:
    class Plain:
        def apply_chat_template(self, messages: Any, tokenize: bool, add_generation_prompt: bool = False) -> str:
            return "".join(m["content"] for m in messages)

    assert ToolCallFormat.probe(Plain()) is None
    with pytest.raises(RequestError, match="cannot be enforced") as caught:
        request_constraint(body(tools=TOOLS, tool_choice="required"), None)
    assert caught.value.param == "tool_choice"


def test_free_text_has_no_grammar(calls: ToolCallFormat) -> None:
    for fields in (
        {},
        {"tools": TOOLS},
        {"tools": TOOLS, "tool_choice": "auto"},
        {"response_format": {"type": "text"}},
    ):
        assert request_constraint(body(**fields), calls) is None


def test_each_request_kind_becomes_its_grammar(calls: ToolCallFormat) -> None:
    answer = request_constraint(body(response_format=json_schema(JOKE)), calls)
    assert answer is not None and answer.grammar.startswith("start: answer\nanswer: %json {")
    assert answer.schemas == (("response_format", strict_schema(JOKE)),)

    required = request_constraint(body(tools=TOOLS, tool_choice="required"), calls)
    assert required is not None
    assert "calls: call (call)*" in required.grammar  # parallel calls allowed, as OpenAI's default
    assert "call: call_0 | call_1\n" in required.grammar
    assert 'call_0: <[2044]> "{\\"name\\": \\"" "get_weather" "\\", \\"arguments\\": " %json' in required.grammar
    assert [where for where, _ in required.schemas] == ["tools[0].function.parameters", "tools[1].function.parameters"]

    single = request_constraint(body(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), calls)
    assert single is not None and "calls: call\n" in single.grammar

    named = request_constraint(
        body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "no_args"}}), calls
    )
    assert named is not None and '"{\\"name\\": \\"" "no_args" "\\", \\"arguments\\": "' in named.grammar
    assert "get_weather" not in named.grammar and "calls: call\n" in named.grammar

    either = request_constraint(body(tools=TOOLS, response_format=json_schema(JOKE)), calls)
    assert either is not None and either.grammar.startswith("start: calls | answer\n")
    assert request_constraint(body(tools=TOOLS, tool_choice="none", response_format=json_schema(JOKE)), calls)


def test_strict_schema_closes_objects_that_list_their_properties() -> None:
    nested = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}, "free": {"type": "object"}},
        "$defs": {"Item": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "anyOf": [{"properties": {"c": {"type": "number"}}}],
    }
    strict = strict_schema(nested)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["free"]  # a bare object stays a free-form object
    assert strict["$defs"]["Item"]["additionalProperties"] is False
    assert strict["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in nested  # a copy
    assert strict_schema({**nested, "additionalProperties": True})["additionalProperties"] is True


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "regex"}, "not supported"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs"),
        ({"type": "json_object", "schema": "nope"}, "JSON schema object"),
    ],
)
def test_malformed_response_formats_name_the_field(response_format: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message) as caught:
        response_schema(response_format)
    assert caught.value.param == "response_format"


def test_json_object_takes_a_schema_beside_its_type() -> None:
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    assert response_schema({"type": "json_object", "schema": JOKE}) == strict_schema(JOKE)


# -- masks and closing ---------------------------------------------------------------------------------------------
def test_the_shortest_closing_of_each_grammar(grammars: Any, tokenizer: Any, calls: ToolCallFormat) -> None:
    def shortest(**fields: Any) -> str:
        constraint = request_constraint(body(**fields), calls)
        assert constraint is not None
        closed = grammars.close(constraint.grammar, [], 100)
        assert closed is not None and closed[0] == 0
        return tokenizer.decode(closed[1])

    assert shortest(response_format=json_schema(JOKE)) == '{"setup": "", "punchline": ""}<|im_end|>'
    assert shortest(response_format={"type": "json_object"}) == "{}<|im_end|>"
    named = {"type": "function", "function": {"name": "get_weather"}}
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": ""}}</tool_call><|im_end|>'
    assert shortest(tools=TOOLS, tool_choice=named) == call


@pytest.mark.parametrize("room", [0, 3, 8, 40])
def test_a_cut_sample_gives_back_as_few_tokens_as_it_must(grammars: Any, tokenizer: Any, room: int) -> None:
    grammar = f"start: answer\nanswer: %json {json.dumps(strict_schema(JOKE))}\n"
    ids = tokenizer.encode('{"setup": "why did the cat sit on the computer to keep an eye', add_special_tokens=False)
    budget = len(ids) + room
    keep, tail = grammars.close(grammar, ids, budget)
    assert keep + len(tail) <= budget and tail[-1] == grammars.eos
    text = tokenizer.decode(ids[:keep] + tail, skip_special_tokens=True)
    assert Joke.model_validate_json(text).setup.startswith("why did the cat")
    if room >= 40:
        assert keep == len(ids)  # nothing given back when the closing fits
    assert grammars.replay(grammar, ids[:keep] + tail) is not None  # what the trainer will replay


def test_replay_gives_the_masks_and_refuses_a_token_the_grammar_forbids(grammars: Any, tokenizer: Any) -> None:
    from langgraph_art.models.grammar import unpack

    grammar = f"start: answer\nanswer: %json {json.dumps(strict_schema(JOKE))}\n"
    ids = [*tokenizer.encode('{"setup": "x", "punchline": "y"}', add_special_tokens=False), grammars.eos]
    replay = grammars.replay(grammar, ids)
    assert replay is not None and replay.packed.shape == (len(ids), grammars.words)
    allowed = unpack(replay.packed, grammars.vocab_size)
    assert all(allowed[i, token] for i, token in enumerate(ids))
    opening = tokenizer.convert_tokens_to_ids(["{", '{"'])  # the only ways to begin (a key must follow)
    assert allowed[0].nonzero().flatten().tolist() == sorted(opening)
    assert allowed[-1].tolist() == [t == grammars.eos for t in range(grammars.vocab_size)]  # then only EOS
    assert grammars.replay(grammar, tokenizer.encode("hello", add_special_tokens=False)) is None


def test_a_grammar_that_does_not_compile_is_a_request_error(grammars: Any) -> None:
    with pytest.raises(RequestError, match="does not compile"):
        grammars.matcher("start: nowhere\n")
    with pytest.raises(RequestError, match="tools\\[0\\]") as caught:
        grammars.check('start: x\nx: "a"\n', [("tools[0].function.parameters", {"$ref": "#/nope"})])
    assert caught.value.param == "tools[0].function.parameters"


# -- the server ---------------------------------------------------------------------------------------------------
FORMATS = {
    "json_schema": {"response_format": json_schema(JOKE)},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_object with schema": {"response_format": {"type": "json_object", "schema": JOKE}},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "required, one call": {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "calls or answer": {"tools": TOOLS, "response_format": json_schema(JOKE)},
}


def check_choice(kind: str, choice: dict[str, Any]) -> None:
    """The choice is what ``kind`` asked for: JSON that validates, or tool calls whose arguments do."""
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if kind.startswith("json") or (kind == "calls or answer" and not calls):
        data = json.loads(message["content"])
        assert isinstance(data, dict) and not calls
        if kind != "json_object":
            assert Joke.model_validate(data) and set(data) <= {"setup", "punchline", "rating"}
        return
    assert calls and message["content"] is None and choice["finish_reason"] == "tool_calls"
    if kind in ("required, one call", "named"):
        assert len(calls) == 1
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == "get_weather":
            assert isinstance(arguments["city"], str) and set(arguments) <= {"city", "days"}
            assert isinstance(arguments.get("days", 0), int)
        else:
            assert kind != "named" and call["function"]["name"] == "no_args" and arguments == {}


@pytest.mark.parametrize("kind", list(FORMATS))
def test_every_choice_is_valid_on_the_random_model(server: Any, kind: str) -> None:
    request = {"model": "tiny", "messages": MESSAGES, "n": 8, "max_tokens": 40, "logprobs": True, **FORMATS[kind]}
    request["return_token_ids"] = True
    response = httpx.post(f"{server.base_url}/chat/completions", json=request, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["grammar"].startswith("start: ")
    for choice in answer["choices"]:
        check_choice(kind, choice)
        ids, entries = choice["token_ids"], choice["logprobs"]["content"]
        assert len(ids) <= 40 and [e["token_id"] for e in entries] == ids
        closing = choice["closing_tokens"]
        assert all(e["logprob"] == 0.0 for e in entries[len(ids) - closing :])  # the server's own tokens
        assert choice["finish_reason"] in ("stop", "tool_calls")  # closed, never cut


def test_the_budget_is_kept_and_closings_are_reported(server: Any) -> None:
    """At 24 tokens most answers of the looping model are closed by the server; all still parse."""
    request = {"model": "tiny", "messages": MESSAGES, "n": 16, "max_tokens": 24, "return_token_ids": True}
    request["response_format"] = json_schema(JOKE)
    choices = httpx.post(f"{server.base_url}/chat/completions", json=request, timeout=120).json()["choices"]
    assert any(c["closing_tokens"] > 0 for c in choices)
    for choice in choices:
        assert len(choice["token_ids"]) <= 24
        Joke.model_validate_json(choice["message"]["content"])


def test_the_grammar_comes_back_only_with_token_ids(server: Any) -> None:
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 30, "response_format": json_schema(JOKE)}
    plain = httpx.post(f"{server.base_url}/chat/completions", json=request, timeout=60).json()
    assert "grammar" not in plain and "closing_tokens" not in plain["choices"][0]
    free = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 5, "return_token_ids": True},
        timeout=60,
    ).json()
    assert "grammar" not in free and "closing_tokens" not in free["choices"][0]


@pytest.mark.parametrize("max_tokens", [24, 96])
def test_streaming_holds_back_what_a_closing_may_replace(server: Any, max_tokens: int) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="unused")
    for _ in range(3):  # the random model loops in some runs and not in others: both paths get exercised
        stream = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            stream=True,
            logprobs=True,
            response_format=json_schema(JOKE),  # type: ignore[arg-type]
            extra_body={"return_token_ids": True},
        )
        text, ids, grammar, closing = "", [], None, None
        for chunk in stream:
            grammar = grammar or (chunk.model_extra or {}).get("grammar")
            for choice in chunk.choices:
                text += choice.delta.content or ""
                ids += [entry.model_extra["token_id"] for entry in (choice.logprobs.content if choice.logprobs else [])]
                if choice.finish_reason:
                    assert choice.finish_reason == "stop"
                    closing = (choice.model_extra or {}).get("closing_tokens")
        assert grammar is not None and closing is not None and len(ids) <= max_tokens
        assert Joke.model_validate_json(text)


# -- LangChain's agent ----------------------------------------------------------------------------------------------
class Weather(BaseModel):
    city: str
    temperature: int


def weather_agent(server: Any) -> tuple[Any, Any]:
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from langgraph_art.capture.chat_model import ChatART

    @tool
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        return f"It is 21 degrees in {city}."

    llm = ChatART(model="tiny", base_url=server.base_url, max_tokens=48, max_retries=0)
    return create_agent(model=llm, tools=[get_weather], response_format=Weather), llm


def check_agent_run(out: dict[str, Any], trajectory: Any) -> None:
    assert isinstance(out["structured_response"], Weather)
    turns = trajectory.turns()
    assert turns and all(t.grammar is not None and t.has_tokens for t in turns)
    # ChatART's profile says it does structured output: create_agent asks for the answer as a response format,
    # beside the tools, so each call may end the run (the JSON) or call the tool
    assert all(t.grammar.startswith("start: calls | answer") for t in turns)


def test_create_agent_returns_a_structured_response(server: Any) -> None:
    from langgraph_art.capture.callbacks import TrajectoryCallbackHandler

    agent, llm = weather_agent(server)
    for _ in range(3):
        handler = TrajectoryCallbackHandler(recorders=[llm.recorder])
        out = agent.invoke({"messages": [("user", "weather in paris?")]}, config={"callbacks": [handler]})
        check_agent_run(out, handler.trajectories[-1])


async def test_create_agent_structured_response_inside_a_running_loop(server: Any) -> None:
    from langgraph_art.capture.callbacks import TrajectoryCallbackHandler

    agent, llm = weather_agent(server)
    handler = TrajectoryCallbackHandler(recorders=[llm.recorder])
    out = await agent.ainvoke({"messages": [("user", "weather in paris?")]}, config={"callbacks": [handler]})
    check_agent_run(out, handler.trajectories[-1])


# -- a template that writes tool calls as Qwen2.5's does ----------------------------------------------------------
QWEN_STYLE = QWEN2_5  # a template that writes tool calls as Qwen2.5's does (tests/family_templates.py)


@pytest.fixture
def qwen_style(tokenizer: Any) -> Any:
    import copy

    styled = copy.deepcopy(tokenizer)
    styled.chat_template = QWEN_STYLE
    return styled


def test_a_template_that_encodes_arguments_itself_gets_objects_and_its_own_format(qwen_style: Any) -> None:
    """Qwen's template applies ``tojson`` to the arguments: given OpenAI's JSON string it would write the string
    encoded twice. The server hands templates objects (as vLLM does), and the grammar follows the template's own
    newlines around the JSON."""
    from langgraph_art.models.grammar import Grammars

    calls = ToolCallFormat.probe(qwen_style)
    head = ('<[2044]> "\\n{\\"name\\": \\""', '"\\", \\"arguments\\": "')
    assert calls == ToolCallFormat("", head, '"}\\n" <[2045]>', '"\\n"', "")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    request = ChatCompletionRequest(
        model="tiny", messages=[*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    rendered = qwen_style.apply_chat_template(request.template_messages(), tokenize=False)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in rendered  # not "{\"city\": ...}"
    constraint = request_constraint(
        body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "no_args"}}), calls
    )
    assert constraint is not None
    grammars = Grammars(qwen_style)
    _, tail = grammars.close(constraint.grammar, [], 64)
    assert qwen_style.decode(tail) == '<tool_call>\n{"name": "no_args", "arguments": {}}\n</tool_call><|im_end|>'
