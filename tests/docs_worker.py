"""Runs the README's and the docs' ``python`` blocks for tests/test_docs.py, all in one process, so torch and the
tiny model load once: ``python tests/docs_worker.py BLOCKS.json RESULTS.jsonl``.

Each block runs in a fresh namespace, in a folder of its own (its working directory and ``LANGGRAPH_ART_HOME``),
after the setups its marker names (``<!-- test: run with=agent -->``) have put their names in that namespace; its
result (``ok``, seconds, output, or the traceback) is one line of RESULTS, written as soon as it ends, so a block
that hangs is the one after the last line. A block with a top-level ``await`` runs in ``asyncio.run``.

What the worker gives the tiny model: ``ChatART``'s (and ``ChatOpenAI``'s) ``max_tokens`` is 32 where a block
sets none (the random-init model otherwise samples to its 2048-token context, ~10 s a call). The setups stand in
for what a page says is yours (``build_my_graph``, ``found_answer``, ``scenarios``...): a small graph on the tiny
model, and a judge model that answers RULER's JSON without a network.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import inspect
import io
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import langgraph_art as art

TINY_MAX_TOKENS = 32
HOME = Path(".art")  # where the setups keep their data: set by main()


@dataclass
class Given:
    """What a setup gives a block: ``names`` in its namespace; ``replace``: text of the block to replace first."""

    names: dict[str, Any]
    replace: dict[str, str] = field(default_factory=dict)


SETUPS: dict[str, Callable[[], Given]] = {}


def setup(function: Callable[[], Given]) -> Callable[[], Given]:
    """A named setup, made once per worker and shared by the blocks that ask for it."""
    cached = functools.cache(function)
    SETUPS[function.__name__] = cached
    return cached


def cap_tiny_max_tokens() -> None:
    from langchain_openai import ChatOpenAI

    from langgraph_art.capture.chat_model import ChatART

    for chat_model in (ChatOpenAI, ChatART):
        chat_model.model_fields["max_tokens"].default = TINY_MAX_TOKENS
        chat_model.model_rebuild(force=True)


def judge_model() -> Any:
    """A chat model that answers RULER's prompt with a score for every run id it shows (t1: 1.0, t2: 0.5, ...)."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class RulerAnswers(BaseChatModel):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            ids = re.findall(r'<run id="(t\d+)">', str(messages[-1].content))
            scores = [{"trajectory_id": i, "explanation": "ok", "score": 1 / n} for n, i in enumerate(ids, 1)]
            message = AIMessage(json.dumps({"scores": scores}))
            return ChatResult(generations=[ChatGeneration(message=message)])

        @property
        def _llm_type(self) -> str:
            return "ruler-answers"

    return RulerAnswers()


@setup
def agent() -> Given:
    """What the guides call yours: ``model`` (tiny, on a LocalBackend) and ``llm``, ``build_my_graph`` and its
    ``graph`` (the weather tool loop), ``found_answer``, ``judge``, ``scenarios``, ``held_out``,
    ``example_conversations``, ``get_weather``, ``search``, ``Weather``, ``state`` and a ``trainer``."""
    from langchain_core.tools import tool
    from pydantic import BaseModel

    from langgraph_art.testing import get_weather, tool_loop_graph

    @tool
    def search(query: str) -> str:
        """Search the web."""
        return f"results for {query}"

    class Weather(BaseModel):
        city: str
        sky: str

    def build_my_graph(llm: Any) -> Any:
        return tool_loop_graph(llm).with_config(recursion_limit=6)

    @art.reward
    def found_answer(state: Any, scenario: Any) -> float:
        return float(scenario["answer"] in state["messages"][-1].content)

    model = art.TrainableModel(name="agent-001", project="email-agent", base_model="tiny")
    model.register(art.LocalBackend(home=HOME))
    llm = art.ChatART(model=model)
    graph = build_my_graph(llm)
    scenarios = [
        {"id": "paris", "input": {"messages": [("user", "What is the weather in Paris?")]}, "answer": "sunny"},
        {"id": "rome", "input": {"messages": [("user", "Is it raining in Rome?")]}, "answer": "No data"},
    ]
    held_out = [{"id": "paris-2", "input": {"messages": [("user", "Weather in Paris please")]}, "answer": "sunny"}]
    example_conversations = [
        {"messages": [{"role": "user", "content": "What is the weather in Paris?"},
                      {"role": "assistant", "content": "It is sunny in Paris."}]},
    ]  # fmt: skip
    judge = art.RulerJudge(judge_model(), cache=False)
    trainer = art.Trainer(graph, model, rewards=[found_answer], num_generations=2)
    return Given({
        "model": model, "llm": llm, "build_my_graph": build_my_graph, "graph": graph, "found_answer": found_answer,
        "judge": judge, "scenarios": scenarios, "held_out": held_out, "example_conversations": example_conversations,
        "examples": example_conversations, "get_weather": get_weather, "search": search, "Weather": Weather,
        "state": {"messages": [("user", "What is the weather in Paris?")]}, "trainer": trainer,
    })  # fmt: skip


