"""Graphs compiled with a checkpointer of their own: an async saver (``AsyncSqliteSaver`` on a file) trains and
branches; a sync-only one (``SqliteSaver``) is refused before anything runs, with the async saver to compile with
instead; ``Branching(delete_threads=True)`` deletes the threads of every run the trainer made, evaluation runs too.
The backend is the fake one (it records the groups it is given)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art
from langgraph_art.capture.branching import Branching
from langgraph_art.testing import FakeBackend
from tests.test_branching import SCENARIO, check_continuations, counting_graph, trainer_for, weather_graph

GO = {"id": "go", "input": {"messages": [("user", "go")]}}
HELD_OUT = {"id": "held-out", "input": {"messages": [("user", "again")]}}


def sync_graph(checkpointer: Any) -> Any:
    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    return graph.compile(checkpointer=checkpointer)


@art.reward
def length(state: Any) -> float:
    return float(len(state["messages"]))


def test_a_sync_only_checkpointer_is_refused_up_front_naming_the_async_saver(tmp_path: Path) -> None:
    """SqliteSaver's async methods raise NotImplementedError, and runs are made with ``ainvoke``: every run of every
    step failed (a skipped step, one warning). Now the Trainer, ``arollout``, ``gather_groups`` and ``evaluate``
    refuse it before running anything."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = SqliteSaver(sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False))
    graph = counting_graph(saver)
    model = art.TrainableModel(name="sync", project="savers").register(FakeBackend(tmp_path))
    fix = r"SqliteSaver.*AsyncSqliteSaver \(langgraph\.checkpoint\.sqlite\.aio\).*AsyncPostgresSaver"
    with pytest.raises(art.ConfigError, match=fix):
        art.Trainer(graph, model, rewards=[length], langfuse=False)
    with pytest.raises(art.ConfigError, match=fix):  # the saver the trainer's copy of the graph would use
        art.Trainer(counting_graph().copy(update={"checkpointer": None}), model, rewards=[length],
                    branching=Branching(checkpointer=saver), langfuse=False)  # fmt: skip
    with pytest.raises(art.ConfigError, match=fix):
        asyncio.run(art.arollout(graph, GO["input"]))
    with pytest.raises(art.ConfigError, match=fix):
        art.gather_groups(graph, [GO], 2, progress=False)
    with pytest.raises(art.ConfigError, match=fix):
        art.evaluate(graph, [GO], [length])
    assert not list(saver.list(None))  # nothing ran
    run = art.rollout(sync_graph(saver), GO["input"])  # the sync rollout (graph.invoke) can use it
    assert run.status == "ok" and {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {
        run.metadata["thread_id"]
    }


def test_an_async_sqlite_saver_trains_and_branches_as_the_guide_shows(server: Any, tmp_path: Path) -> None:
    """docs/guides/branching.md: compile with ``AsyncSqliteSaver`` and ``await trainer.atrain(...)`` inside its
    ``async with``. Fork points come from its state history, continuations resume from its checkpoints, and the
    threads stay in the file (your checkpointer, your data)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    llm = art.ChatART(base_url=server.base_url, model="weather@1", temperature=0, max_tokens=48, max_retries=0)  # type: ignore[call-arg]

    async def train() -> tuple[FakeBackend, set[str]]:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
            trainer, backend = trainer_for(weather_graph(llm, checkpointer=saver), tmp_path, groups_per_step=1)
            await trainer.atrain([SCENARIO], steps=1, progress=False)
            return backend, {c.config["configurable"]["thread_id"] async for c in saver.alist(None)}

    backend, threads = asyncio.run(train())
    whole, branch = backend.received[0]
    check_continuations(whole, branch)
    assert threads == {t.metadata["thread_id"] for t in whole.trajectories}


@pytest.mark.parametrize("delete_threads", [True, None], ids=["delete", "keep"])
def test_delete_threads_deletes_the_evaluation_runs_threads_too(tmp_path: Path, delete_threads: bool | None) -> None:
    saver = InMemorySaver()
    model = art.TrainableModel(name="evals", project="savers").register(FakeBackend(tmp_path))
    trainer = art.Trainer(counting_graph(saver), model, rewards=[length], num_generations=2, eval_scenarios=[HELD_OUT],
                          branching=Branching(delete_threads=delete_threads), langfuse=False)  # fmt: skip
    trainer.train([GO], steps=2, progress=False)
    evaluated = trainer.store.trajectories(split="eval")
    trained = trainer.store.trajectories(split="train")
    assert len(trainer.evals) == 2 and len(evaluated) == 2 and len(trained) == 4
    assert all(t.metadata["thread_id"].startswith("art-") for t in evaluated + trained)
    left = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
    if delete_threads:
        assert left == set()  # neither the steps' runs nor the evaluations' are left in your checkpointer
    else:  # your checkpointer keeps them all unless asked (the trainer's own InMemorySaver copy: see test_branching)
        assert left == {t.metadata["thread_id"] for t in evaluated + trained}
