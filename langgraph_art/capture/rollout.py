"""Run a graph and capture it: ``rollout`` (one run) and ``gather_groups`` (each scenario N times, concurrently).

Failure policy: a run whose graph raises becomes a ``failed`` trajectory with the error; it is stored, counted
and excluded from training (``TrajectoryGroup.completed()``); the rest of its group is unaffected. Pass
``on_failure="raise"`` to raise ``RolloutError`` after the whole batch has finished and been stored instead.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import hashlib
import inspect
import json
import logging
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig

from langgraph_art.capture.callbacks import TrajectoryCallbackHandler
from langgraph_art.capture.messages import to_jsonable
from langgraph_art.capture.recorder import TurnRecorder
from langgraph_art.errors import ConfigError, RolloutError
from langgraph_art.progress import ProgressBar
from langgraph_art.store import TrajectoryStore
from langgraph_art.sync import run_sync
from langgraph_art.types import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)


def _config(
    config: RunnableConfig | None, handler: TrajectoryCallbackHandler, metadata: Mapping[str, Any]
) -> RunnableConfig:
    merged: dict[str, Any] = dict(config or {})
    callbacks = merged.get("callbacks")
    if callbacks is None:
        merged["callbacks"] = [handler]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=True)
        merged["callbacks"] = manager
    else:
        merged["callbacks"] = [*callbacks, handler]
    merged["metadata"] = {**(merged.get("metadata") or {}), **metadata}
    return merged  # type: ignore[return-value]


def _finish(
    handler: TrajectoryCallbackHandler,
    run_key: str,
    metadata: Mapping[str, Any],
    state: Any,
    error: BaseException | None,
    started: float,
) -> Trajectory:
    found = sorted((t for t in handler.take() if t.metadata.get("langgraph_art_run") == run_key),
                   key=lambda t: t.start_time)  # fmt: skip
    if found:
        trajectory = _merge(found)
    else:  # the graph failed before any callback fired (e.g. bad input): still leave a record
        trajectory = Trajectory(
            id=uuid.uuid4().hex,
            start_time=started,
            end_time=time.time(),
            metadata={k: to_jsonable(v) for k, v in metadata.items()},
        )
        trajectory.status = "failed" if error is not None else "ok"
    if error is not None and trajectory.status != "failed":
        trajectory.status = "failed"
    if error is not None and trajectory.error is None:
        trajectory.error = f"{type(error).__name__}: {error}"
    trajectory.final_state = state
    return trajectory


def _merge(parts: list[Trajectory]) -> Trajectory:
    """One trajectory of a run resumed after interrupts (one root run per ``invoke``): the first's id and input,
    every part's spans, turns and tool calls in order, the last part's output and status (failed if any failed)."""
    first, last = parts[0], parts[-1]
    if len(parts) == 1:
        return first
    failed = next((p for p in parts if p.status == "failed"), None)
    return first.model_copy(update={
        "spans": [s for p in parts for s in p.spans],
        "root_turns": [t for p in parts for t in p.root_turns],
        "root_tool_calls": [c for p in parts for c in p.root_tool_calls],
        "output": last.output,
        "status": failed.status if failed else last.status,
        "error": failed.error if failed else last.error,
        "end_time": last.end_time,
        "metadata": {**first.metadata, "resumes": len(parts) - 1},
    })  # fmt: skip


MAX_RESUMES = 100


def _interrupts(state: Any) -> Any:
    """The interrupts a finished ``invoke`` stopped at (its output's ``__interrupt__``), or None."""
    return state.get("__interrupt__") if isinstance(state, Mapping) else None


def _run_config(config: RunnableConfig | None, handler: TrajectoryCallbackHandler, meta: dict[str, Any]) -> Any:
    """The run's config: the handler and metadata added, and a thread of its own (``art-<run key>``) unless the
    config names one. A graph with a checkpointer needs a thread; one without ignores it. The thread is recorded in
    the run's metadata (its checkpoints are where branching forks)."""
    configurable = dict((config or {}).get("configurable") or {})
    configurable.setdefault("thread_id", f"art-{meta['langgraph_art_run']}")
    meta["thread_id"] = str(configurable["thread_id"])
    return _config({**(config or {}), "configurable": configurable}, handler, meta)


def find_pregel(graph: Any) -> Any:
    """The compiled LangGraph graph inside ``graph`` (itself, or under ``with_config``/``bind`` wrappers), or None."""
    from langgraph.pregel import Pregel

    while isinstance(graph, RunnableBinding):
        graph = graph.bound
    return graph if isinstance(graph, Pregel) else None


ASYNC_SAVER_METHODS = ("aget_tuple", "aput", "aput_writes")  # what graph.ainvoke calls on a checkpointer
HISTORY_METHODS = ("alist",)  # what resuming after interrupts and branching's state history call besides


def check_checkpointer(graph: Any, *, history: bool = False) -> None:
    """Runs are made with ``graph.ainvoke``: a graph whose checkpointer has no async methods (``SqliteSaver``: they
    raise NotImplementedError) would fail every run. Refuse it up front with the async saver to compile with
    instead. ``history``: the async listing is needed too (``resume``, branching). A graph without a checkpointer,
    or not a compiled LangGraph graph, passes."""
    pregel = find_pregel(graph)
    saver = getattr(pregel, "checkpointer", None)
    if saver in (None, False, True):  # none, or a subgraph's "use the parent's"
        return
    kind: type = type(saver)
    needed = (*ASYNC_SAVER_METHODS, *(HISTORY_METHODS if history else ()))
    missing = [name for name in needed if _not_implemented(kind, name)]
    if missing:
        name = kind.__name__
        raise ConfigError(
            f"the graph's checkpointer, {name}, has no async {'/'.join(missing)} (they raise NotImplementedError), "
            "and runs are made with graph.ainvoke: compile the graph with an async saver, AsyncSqliteSaver "
            "(langgraph.checkpoint.sqlite.aio), AsyncPostgresSaver (langgraph.checkpoint.postgres.aio) or "
            "InMemorySaver, or without one. An AsyncSqliteSaver is made in async code: `async with "
            "AsyncSqliteSaver.from_conn_string('checkpoints.db') as saver:`, then `graph = "
            "builder.compile(checkpointer=saver)` and `await trainer.atrain(...)` inside that block. (The sync "
            f"art.rollout(...) can use {name}.)"
        )


@functools.cache
def _not_implemented(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is missing or its body is only ``raise NotImplementedError(...)`` (after a docstring;
    an async generator's unreachable ``yield`` aside): how ``BaseCheckpointSaver`` declares its async methods and
    ``SqliteSaver`` overrides them. A method whose source cannot be read is taken as implemented."""
    method = getattr(cls, name, None)
    if method is None:
        return True
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(method))))
    except (OSError, TypeError, SyntaxError):
        return False
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant | ast.Yield))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


async def _alatest(graph: Runnable, config: Mapping[str, Any], run_key: str) -> Any:
    """The config of this run's latest checkpoint on its thread (runs forked on one thread are told apart by
    the run key that LangGraph copies from the run's metadata into each checkpoint's)."""
    pregel = find_pregel(graph)
    if pregel is None or not pregel.checkpointer:
        raise ConfigError("resume=... needs a compiled LangGraph graph with a checkpointer (interrupt() needs one "
                          "too): graph.compile(checkpointer=InMemorySaver())")  # fmt: skip
    thread = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
    latest = None  # the saver has an async list: check_checkpointer(history=True) made sure
    async for item in pregel.checkpointer.alist(thread, filter={"langgraph_art_run": run_key}, limit=1):
        latest = item
    if latest is None:
        raise ConfigError(f"no checkpoint of run {run_key} on thread {thread['configurable']['thread_id']}")
    return {**config, "configurable": {**config["configurable"], **latest.config["configurable"]}}


async def _aresumed(graph: Runnable, state: Any, config: Any, run_key: str, resume: Callable[[Any, Any], Any]) -> Any:
    """Resume an interrupted run with ``Command(resume=resume(interrupts, state))`` until it no longer stops at
    an interrupt (each resume is another root run of the same run key; ``_merge`` joins them)."""
    from langgraph.types import Command

    for _ in range(MAX_RESUMES):
        interrupts = _interrupts(state)
        if not interrupts:
            return state
        value = resume(interrupts, state)
        if inspect.isawaitable(value):
            value = await value
        state = await graph.ainvoke(Command(resume=value), await _alatest(graph, config, run_key))
    if _interrupts(state):
        raise RuntimeError(
            f"the run still stopped at an interrupt after {MAX_RESUMES} resumes; make resume(...) end it"
        )
    return state


def _metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**(metadata or {}), "langgraph_art_run": uuid.uuid4().hex}


def rollout(
    graph: Runnable,
    input: Any,
    config: RunnableConfig | None = None,
    *,
    metadata: Mapping[str, Any] | None = None,
    recorders: Iterable[TurnRecorder] = (),
    store: TrajectoryStore | None = None,
) -> Trajectory:
    """Invoke ``graph`` once and return its ``Trajectory`` (``final_state`` holds the graph's output).

    A graph that raises returns a ``failed`` trajectory carrying the error instead of raising.
    """
    handler = TrajectoryCallbackHandler(recorders=recorders)
    meta = _metadata(metadata)
    run_config = _run_config(config, handler, meta)
    started, state, error = time.time(), None, None
    try:
        state = graph.invoke(input, run_config)
    except Exception as exc:  # noqa: BLE001 - the failure is the trajectory's record, not lost
        error = exc
    trajectory = _finish(handler, meta["langgraph_art_run"], meta, state, error, started)
    if store is not None:
        store.add_trajectory(trajectory)
    return trajectory


async def arollout(
    graph: Runnable,
    input: Any,
    config: RunnableConfig | None = None,
    *,
    metadata: Mapping[str, Any] | None = None,
    recorders: Iterable[TurnRecorder] = (),
    store: TrajectoryStore | None = None,
    resume: Callable[[Any, Any], Any] | None = None,
) -> Trajectory:
    """Async ``rollout`` (``graph.ainvoke``).

    ``resume``: for graphs that call ``interrupt()``: a run that stops at interrupts is resumed, as LangGraph
    resumes it, with ``Command(resume=resume(interrupts, state))`` (``interrupts``: the output's
    ``__interrupt__`` list; sync or async) until it ends; one trajectory holds every part. None: the run ends
    ``interrupted``.

    A graph whose checkpointer has no async methods (``SqliteSaver``) is a ConfigError before the run (the sync
    ``rollout`` can use it)."""
    check_checkpointer(graph, history=resume is not None)
    handler = TrajectoryCallbackHandler(recorders=recorders)
    meta = _metadata(metadata)
    run_config = _run_config(config, handler, meta)
    started, state, error = time.time(), None, None
    try:
        state = await graph.ainvoke(input, run_config)
        if resume is not None:
            state = await _aresumed(graph, state, run_config, meta["langgraph_art_run"], resume)
    except Exception as exc:  # noqa: BLE001 - the failure is the trajectory's record, not lost
        error = exc
    trajectory = _finish(handler, meta["langgraph_art_run"], meta, state, error, started)
    if store is not None:
        await asyncio.to_thread(store.add_trajectory, trajectory)
    return trajectory


def scenario_id(scenario: Mapping[str, Any]) -> str:
    """The scenario's ``id`` if it has one, else a stable hash of its content."""
    if scenario.get("id") is not None:
        return str(scenario["id"])
    blob = json.dumps(to_jsonable(scenario), sort_keys=True)
    return "s-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def check_scenarios(scenarios: Sequence[Mapping[str, Any]]) -> None:
    for i, scenario in enumerate(scenarios):
        if not isinstance(scenario, Mapping) or "input" not in scenario:
            raise ConfigError(
                f"scenario {i} must be a dict with an 'input' key (the graph input), plus any reference data, "
                f"e.g. {{'id': 'q1', 'input': {{'messages': [...]}}, 'answer': '42'}}; got {scenario!r:.200}"
            )


async def agather_groups(
    graph: Runnable,
    scenarios: Sequence[Mapping[str, Any]],
    num_generations: int = 8,
    *,
    max_concurrency: int = 8,
    config: RunnableConfig | None = None,
    metadata: Mapping[str, Any] | None = None,
    recorders: Iterable[TurnRecorder] = (),
    store: TrajectoryStore | None = None,
    on_failure: Literal["keep", "raise"] = "keep",
    progress: bool = True,
    resume: Callable[[Any, Any], Any] | None = None,
) -> list[TrajectoryGroup]:
    """Run every scenario ``num_generations`` times (at most ``max_concurrency`` runs at once), one group each.

    Each run gets its own handler and run metadata (``scenario_id``, ``group_id``, ``generation`` plus
    ``metadata``, e.g. ``policy_step``). Each finished run is stored at once when a ``store`` is given.

    LangGraph runs sync nodes in the running loop's default executor, one thread per run inside such a node; on
    your own loop that is asyncio's (``cpu_count + 4`` threads) unless you set one: for ``max_concurrency`` runs of
    a graph with sync nodes, ``loop.set_default_executor(ThreadPoolExecutor(max_workers=max_concurrency))``. (The
    sync ``gather_groups`` and ``Trainer.train`` run on a loop that has 256.)

    Each run has a thread of its own (``art-<run key>``, in its metadata as ``thread_id``) unless ``config`` names
    one, so a graph compiled with a checkpointer runs too; ``resume``: see ``arollout``.
    """
    if on_failure not in ("keep", "raise"):
        raise ConfigError(f"on_failure must be 'keep' or 'raise', got {on_failure!r}")
    check_gather(scenarios, num_generations, max_concurrency)
    check_checkpointer(graph, history=resume is not None)
    recorders = list(recorders)
    limit = asyncio.Semaphore(max_concurrency)
    groups = new_groups(scenarios, metadata)
    bar = ProgressBar("rollouts", len(scenarios) * num_generations, progress, transient=True)
    writer = RunWriter(store) if store is not None else None
    failures = 0

    async def one(group: TrajectoryGroup, scenario: Mapping[str, Any], generation: int) -> Trajectory:
        meta = {**(metadata or {}), "scenario_id": group.scenario_id, "group_id": group.id, "generation": generation}
        async with limit:
            trajectory = await arollout(graph, scenario["input"], config, metadata=meta, recorders=recorders,
                                        resume=resume)  # fmt: skip
        if writer is not None:
            writer.add(trajectory)
        nonlocal failures
        failures += trajectory.status == "failed"
        bar.advance(f"{failures} failed")
        return trajectory

    with bar:
        try:
            results = await asyncio.gather(
                *(one(g, s, i) for g, s in zip(groups, scenarios, strict=True) for i in range(num_generations))
            )
        finally:  # cancelled or not, the runs that finished are stored
            if writer is not None:
                await asyncio.shield(writer.drain())
    failed = await afill_groups(groups, results, store)
    if failed and on_failure == "raise":
        raise RolloutError(failed)
    return groups


def check_gather(scenarios: Sequence[Mapping[str, Any]], num_generations: int, max_concurrency: int) -> None:
    """A batch of runs that can start, or a ConfigError that says what to change."""
    if num_generations < 1:
        raise ConfigError(f"num_generations must be at least 1, got {num_generations}")
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be at least 1, got {max_concurrency}")
    check_scenarios(scenarios)


def new_groups(scenarios: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any] | None) -> list[TrajectoryGroup]:
    """One empty group per scenario, in order, each with ``metadata``."""
    return [
        TrajectoryGroup(
            id=uuid.uuid4().hex, scenario_id=scenario_id(s), scenario=to_jsonable(s), metadata=dict(metadata or {})
        )
        for s in scenarios
    ]


async def afill_groups(
    groups: list[TrajectoryGroup], results: Sequence[Trajectory], store: TrajectoryStore | None
) -> list[Trajectory]:
    """Hand ``results`` (each group's runs in turn, already stored run by run) to ``groups``, store the groups, and
    warn of the failed runs; returns those."""
    per_group = len(results) // max(len(groups), 1)
    for index, group in enumerate(groups):
        group.trajectories = list(results[index * per_group : (index + 1) * per_group])
        group.metadata["failed"] = len(group.failed)
    if store is not None:  # each run was stored when it finished: only the groups are new
        for group in groups:
            await asyncio.to_thread(store.add_group, group, trajectories=False)
    failed = [t for g in groups for t in g.failed]
    if failed:
        log.warning(
            "%d of %d runs failed (kept%s, excluded from training); first error: %s",
            len(failed),
            len(results),
            " in the store" if store else "",
            failed[0].error,
        )
    return failed


class RunWriter:
    """Stores finished runs as they come, off the event loop: runs that finish while a write is under way go in
    the next transaction together. One ``asyncio.to_thread`` write per run made each run wait its turn for a
    worker thread and the GIL (2.9 ms per run at 16 concurrent runs, against 0.16 ms for the write itself).
    ``drain()`` returns when every run added is stored, and raises the first failed write."""

    def __init__(self, store: TrajectoryStore) -> None:
        self.store = store
        self.pending: list[Trajectory] = []
        self.task: asyncio.Task[None] | None = None
        self.errors: list[BaseException] = []

    def add(self, trajectory: Trajectory) -> None:
        self.pending.append(trajectory)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            try:
                await asyncio.to_thread(self.store.add_trajectories, batch)
            except Exception as exc:  # raised by drain(); the batch is logged, not dropped quietly
                log.exception("could not store %d trajectories (ids %s)", len(batch), [t.id for t in batch])
                self.errors.append(exc)

    async def drain(self) -> None:
        while self.task is not None and not self.task.done():
            await asyncio.wait([self.task])
        if self.errors:
            raise self.errors[0]


def gather_groups(
    graph: Runnable, scenarios: Sequence[Mapping[str, Any]], num_generations: int = 8, **kwargs: Any
) -> list[TrajectoryGroup]:
    """Synchronous ``agather_groups`` (works inside a running event loop too; there ``await agather_groups(...)``
    does not block the loop)."""
    return run_sync(agather_groups(graph, scenarios, num_generations, **kwargs))
