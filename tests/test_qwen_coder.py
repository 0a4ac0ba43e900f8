"""Qwen2.5-Coder-0.5B-Instruct, the first model here that looks like what users swap in: its own Qwen2.5 template
with tools, and tool calls written its own way (a fenced or bare JSON object under ``tool_choice="auto"``, not the
``<tool_call>`` tags the template shows it). Through ``ChatART`` as a user binds it: the calls it writes come back
as ``tool_calls``, ``create_agent`` runs a tool loop on it, one call when parallel calls are off, and LangChain's
standard chat-model suite runs against it. Greedy (temperature 0): every answer is fixed for a given build."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from langgraph_art.capture.chat_model import ChatART
from tests.helpers import ServedChatModelSuite

pytestmark = [pytest.mark.slow, pytest.mark.integration]
OWNERS = {"Onyx Forge": "Mara Lindqvist", "Blue Lantern": "Tomas Okafor", "Quartz Mill": "Ines Duarte"}


@tool
def lookup(project: str) -> str:
    """Look up an internal project's owner, status and budget by its name."""
    owner = OWNERS.get(project)
    return json.dumps({"project": project, "owner": owner, "status": "on track"} if owner else {"error": "unknown"})


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """Current weather in a city; unit is 'celsius' or 'fahrenheit'."""
    return json.dumps({"city": city, "temperature": 21, "unit": unit, "sky": "clear"})


@pytest.fixture(scope="module")
def qwen_server(qwen_path: Path) -> Iterator[Any]:
    from langgraph_art.serve.embedded import EmbeddedServer

    with EmbeddedServer("qwen2.5-coder-0.5b", served_name="qwen2.5-coder-0.5b") as running:
        yield running


def chat(server: Any, **fields: Any) -> ChatART:
    settings = {"model": "qwen2.5-coder-0.5b", "base_url": server.base_url, "temperature": 0.0, "max_tokens": 64}
    return ChatART(**{**settings, **server.in_process_clients(), **fields})


def test_the_alias_is_the_pinned_file_with_qwen_s_own_template(qwen_path: Path) -> None:
    from langgraph_art.models.gguf import QWEN2_5_CODER
    from langgraph_art.models.loading import load_tokenizer
    from langgraph_art.serve.parsers.reply import ReplyReader

    source = json.loads((qwen_path / "source.json").read_text())
    assert source["gguf_sha256"] == QWEN2_5_CODER["qwen2.5-coder-0.5b"].sha256  # verified before it was converted
    assert json.loads((qwen_path / "config.json").read_text())["model_type"] == "qwen2"
    tokenizer = load_tokenizer(str(qwen_path))
    assert tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [151657, 151658]
    reader = ReplyReader(tokenizer)
    assert (reader.tool_call_parser_name, reader.reasoning_parser_name) == ("xlam", None)


QUESTIONS = [
    ("Who owns the Onyx Forge project?", "lookup", {"project": "Onyx Forge"}),
    ("What is the status of project Blue Lantern?", "lookup", {"project": "Blue Lantern"}),
    ("What's the weather in Paris right now?", "get_weather", {"city": "Paris"}),
    ("Tell me the current temperature in Tokyo in fahrenheit.", "get_weather", {"city": "Tokyo"}),
]


def test_bind_tools_under_auto_returns_the_calls_it_writes(qwen_server: Any) -> None:
    """Untrained, the model writes a call in a fence or as bare JSON, never the template's <tool_call> tags: every
    one comes back as a tool call (before issue 48 none did), and nothing was left unread."""
    from langgraph_art.serve.parsers.tool_calls import Hermes

    llm = chat(qwen_server).bind_tools([lookup, get_weather])
    for question, name, arguments in QUESTIONS:
        reply = llm.invoke(question)
        raw = "".join(e["token"] for e in reply.response_metadata["logprobs"]["content"])
        assert "<tool_call>" not in raw and Hermes().parse(raw, [name]).calls == [], raw  # its own way, not hermes
        assert [c["name"] for c in reply.tool_calls] == [name], raw
        assert arguments.items() <= reply.tool_calls[0]["args"].items(), raw
    metrics = qwen_server.app.state.chat_completions.stats()
    assert metrics["tool_calls_unparsed"] == 0 and metrics["tool_calls_parsed"] >= len(QUESTIONS)


async def test_create_agent_runs_a_tool_loop_in_a_running_event_loop(qwen_server: Any) -> None:
    """As a notebook or an async app runs it: ``ainvoke`` on the running loop, the model's fenced call read, the tool
    run on its arguments, the result read, then an answer."""
    from langchain.agents import create_agent

    agent = create_agent(model=chat(qwen_server, max_tokens=96), tools=[lookup])
    question = {"messages": [("user", "Who owns the Onyx Forge project?")]}
    state = await agent.ainvoke(question, {"recursion_limit": 8})
    messages = state["messages"]
    called = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert called and called[0].tool_calls[0]["name"] == "lookup"
    assert results and "Mara Lindqvist" in results[0].content  # the tool ran on the parsed arguments
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.text