@setup
def groups() -> Given:
    """``agent``'s names, and ``groups``: 4 runs of each of its scenarios, stored in ``store``."""
    names = agent().names
    store = art.TrajectoryStore.for_project("email-agent", HOME)
    gathered = art.gather_groups(names["graph"], names["scenarios"], num_generations=4, store=store, progress=False)
    return Given({**names, "store": store, "groups": gathered})


@setup
def game() -> Given:
    """``build_game``: three moves of the agent, a referee's prompt between them; ``game_result`` (the share of
    digits in the last move); ``scenarios``; ``agent``'s ``model``."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    from langgraph_art.testing import digit_share

    class Board(MessagesState):
        moves: int

    def build_game(llm: Any, checkpointer: Any = None) -> Any:
        def player(state: Board) -> dict[str, Any]:
            return {"messages": [llm.invoke(state["messages"])], "moves": state.get("moves", 0) + 1}

        def referee(state: Board) -> dict[str, Any]:
            return {"messages": [("user", "Your move: a number from 1 to 9.")]}

        graph = StateGraph(Board)
        graph.add_node("agent", player)
        graph.add_node("referee", referee)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", lambda state: END if state["moves"] >= 3 else "referee")
        graph.add_edge("referee", "agent")
        return graph.compile(checkpointer=checkpointer)

    @art.reward
    def game_result(state: Any) -> float:
        return digit_share(state)

    scenarios = [{"id": "game-1", "input": {"messages": [("user", "Your move: a number from 1 to 9.")], "moves": 0}}]
    return Given({"model": agent().names["model"], "build_game": build_game, "game_result": game_result,
                  "scenarios": scenarios})  # fmt: skip


@setup
def interrupts() -> Given:
    """``graph``: an agent whose answer a person approves (``interrupt()``); ``done``; ``agent``'s ``model``."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import interrupt

    names = agent().names

    def approve(state: MessagesState) -> dict[str, Any]:
        return {"messages": [("user", f"Reviewer: {interrupt('approve this answer?')}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [names["llm"].invoke(state["messages"])]})
    builder.add_node("approve", approve)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "approve")
    builder.add_edge("approve", END)

    @art.reward
    def done(state: Any) -> float:
        return float("approved" in state["messages"][-1].content)

    return Given({"model": names["model"], "graph": builder.compile(), "done": done})


@setup
def openai_judge() -> Given:
    """``ChatOpenAI(model="gpt-4.1")`` becomes ``judge_model()``: RULER's JSON, without a network or a key."""
    return Given({"ruler_answers": judge_model()}, replace={'ChatOpenAI(model="gpt-4.1")': "ruler_answers"})


@setup
def server() -> Given:
    """A ``langgraph-art serve`` stand-in: the embedded server on the tiny model, served as ``"tiny"``. A block's
    ``http://127.0.0.1:8000/v1`` is replaced by its address."""
    from langgraph_art.serve import EmbeddedServer

    running = EmbeddedServer("tiny").start()
    return Given({}, replace={"http://127.0.0.1:8000/v1": running.base_url})


def run_block(code: str, where: str, names: dict[str, Any]) -> str:
    """Run ``code`` in a namespace holding ``names``; what it printed."""
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    namespace = {"__name__": "__main__", **names}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if compiled.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(compiled, namespace))
        else:
            exec(compiled, namespace)
    return out.getvalue()


def main(blocks_file: str, results_file: str) -> None:
    global HOME
    blocks = json.loads(Path(blocks_file).read_text())
    root = Path(results_file).parent
    HOME = root / "setups" / ".art"
    cap_tiny_max_tokens()
    with open(results_file, "w") as results:
        for number, block in enumerate(blocks):
            folder = root / f"block-{number}"
            folder.mkdir()
            os.chdir(folder)
            os.environ["LANGGRAPH_ART_HOME"] = str(folder / ".art")
            started = time.perf_counter()
            result: dict[str, Any] = {"where": block["where"]}
            try:
                names: dict[str, Any] = {}
                code = block["code"]
                for name in block["setups"]:
                    given = SETUPS[name]()
                    names.update(given.names)
                    for old, new in given.replace.items():
                        code = code.replace(old, new)
                result["output"] = run_block(code, block["where"], names)
                result["ok"] = True
            except Exception:  # noqa: BLE001 - the block's error, whatever it is, is its test's failure message
                result["ok"] = False
                result["error"] = traceback.format_exc()
            result["seconds"] = round(time.perf_counter() - started, 2)
            results.write(json.dumps(result) + "\n")
            results.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
