"""Training graphs we did not write, async graphs and notebooks (a running event loop), called repeatedly.

Every graph here reaches ChatART through ``ainvoke`` (LangGraph's async path), so every step's rollouts use the async
OpenAI client; before one event loop per training run, the second step of each failed with "Event loop is closed".
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art
from langgraph_art.sync import private_loop, run_sync
from langgraph_art.teacher import hint_question
from tests.helpers import get_weather

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@art.reward
def varied(metadata: dict[str, Any]) -> float:
    """Differs between the runs of a group whatever they sampled (the random tiny model often samples the same
    tokens every time): every group teaches, every step updates. These tests prove the plumbing under graphs we did
    not write; learning is proven in test_learning.py."""
    return metadata["generation"] / 4


SCENARIOS = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]
CONFIG = art.GRPOConfig(learning_rate=1e-4, seed=0)  # small: runs stay diverse, every step updates


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[art.LocalBackend]:
    with art.LocalBackend(home=tmp_path_factory.mktemp("home")) as local:
        yield local


def model_for(backend: art.LocalBackend, name: str) -> art.TrainableModel:
    return art.TrainableModel(name=name, project="async", base_model="tiny").register(backend)


def assert_trained(history: list[dict[str, float]], steps: int) -> None:
    """Every step ran its runs without a failure, and the policy moved (a checkpoint was written and served)."""
    assert len(history) == steps
    assert [m["runs/failed"] for m in history] == [0.0] * steps, history
    assert [m["train/updated"] for m in history] == [1.0] * steps
    assert [m["policy_step"] for m in history][-steps:] == [history[0]["policy_step"] + i for i in range(steps)]


def async_node_graph(llm: Any) -> Any:
    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    return graph.compile()


def test_chat_art_ainvoke_in_new_event_loops_and_in_two_loops_at_once(server: Any) -> None:
    llm = art.ChatART(base_url=server.base_url, model="tiny", max_tokens=4)
    for _ in range(3):  # each asyncio.run closes its loop; the next must not reuse its connections
        assert asyncio.run(llm.ainvoke("hi")).response_metadata["model_name"] == "tiny"
    errors: list[BaseException] = []

    def in_own_loop() -> None:
        try:
            for _ in range(3):
                asyncio.run(llm.ainvoke("hello"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=in_own_loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    transport = llm.root_async_client._client._transport
    assert transport.loops <= 3  # pools of closed loops are dropped, not accumulated


def test_async_node_graph_trains(backend: art.LocalBackend) -> None:
    model = model_for(backend, "async-node")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    trainer = art.Trainer(async_node_graph(llm), model, rewards=[varied], num_generations=4, config=CONFIG)
    assert_trained(trainer.train(SCENARIOS, steps=5, progress=False), 5)


def test_langchain_create_agent_trains_ten_steps(backend: art.LocalBackend) -> None:
    from langchain.agents import create_agent

    model = model_for(backend, "create-agent")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    graph = create_agent(model=llm, tools=[get_weather], system_prompt="Answer with numbers.")
    trainer = art.Trainer(graph, model, rewards=[varied], num_generations=4, config=CONFIG)
    history = trainer.train(SCENARIOS, steps=10, progress=False)
    assert_trained(history, 10)
    stored = [t for t in backend.store(model).trajectories(status="ok") if t.metadata["training_run"] == trainer.run_id]
    assert len(stored) == 40
    assert all(t.turns() and t.turns()[0].token_ids for t in stored)  # captured through create_agent's model node
    assert {s.name for t in stored for s in t.spans} >= {"model"}


def test_langgraph_prebuilt_create_react_agent_trains(backend: art.LocalBackend) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of langchain's create_agent, still widely used
        from langgraph.prebuilt import create_react_agent

        model = model_for(backend, "react-agent")
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
        graph = create_react_agent(llm, [get_weather])
    trainer = art.Trainer(graph, model, rewards=[varied], num_generations=4, config=CONFIG)
    assert_trained(trainer.train(SCENARIOS, steps=5, progress=False), 5)


async def test_atrain_inside_a_running_loop_like_a_notebook(
    backend: art.LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_for(backend, "notebook-async")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    trainer = art.Trainer(async_node_graph(llm), model, rewards=[varied], num_generations=4, config=CONFIG)
    tick = threading.Event()

    async def heartbeat() -> None:  # the notebook's own work on its loop (its period is the scenario, not measured)
        while True:
            await asyncio.sleep(0.01)
            tick.set()

    # the notebook's loop stays responsive while the warm-up and each step train: every one of those calls waits,
    # before it returns, for a heartbeat that came after it began; one that ran on (and so blocked) the loop would
    # wait in vain and fail
    calls: list[str] = []

    def beating_meanwhile(name: str) -> None:
        call = getattr(backend, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tick.clear()
            result = call(*args, **kwargs)
            if not tick.wait(60):
                raise AssertionError(f"the event loop did not run while {name} was under way")
            calls.append(name)
            return result

        monkeypatch.setattr(backend, name, wrapped)

    beating_meanwhile("warmup")
    beating_meanwhile("train_step")
    beating = asyncio.create_task(heartbeat())
    try:
        hello = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]
        await trainer.awarmup([{"messages": hello}], steps=2)
        history = await trainer.atrain(SCENARIOS, steps=3, progress=False)
        history = await trainer.atrain(SCENARIOS, steps=2, progress=False)  # a second cell, same loop
    finally:
        beating.cancel()
    assert_trained(history, 5)
    assert calls == ["warmup"] + ["train_step"] * 5


async def test_sync_train_called_inside_a_running_loop_twice(backend: art.LocalBackend) -> None:
    model = model_for(backend, "notebook-sync")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    trainer = art.Trainer(async_node_graph(llm), model, rewards=[varied], num_generations=4, config=CONFIG)
    trainer.train(SCENARIOS, steps=2, progress=False)
    history = trainer.train(SCENARIOS, steps=2, progress=False)
    assert_trained(history, 4)
    # and the async client still works on this (the notebook's) loop afterwards
    assert (await llm.ainvoke("hi")).response_metadata["model_name"].startswith("async/notebook-sync@")


def test_gather_and_score_repeatedly_from_sync_code_with_an_async_judge_model(server: Any) -> None:
    """An async client created in one sync call (here the judge's) must still work in the next."""
    from langchain_core.messages import AIMessage

    from tests.helpers import one_agent_graph

    llm = art.ChatART(base_url=server.base_url, model="tiny", max_tokens=4)
    loops: set[int] = set()

    @art.reward
    async def same_loop_every_time() -> float:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0)
        return 1.0

    for _ in range(3):
        groups = art.gather_groups(one_agent_graph(llm), SCENARIOS, 2, progress=False)
        report = art.score_groups(groups, [same_loop_every_time])
        assert report.metrics["reward/total"] == 1.0
        assert all(isinstance(t.final_state["messages"][-1], AIMessage) for t in groups[0].trajectories)
    assert loops == {id(private_loop())}