async def test_resend_token_ids_continues_the_call_as_sampled(qwen_server: Any) -> None:
    """With ``resend_token_ids=True`` the prompt after the tool result holds the call as the model wrote it (bare or
    fenced JSON), not as the template renders it (``<tool_call>`` tags): the two turns continue each other, so they
    train as one sequence. The template alone would not have given that prompt."""
    from langchain_core.messages import HumanMessage

    from langgraph_art.serve.chat import render_prompt
    from langgraph_art.serve.protocol import ChatCompletionRequest

    llm = chat(qwen_server, max_tokens=64, resend_token_ids=True)
    bound = llm.bind_tools([lookup])
    question = HumanMessage("Who owns the Onyx Forge project?")
    call = await bound.ainvoke([question])
    assert call.tool_calls and call.tool_calls[0]["name"] == "lookup"
    result = ToolMessage(lookup.invoke(call.tool_calls[0]["args"]), tool_call_id=call.tool_calls[0]["id"])
    await bound.ainvoke([question, call, result])
    first, second = sorted(llm.recorder.unclaimed(), key=lambda turn: turn.start_time)
    sampled = list(first.prompt_token_ids) + list(first.token_ids)
    assert list(second.prompt_token_ids[: len(sampled)]) == sampled
    tokenizer = qwen_server.app.state.chat_completions.engine.tokenizer
    assert "<tool_call>" not in tokenizer.decode(first.token_ids)
    as_served = ChatCompletionRequest(model="qwen2.5-coder-0.5b", messages=second.messages).template_messages()
    assert render_prompt(tokenizer, as_served, second.tools)[: len(sampled)] != sampled
    assert qwen_server.app.state.chat_completions.stats()["prompts_continued"] >= 1


def test_parallel_tool_calls_off_gives_one_call(qwen_server: Any) -> None:
    question = "What is the weather in Paris, in Tokyo and in Oslo?"
    llm = chat(qwen_server, max_tokens=64)
    for choice in ("auto", "required"):
        many = llm.bind_tools([get_weather], tool_choice=choice).invoke(question)
        one = llm.bind_tools([get_weather], tool_choice=choice, parallel_tool_calls=False).invoke(question)
        assert len(one.tool_calls) == 1, (choice, one)
        assert one.tool_calls[0] == {**many.tool_calls[0], "id": one.tool_calls[0]["id"]}  # the first of the same
        kept = one.response_metadata["logprobs"]["content"]
        assert [e["token_id"] for e in kept] == [e["token_id"] for e in many.response_metadata["logprobs"]["content"]][
            : len(kept)
        ]
    # under "required" with parallel calls allowed the untrained 0.5B writes several (3 identical ones, measured)
    assert len(llm.bind_tools([get_weather], tool_choice="required").invoke(question).tool_calls) > 1


@pytest.mark.skipif(
    os.environ.get("LANGGRAPH_ART_QWEN_SUITE") != "1",
    reason="LANGGRAPH_ART_QWEN_SUITE=1 runs LangChain's standard suite on Qwen2.5-Coder-0.5B (~4 min of one CI worker)",
)
class TestChatARTQwenCoderIntegration(ServedChatModelSuite):
    """LangChain's standard integration suite against Qwen2.5-Coder-0.5B-Instruct, in process as ``LocalBackend``
    gives it, greedy. What this model cannot do is marked, with what it does instead. Outside CI's budget (the tests
    above are the 0.5B's proof there; the tiny and SmolLM2 suites run in CI): ``LANGGRAPH_ART_QWEN_SUITE=1``.
    Measured on 2 cores (AMD EPYC, AVX2): 35 passed, 3 expected failures, 11 skipped (multimodal, VCR, no override
    model), 238 s."""

    @pytest.fixture(autouse=True)
    def _service(self, qwen_server: Any) -> None:
        type(self)._server = qwen_server

    @property
    def chat_model_params(self) -> dict[str, Any]:
        server = self._server
        # 48 tokens: room for a forced call to be repeated (at 32 the budget, not the model, stops it after one)
        return {"model": "qwen2.5-coder-0.5b", "base_url": server.base_url, "max_tokens": 48, "max_retries": 0,
                "temperature": 0.0, **server.in_process_clients()}  # fmt: skip

    # Forced (the suite binds with tool_choice and LangChain's default of parallel calls allowed) the untrained 0.5B
    # writes the same call three times, every time: the grammar lets it stop after one, it does not. With
    # parallel_tool_calls=False it makes one (test_parallel_tool_calls_off_gives_one_call above).
    _REPEATS = "forced with parallel calls allowed, the untrained 0.5B repeats the call (3 identical calls)"

    @pytest.mark.xfail(reason=_REPEATS, raises=AssertionError, strict=True)
    def test_tool_calling(self, model: Any) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=_REPEATS, raises=AssertionError, strict=True)
    async def test_tool_calling_async(self, model: Any) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=_REPEATS, raises=AssertionError, strict=True)
    def test_tool_calling_with_no_arguments(self, model: Any) -> None:
        super().test_tool_calling_with_no_arguments(model)
