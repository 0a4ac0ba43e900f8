"""``RayRollouts``: a training step's runs on Ray actors. Training on two workers stores every run once and trains
every step, also when a worker is killed in the middle of a step; a run whose worker dies more often than
``max_retries`` is a failed run, stored and counted; ``ChatART`` and a compiled graph holding it travel by pickle and
answer; bad settings are ``ConfigError``s that say what to change."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import langgraph_art as art  # noqa: E402
from langgraph_art.demos.units import build_agent, right_arguments  # noqa: E402
from langgraph_art.rollouts.pickling import dumps  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, SCENARIOS_PER_STEP, GENERATIONS = 5, 2, 8
RUNS_PER_STEP = SCENARIOS_PER_STEP * GENERATIONS


@art.reward(weight=0.01)
def spread(metadata: dict[str, Any]) -> float:
    """A little by the run's place in its group: every group's rewards differ whatever the tiny model samples (its
    sampling turns on the CPU's float rounding), so every GRPO step has something to train on."""
    return metadata["generation"] / GENERATIONS


def question(value: int) -> dict[str, Any]:
    """A question whose right call the random-init tiny model makes on some runs and not others (on this machine: at
    48 tokens it calls ``convert(..., "cm", "cm")`` with a value of repeated digits, 3333333 and 2222222 the most
    common, 13 and 5 of 24 runs); ``spread`` keeps each group's rewards apart elsewhere too."""
    text = f"Convert {value} centimeters to centimeters."
    return {"id": f"cm-{value}", "value": value, "from_unit": "cm", "to_unit": "cm",
            "input": {"messages": [("user", text)]}}  # fmt: skip


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[art.LocalBackend]:
    with art.LocalBackend(home=tmp_path_factory.mktemp("ray")) as local:
        yield local


def test_training_on_two_ray_workers_stores_every_run_once_and_survives_a_killed_worker(
    ray_session: None, backend: art.LocalBackend
) -> None:
    model = art.TrainableModel(name="units", project="ray-train").register(backend)
    llm = art.ChatART(model=model, max_tokens=48, temperature=1.0)  # type: ignore[call-arg,arg-type]
    with art.RayRollouts(num_workers=2) as rollouts:
        trainer = art.Trainer(
            build_agent(llm),
            model,
            rewards=[right_arguments, spread],
            num_generations=GENERATIONS,
            scenarios_per_step=SCENARIOS_PER_STEP,
            config=art.GRPOConfig(learning_rate=1e-5, seed=0),  # small steps: the sampling above stays as measured
            max_concurrency=4,  # 2 runs at a time per worker: a step lasts long enough to be hit in the middle
            rollouts=rollouts,
        )
        pids = rollouts.pids()
        assert len(pids) == 2 and os.getpid() not in pids
        killed: list[int] = []

        def kill_one_worker_in_step_two() -> None:
            """Once the second step's first run is stored (14 or more of its runs still to come), SIGKILL a worker."""
            deadline = time.monotonic() + 120
            while trainer.store.count() <= RUNS_PER_STEP and time.monotonic() < deadline:
                time.sleep(0.002)
            os.kill(pids[0], signal.SIGKILL)
            killed.append(trainer.store.count())

        killer = threading.Thread(target=kill_one_worker_in_step_two, daemon=True)
        killer.start()
        history = trainer.train([question(3333333), question(2222222)], steps=STEPS, progress=False)
        killer.join(timeout=5)
        after = rollouts.pids()

    assert killed and killed[0] < 2 * RUNS_PER_STEP, killed  # it was killed while step two's runs were under way
    # the death was seen in step two, once, and its runs were run again elsewhere; nothing failed, nothing was lost
    assert [m["rollouts/workers_lost"] for m in history] == [0.0, 1.0, 0.0, 0.0, 0.0], history
    assert history[1]["rollouts/retried"] >= 1 and sum(m["rollouts/retried"] for m in history[2:]) == 0
    assert [m["runs/failed"] for m in history] == [0.0] * STEPS
    # every step trained (a new checkpoint each), the one with the killed worker too
    rewards = [(m["reward/mean"], m["reward/std"]) for m in history]
    assert [m["train/updated"] for m in history] == [1.0] * STEPS, rewards
    assert [m["step"] for m in history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # each run stored exactly once: the step's 16 runs, one per (group, generation), nothing twice
    runs = trainer.store.trajectories()
    assert len(runs) == len({r.id for r in runs}) == STEPS * RUNS_PER_STEP
    assert Counter((r.group_id, r.metadata["generation"]) for r in runs).most_common(1)[0][1] == 1
    assert [trainer.store.count(step=k) for k in range(STEPS)] == [RUNS_PER_STEP] * STEPS
    assert all(r.status == "ok" and r.trainable_turns() for r in runs)
    # the dead worker was replaced: two workers live, the killed one not among them
    assert len(after) == 2 and pids[0] not in after and pids[1] in after


def test_a_run_whose_worker_dies_more_often_than_max_retries_is_a_failed_run(ray_session: None, tmp_path: Path) -> None:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        n: int

    signals = tmp_path / "signals"  # each run says it started, then waits for "go": in flight when the kill lands
    signals.mkdir()

    async def slow(state: State) -> dict[str, int]:  # pickled by value (a local function)
        import uuid

        (signals / f"started-{os.getpid()}-{uuid.uuid4().hex}").touch()
        while not (signals / "go").exists():
            await asyncio.sleep(0.02)
        return {"n": state["n"] + 1}

    builder = StateGraph(State)
    builder.add_node("slow", slow)
    builder.add_edge(START, "slow")
    builder.add_edge("slow", END)
    graph = builder.compile()
    store = art.TrajectoryStore(tmp_path / "runs.sqlite")
    with art.RayRollouts(num_workers=2, max_retries=0) as rollouts:
        pids = rollouts.pids()

        async def gather_and_kill() -> Any:
            scenarios = [{"id": "s", "input": {"n": 1}}]
            step = asyncio.ensure_future(rollouts.agather(graph, scenarios, 4, max_concurrency=4, store=store))
            deadline = time.monotonic() + 120
            while len(list(signals.glob("started-*"))) < 4 and time.monotonic() < deadline:  # all four running
                await asyncio.sleep(0.02)
            by_worker = Counter(int(path.name.split("-")[1]) for path in signals.glob("started-*"))
            assert by_worker == {pids[0]: 2, pids[1]: 2}, (by_worker, pids)  # two runs in flight on each worker
            os.kill(pids[0], signal.SIGKILL)
            await asyncio.sleep(0.5)  # its runs fail (nothing retries them), then the other worker's finish
            (signals / "go").touch()
            return await step

        (group,), metrics = asyncio.run(gather_and_kill())
    assert metrics == {"rollouts/retried": 0.0, "rollouts/workers_lost": 1.0}
    assert len(group.trajectories) == 4 and group.metadata["failed"] == 2  # the killed worker's two runs
    failed = group.failed
    assert all(t.error.startswith("WorkerLost: its rollout worker died, 1 time(s) (rollout-worker-1;") for t in failed)
    assert sorted(t.final_state["n"] for t in group.completed()) == [2, 2]  # the final state comes back
    stored = {t.id: t.status for t in store.trajectories()}
    assert stored == {t.id: t.status for t in group.trajectories}  # the failed ones are stored too
    assert store.count(status="failed") == 2 and len(store.groups()) == 1


def test_a_worker_ray_cannot_place_does_not_hold_the_step_up(ray_session: None) -> None:
    def add_one(state: dict) -> dict:
        return {"n": state["n"] + 1}

    with art.RayRollouts(num_workers=3) as rollouts:  # one CPU each, and Ray has 2: the third waits for a CPU
        started = time.monotonic()
        (group,), metrics = asyncio.run(rollouts.agather(one_node_graph(add_one), [{"input": {"n": 1}}], 4))
        assert time.monotonic() - started < 60  # not start_timeout (300 s)
        assert [t.final_state["n"] for t in group.trajectories] == [2, 2, 2, 2] and not group.failed
        # the runs go as soon as one worker holds the graph: on a loaded machine the four 1-node runs can finish on
        # the first before the second has loaded (CI saw 1); the third never gets a CPU
        assert len(rollouts.workers) == 3 and 1 <= [w.key is not None for w in rollouts.workers].count(True) <= 2
    assert metrics == {"rollouts/retried": 0.0, "rollouts/workers_lost": 0.0}


def test_a_chat_art_pickles_as_its_settings_and_answers_over_http(backend: art.LocalBackend) -> None:
    model = art.TrainableModel(name="chat", project="ray-pickle").register(backend)
    llm = art.ChatART(model=model, max_tokens=8, temperature=0.5, trainable=False)  # type: ignore[call-arg,arg-type]
    assert llm.in_process is not None  # here, the LocalBackend answers in process (not picklable)
    copy = pickle.loads(pickle.dumps(llm))
    assert type(copy) is art.ChatART
    assert (copy.openai_api_base, copy.model_name, copy.max_tokens, copy.temperature, copy.trainable) == (
        llm.openai_api_base, "ray-pickle/chat", 8, 0.5, False,
    )  # fmt: skip
    assert copy.openai_api_base.startswith("http://127.0.0.1:")
    assert copy.in_process is None and copy.http_client is None  # its own clients, over loopback HTTP
    assert copy.recorder is art.ChatART.unpickled_recorder() and copy.recorder is not model.recorder
    before = len(copy.recorder.unclaimed())
    answer = copy.invoke("hi")
    assert answer.response_metadata["model_name"].startswith("ray-pickle/chat")
    recorded = copy.recorder.unclaimed()[before:]
    assert len(recorded) == 1 and recorded[0].token_ids and not recorded[0].trainable


def test_a_compiled_graph_holding_a_chat_art_travels_and_runs(backend: art.LocalBackend) -> None:
    from langgraph.pregel._write import PASSTHROUGH

    # the cause this module's `dumps` fixes: cloudpickle copies LangGraph's identity sentinels...
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(PASSTHROUGH)) is not PASSTHROUGH
    assert pickle.loads(dumps([PASSTHROUGH]))[0] is PASSTHROUGH  # ...which `dumps` sends by reference
    model = art.TrainableModel(name="graph", project="ray-pickle").register(backend)
    graph = build_agent(art.ChatART(model=model, max_tokens=48))  # type: ignore[call-arg,arg-type]
    loaded = pickle.loads(dumps(graph))
    scenario = question(3333333)
    trajectory = art.rollout(loaded, scenario["input"], recorders=[art.ChatART.unpickled_recorder()])
    assert trajectory.status == "ok", trajectory.error
    assert len(trajectory.trainable_turns()) == 1
    assert [m.type for m in trajectory.final_state["messages"]] == ["human", "ai", "tool"]


def test_bad_settings_are_config_errors(
    ray_session: None, backend: art.LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(art.ConfigError, match=r"num_workers must be an int >= 1"):
            art.RayRollouts(num_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(art.ConfigError, match=r"max_retries must be an int >= 0"):
        art.RayRollouts(max_retries=-1)
    with pytest.raises(art.ConfigError, match=r"num_cpus_per_worker must be a number >= 0"):
        art.RayRollouts(num_cpus_per_worker=-1)
    model = art.TrainableModel(name="bad", project="ray-bad").register(backend)
    graph = build_agent(art.ChatART(model=model))  # type: ignore[call-arg,arg-type]
    with pytest.raises(art.ConfigError, match=r"rollouts must be None .* art\.RayRollouts\(num_workers=2\)"):
        art.Trainer(graph, model, rewards=[right_arguments], rollouts=object())  # type: ignore[arg-type]
    rollouts = art.RayRollouts(num_workers=1)
    lock = threading.Lock()

    def holds_a_lock(state: dict) -> dict:
        with lock:
            return {}

    with pytest.raises(art.ConfigError, match=r"does not pickle: TypeError: cannot pickle '_thread.lock'"):
        asyncio.run(rollouts.agather(one_node_graph(holds_a_lock), [{"input": {}}], 1))
    assert rollouts.workers == []  # nothing was started for it

    # a graph whose code the workers cannot import: said once, not as one failed run per run
    only_here = types.ModuleType("langgraph_art_test_only_here")
    exec("def node(state):\n    return {}\n", only_here.__dict__)
    monkeypatch.setitem(sys.modules, only_here.__name__, only_here)
    try:
        with pytest.raises(art.ConfigError, match=r"does not load on a Ray worker \(ModuleNotFoundError: .*only_here"):
            asyncio.run(rollouts.agather(one_node_graph(only_here.node), [{"input": {}}], 1))
    finally:
        rollouts.close()
    assert rollouts.workers == []

    monkeypatch.setitem(sys.modules, "ray", None)  # not installed
    with pytest.raises(art.ConfigError, match=r"RayRollouts needs Ray: pip install 'langgraph-art\[ray\]'"):
        art.RayRollouts()


def one_node_graph(node: Any) -> Any:
    """A one-node graph of ``node`` (over a plain dict state)."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        n: int

    builder = StateGraph(State)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    return builder.compile()