def test_run_sync_from_the_private_loop_thread_and_contextvars() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def inner() -> str:
        return var.get()

    async def outer() -> str:
        # a sync function called on the private loop's own thread must not deadlock
        return await asyncio.get_running_loop().run_in_executor(None, lambda: "x") + run_sync(inner())

    var.set("caller")
    assert run_sync(inner()) == "caller"
    assert run_sync(outer()) == "xcaller"


def test_sync_nodes_of_concurrent_runs_all_run_at_once_from_sync_code() -> None:
    """LangGraph runs a sync node in the loop's default executor; asyncio's has cpu_count + 4 threads (6 here), so
    32 runs of a sync-node graph sampled six at a time (1.06-1.34 s a round against 0.41-0.58 s with an async node).
    Every run's node waits here for all 32: with six threads the barrier breaks and the runs fail."""
    runs = 32
    barrier = threading.Barrier(runs, timeout=30)

    def node(state: MessagesState) -> dict:
        barrier.wait()
        return {"messages": [("ai", "done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("wait_for_all", node)
    graph.add_edge(START, "wait_for_all")
    scenarios = [{"id": "s", "input": {"messages": [("user", "hi")]}}]
    groups = art.gather_groups(graph.compile(), scenarios, runs, max_concurrency=runs, progress=False)
    assert not groups[0].failed and len(groups[0].trajectories) == runs and not barrier.broken


def test_run_sync_re_raises_and_cancels_on_ctrl_c() -> None:
    import os
    import signal

    async def boom() -> None:
        raise ValueError("from the coroutine")

    with pytest.raises(ValueError, match="from the coroutine"):
        run_sync(boom())

    running, cancelled, done = threading.Event(), threading.Event(), threading.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.sleep(60)  # a coroutine that runs until it is cancelled (the kill comes long before)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    def ctrl_c_once_running() -> None:  # Ctrl-C while run_sync waits for the coroutine, not before it started
        if running.wait(30) and not done.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    threading.Thread(target=ctrl_c_once_running, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sync(forever())
    finally:
        done.set()
        signal.signal(signal.SIGUSR1, previous)
    assert cancelled.wait(30), "run_sync did not cancel the coroutine on Ctrl-C"


def test_ruler_judge_on_plain_chat_openai_scores_repeatedly_from_sync_code(server: Any) -> None:
    """langchain-openai caches one async client per base URL; each sync score_groups used to get a new event loop,
    so the judge's second call failed with 'Event loop is closed'. The tiny model answers no usable verdict: the
    group is skipped, which needs every call (and retry) to go through."""
    from langchain_openai import ChatOpenAI

    from tests.helpers import one_agent_graph

    judge_model = ChatOpenAI(base_url=server.base_url, api_key="unused", model="tiny", max_tokens=4, max_retries=0)
    judge = art.RulerJudge(judge_model, on_error="skip", max_retries=1, cache=False)
    llm = art.ChatART(base_url=server.base_url, model="tiny", max_tokens=4)
    groups = art.gather_groups(one_agent_graph(llm), SCENARIOS, 2, progress=False)
    for round_ in range(1, 4):
        report = art.score_groups(groups, [judge])
        assert report.skipped_groups and "no usable verdict" in next(iter(report.skipped_groups.values()))
        assert judge.usage["calls"] == 2 * round_  # first try + one retry, every round


@pytest.fixture(scope="module")
def process_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[art.LocalBackend]:
    with art.LocalBackend(home=tmp_path_factory.mktemp("home"), trainer_process=True) as local:
        yield local


@pytest.mark.parametrize("where", ["in-process", "trainer-process"])
async def test_pipelined_create_agent_trains_inside_a_running_loop(where: str, request: pytest.FixtureRequest) -> None:
    """max_steps_off_policy=1 on a graph we did not write, from a notebook's running loop: the next step's rollouts
    (create_agent's async model node, through the in-process client and a continuously batched engine) overlap
    the update, with the trainer in this process or in a child (``trainer_process=True``)."""
    from langchain.agents import create_agent

    backend = request.getfixturevalue("backend" if where == "in-process" else "process_backend")
    model = model_for(backend, "pipelined-agent")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    graph = create_agent(model=llm, tools=[get_weather], system_prompt="Answer with numbers.")
    trainer = art.Trainer(graph, model, rewards=[varied], num_generations=4, config=CONFIG, max_steps_off_policy=1)
    history = await trainer.atrain(SCENARIOS, steps=6, progress=False)
    assert [m["runs/failed"] for m in history] == [0.0] * 6 and [m["train/updated"] for m in history] == [1.0] * 6
    first = history[0]["policy_step"]  # each step's runs sampled with the checkpoint one or zero updates back
    assert all(first + i - 1 <= m["policy_step"] <= first + i for i, m in enumerate(history))
    assert all(m["off_policy/steps_max"] <= 1 for m in history)
    stored = [t for t in backend.store(model).trajectories(status="ok") if t.metadata["training_run"] == trainer.run_id]
    assert len(stored) == 24 and all(t.reward is not None for t in stored)


async def test_create_agent_with_evaluation_and_a_sink_inside_a_running_loop(backend: art.LocalBackend) -> None:
    """Evaluation and the sinks on a graph we did not write (create_agent's async model node), awaited in a running
    loop: held-out runs before, between and after the steps, stored as split="eval", every record to the sink."""
    from langchain.agents import create_agent

    records: list[dict[str, Any]] = []

    class Keep:
        name = "keep"

        def start(self, info: Any) -> None:
            pass

        def submit(self, record: Any) -> None:
            records.append(dict(record))

        def finish(self, *, curve: Any, timeout: float) -> None:
            pass

    model = model_for(backend, "evaluated-agent")
    graph = create_agent(model=art.ChatART(model=model, temperature=1.0, max_tokens=8), tools=[get_weather])
    held_out = [{"id": "held-out", "input": {"messages": [("user", "Weather in Oslo?")]}}]
    trainer = art.Trainer(graph, model, rewards=[varied], num_generations=4, config=CONFIG, eval_scenarios=held_out,
                          eval_every=1, eval_generations=2, sinks=[Keep()])  # fmt: skip
    history = await trainer.atrain(SCENARIOS, steps=2, progress=False)
    assert len(history) == 2 and [e["iteration"] for e in trainer.evals] == [0, 1, 2]
    assert [(r["split"], r["iteration"]) for r in records] == [
        ("eval", 0), ("train", 1), ("eval", 1), ("train", 2), ("eval", 2)
    ]  # fmt: skip
    runs = [t for t in backend.store(model).trajectories(split="eval") if t.metadata["training_run"] == trainer.run_id]
    assert len(runs) == 6 and all(t.status == "ok" and t.turns() for t in runs)
    assert {t.metadata["policy_step"] for t in runs} == {e["policy_step"] for e in trainer.evals}


def test_a_ctrl_c_during_the_hand_over_still_cancels_the_coroutine() -> None:
    """The interrupt lands after the coroutine was scheduled on the private loop but before the caller holds its
    future (writing to the loop's wake-up pipe lets other threads run first): it must still be cancelled, not left
    running in the background (seen under two pytest workers, where the main thread is often switched out)."""
    loop = private_loop()
    running, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def scheduled_then_interrupted(callback: Any, *args: Any, **kwargs: Any) -> Any:
        original(callback, *args, **kwargs)
        assert running.wait(30)  # the coroutine runs on the loop by now
        raise KeyboardInterrupt

    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = scheduled_then_interrupted  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sync(forever())
    finally:
        del loop.call_soon_threadsafe  # the class's method again
    assert cancelled.wait(30), "the coroutine kept running after Ctrl-C"


async def test_create_agent_learns_from_a_teacher_with_dynamic_sampling_inside_a_running_loop(
    backend: art.LocalBackend,
) -> None:
    """A privileged teacher and dynamic sampling on a graph we did not write (create_agent's async model node),
    awaited in a running loop: a reward that cannot tell the runs apart (every group uniform) samples the further
    scenario each step, and the teacher, shown a hint, still trains every step."""
    from langchain.agents import create_agent

    model = model_for(backend, "taught-agent")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
    graph = create_agent(model=llm, tools=[get_weather], system_prompt="Answer with numbers.")

    def hinted(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*messages[:-1], {**messages[-1], "content": f"{messages[-1]['content']} (Hint: 42.)"}]

    same = art.reward(lambda state: 1.0, name="same")
    teacher = art.Teacher(model="base", prompt=hinted)
    trainer = art.Trainer(graph, model, rewards=[same], num_generations=4, config=CONFIG, teacher=teacher,
                          dynamic_sampling=1)  # fmt: skip
    history = await trainer.atrain(SCENARIOS, steps=2, progress=False)
    assert_trained(history, 2)  # uniform groups, yet every step updates: the teacher's term
    assert all(m["dynamic_sampling/uniform_groups"] == 1 and m["dynamic_sampling/extra_groups"] == 1 for m in history)
    assert all(m["train/teacher/tokens"] > 0 and m["train/teacher/advantage_share"] == 1.0 for m in history)
    runs = [t for t in backend.store(model).trajectories(status="ok") if t.metadata["training_run"] == trainer.run_id]
    assert len(runs) == 16 and all("Hint: 42." in str(turn.teacher_messages) for t in runs for turn in t.turns())


async def test_the_teachers_agreement_with_the_reward_is_measured_on_an_async_node_inside_a_running_loop(
    backend: art.LocalBackend,
) -> None:
    """An ``async def`` node, awaited in a running loop, with a reward that tells the runs apart: each step says
    whether the privileged teacher prefers the runs the reward prefers (a correlation, so within [-1, 1]). (The tiny
    model under create_agent's system prompt writes the same newlines in every run: nothing to rank there.)"""
    model = model_for(backend, "agreeing-agent")
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)

    def hinted(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return hint_question(messages, " (Hint: 42.)")

    def length(state: dict[str, Any]) -> float:  # how much the agent wrote: runs sampled at 1.0 differ
        return float(len(state["messages"][-1].content))

    teacher = art.Teacher(model="base", prompt=hinted)
    rewards = [art.reward(length, name="length")]
    trainer = art.Trainer(
        async_node_graph(llm), model, rewards=rewards, num_generations=8, config=CONFIG, teacher=teacher
    )
    history = await trainer.atrain(SCENARIOS, steps=2, progress=False)
    assert_trained(history, 2)
    agreements = [m["train/teacher/reward_agreement"] for m in history if "train/teacher/reward_agreement" in m]
    assert agreements and all(-1.0 <= a <= 1.0 for a in agreements), history
    assert all(0.0 < m["train/teacher/advantage_share"] < 1.0 for m in history if "train/teacher/reward_agreement" in m)
