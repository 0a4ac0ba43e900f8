"""rollout / gather_groups and the SQLite store: failure policy, queries, export, crash safety."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_art.capture.chat_model import ChatART
from langgraph_art.capture.rollout import RolloutError, gather_groups, rollout, scenario_id
from langgraph_art.errors import ConfigError
from langgraph_art.store import TrajectoryStore
from langgraph_art.types import Trajectory
from tests.helpers import async_wait_until

pytestmark = pytest.mark.integration


def flaky_graph(llm: ChatART) -> Any:
    """Answers with the model; the 'tool' node raises when the user asks for 'boom'."""

    def think(state: MessagesState) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    def tool(state: MessagesState) -> dict:
        if "boom" in str(state["messages"][0].content):
            raise RuntimeError("tool exploded")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("tool", tool)
    graph.add_edge(START, "think")
    graph.add_edge("think", "tool")
    return graph.compile()


@pytest.fixture
def llm(server: Any) -> ChatART:
    return ChatART(base_url=server.base_url, model="tiny", max_tokens=6, max_retries=0)


def test_rollout_returns_trajectory_with_python_state(llm: ChatART, tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.sqlite")
    trajectory = rollout(flaky_graph(llm), {"messages": [("user", "hi")]}, metadata={"policy_step": 3}, store=store)
    assert trajectory.status == "ok" and trajectory.metadata["policy_step"] == 3
    assert isinstance(trajectory.final_state["messages"][-1], AIMessage)  # objects, for reward functions
    assert trajectory.output["messages"][-1]["role"] == "assistant"  # JSON, for the store
    assert [t.model_dump() for t in store.trajectories(step=3)] == [trajectory.model_dump()]

    failed = rollout(flaky_graph(llm), {"messages": [("user", "boom")]}, store=store)
    assert failed.status == "failed" and "tool exploded" in (failed.error or "")
    assert store.count(status="failed") == 1


def test_gather_groups_keeps_failures_out_of_training_but_in_the_store(llm: ChatART, tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.sqlite")
    scenarios = [
        {"id": "fine", "input": {"messages": [("user", "hello")]}},
        {"id": "bad", "input": {"messages": [("user", "boom")]}, "answer": "n/a"},
    ]
    groups = gather_groups(
        flaky_graph(llm),
        scenarios,
        num_generations=3,
        max_concurrency=4,
        store=store,
        metadata={"policy_step": 0},
        progress=False,
    )
    fine, bad = groups
    assert fine.scenario_id == "fine" and len(fine.completed()) == 3 and fine.metadata["failed"] == 0
    assert bad.metadata["failed"] == 3 and bad.completed() == [] and len(bad.trajectories) == 3
    assert all(t.group_id == fine.id and t.metadata["generation"] in (0, 1, 2) for t in fine.trajectories)
    assert store.count() == 6 and store.count(status="failed") == 3
    assert store.count(scenario_id="bad", status="failed") == 3
    assert store.count(node="think") == 6 and store.count(node="tool") == 6 and store.count(node="nope") == 0
    assert store.count(step=0) == 6 and store.count(step=1) == 0
    stored = {g.scenario_id: g for g in store.groups(step=0)}
    assert stored["bad"].scenario["answer"] == "n/a" and len(stored["fine"].trajectories) == 3

    with pytest.raises(RolloutError, match="3 run\\(s\\) failed"):
        gather_groups(
            flaky_graph(llm), scenarios[1:], num_generations=3, on_failure="raise", store=store, progress=False
        )
    assert store.count(status="failed") == 6  # raised only after every run was stored


def waiting_graph(release: Any, others: asyncio.Event | None = None) -> Any:
    """Runs of scenario 'slow' wait for ``release`` (an asyncio.Event); of the others the first ends at once and the
    rest wait for ``others`` when it is given (else they end at once too)."""
    started = []

    async def work(state: MessagesState) -> dict:
        if state["messages"][0].content == "slow":
            await release.wait()
        else:
            started.append(1)
            if others is not None and len(started) > 1:
                await others.wait()
        return {"messages": [AIMessage("done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    return graph.compile()


def test_runs_are_stored_as_they_finish_and_a_cancelled_gather_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_art.capture import rollout as rollout_module
    from langgraph_art.capture.rollout import agather_groups

    store = TrajectoryStore(tmp_path / "t.sqlite")
    scenarios = [{"id": "fast", "input": {"messages": [("user", "fast")]}},
                 {"id": "slow", "input": {"messages": [("user", "slow")]}}]  # fmt: skip

    async def stored_while_others_run() -> None:
        release = asyncio.Event()
        task = asyncio.ensure_future(
            agather_groups(waiting_graph(release), scenarios, 4, max_concurrency=8, store=store, progress=False)
        )
        # the fast runs are stored while the slow ones still wait (they wait until release, however long this takes)
        await async_wait_until(lambda: store.count(scenario_id="fast") == 4, "the fast runs to be stored")
        assert store.count(scenario_id="slow") == 0 and not task.done()
        release.set()
        await task

    asyncio.run(stored_while_others_run())
    assert store.count() == 8

    slow_store = TrajectoryStore(tmp_path / "slow.sqlite")
    write, writes = slow_store.add_trajectories, []
    writing, may_write = threading.Event(), threading.Event()

    def slow_write(trajectories: Any) -> None:  # a slow disk: it finishes when the test says so
        writes.append(len(trajectories))
        writing.set()
        if not may_write.wait(60):
            raise AssertionError("the test never let the write finish")
        write(trajectories)

    slow_store.add_trajectories = slow_write  # type: ignore[method-assign]
    handed: list[str] = []  # the finished runs given to the store's writer
    add = rollout_module.RunWriter.add
    monkeypatch.setattr(rollout_module.RunWriter, "add", lambda self, t: (handed.append(t.id), add(self, t))[-1])

    async def cancelled() -> None:
        others = asyncio.Event()
        graph = waiting_graph(asyncio.Event(), others=others)  # the slow runs never end
        task = asyncio.ensure_future(agather_groups(graph, scenarios, 4, store=slow_store, progress=False))
        await async_wait_until(writing.is_set, "the first fast run's write to start")
        others.set()  # the other fast runs finish while that write is under way: they queue behind it
        await async_wait_until(lambda: len(handed) == 4, "the other fast runs to finish")
        task.cancel()
        may_write.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())  # the loop closes at once: what was not written by then would be lost
    assert writes == [1, 3]  # the write under way at the cancel, and the runs queued behind it
    assert slow_store.count(scenario_id="fast") == 4 and slow_store.count() == 4


def test_a_failed_write_is_raised_and_the_other_runs_are_stored(tmp_path: Path, caplog: Any) -> None:
    store = TrajectoryStore(tmp_path / "t.sqlite")
    write, calls = store.add_trajectories, []

    def first_write_fails(trajectories: Any) -> None:
        calls.append(list(trajectories))
        if len(calls) == 1:
            raise OSError("disk full")
        write(calls[-1])

    store.add_trajectories = first_write_fails  # type: ignore[method-assign]
    scenarios = [{"id": f"s{i}", "input": {"messages": [("user", "fast")]}} for i in range(3)]
    with pytest.raises(OSError, match="disk full"):
        gather_groups(waiting_graph(None), scenarios, 4, max_concurrency=12, store=store, progress=False)
    lost = {t.id for t in calls[0]}
    assert store.count() == 12 - len(lost) and len(lost) >= 1  # every other run is stored
    assert all(i in caplog.text for i in lost)  # the ones that are not are named in the log


def test_bad_scenarios_and_settings_say_what_to_fix(llm: ChatART) -> None:
    graph = flaky_graph(llm)
    with pytest.raises(ConfigError, match="'input' key"):
        gather_groups(graph, [{"messages": []}], progress=False)
    with pytest.raises(ConfigError, match="num_generations"):
        gather_groups(graph, [{"input": {}}], num_generations=0, progress=False)
    assert scenario_id({"input": {"q": 1}}) == scenario_id({"input": {"q": 1}}) != scenario_id({"input": {"q": 2}})


def test_export_jsonl_and_parquet(llm: ChatART, tmp_path: Path) -> None:
    store = TrajectoryStore.for_project("demo", home=tmp_path)
    assert store.path == tmp_path / "demo" / "trajectories.sqlite"
    gather_groups(
        flaky_graph(llm), [{"input": {"messages": [("user", "x")]}}], num_generations=2, store=store, progress=False
    )
    assert store.export_jsonl(tmp_path / "out.jsonl") == 2
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert {Trajectory.model_validate_json(line).id for line in lines} == {t.id for t in store.trajectories()}
    import pyarrow.parquet as pq

    assert store.export_parquet(tmp_path / "out.parquet") == 2
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 2 and set(table.column_names) >= {"id", "status", "data"}
    assert json.loads(table.column("data")[0].as_py())["status"] == "ok"
    with pytest.raises(ConfigError, match="plain folder names"):
        TrajectoryStore.for_project("../escape", home=tmp_path)


@pytest.mark.slow
def test_a_killed_process_loses_only_runs_in_flight(tmp_path: Path) -> None:
    """A writer process is SIGKILLed mid-stream; every trajectory it finished is intact in the store."""
    db = tmp_path / "t.sqlite"
    script = textwrap.dedent(f"""
        import sys, time
        from langgraph_art.store import TrajectoryStore
        from langgraph_art.types import Trajectory, NodeSpan
        store = TrajectoryStore({str(db)!r})
        for i in range(100000):
            t = Trajectory(id=f"t{{i}}", status="ok", spans=[NodeSpan(id=f"s{{i}}", name="n" * 500)])
            store.add_trajectory(t)
            print(i, flush=True)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.stdout is not None
    last = -1
    deadline = time.monotonic() + 60
    while last < 200 and time.monotonic() < deadline:
        last = int(proc.stdout.readline())
    assert last >= 200, f"the writer reported only {last + 1} runs in 60 s"  # mid-stream, not at its start
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = TrajectoryStore(db)
    count = store.count()
    assert count >= last + 1  # everything reported done (printed after its commit) survived
    assert [t.id for t in store.trajectories()][:3] == ["t0", "t1", "t2"]
    assert all(t.spans[0].name == "n" * 500 for t in store.trajectories())  # no torn rows
    with store._lock:
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_progress_bar_path_runs_with_any_chat_model() -> None:
    from langchain_core.language_models import FakeListChatModel

    fake = FakeListChatModel(responses=["a", "b"])
    graph = StateGraph(MessagesState)
    graph.add_node("think", lambda s: {"messages": [fake.invoke(s["messages"])]})
    graph.add_edge(START, "think")
    (group,) = gather_groups(
        graph.compile(), [{"input": {"messages": [("user", "x")]}}], num_generations=2, progress=True
    )
    assert len(group.completed()) == 2
    assert all(t.turns()[0].source == "other" and not t.trainable_turns() for t in group.trajectories)


def test_delivery_ledger_answers_for_the_keys_asked(tmp_path) -> None:
    from langgraph_art.store import TrajectoryStore

    with TrajectoryStore(tmp_path / "ledger.sqlite") as store:
        store.mark_delivered("langfuse", [(f"k{i}", f"d{i}") for i in range(1200)])
        store.mark_delivered("other", [("k1", "x")])
        asked = [f"k{i}" for i in range(100, 1300)] + ["k100"]  # more than one lookup chunk, a repeat, unknowns
        assert store.delivered("langfuse", asked) == {f"k{i}": f"d{i}" for i in range(100, 1200)}
        assert len(store.delivered("langfuse")) == 1200 and store.delivered("other") == {"k1": "x"}
        store.mark_delivered("langfuse", [("k5", "changed")])
        assert store.delivered("langfuse", ["k5"]) == {"k5": "changed"}
