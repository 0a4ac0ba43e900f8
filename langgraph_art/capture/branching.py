"""Groups branched from LangGraph checkpoints: ``num_generations`` continuations of one mid-run state.

A whole-run group gives every decision of a run the run's one advantage. A branch group resumes the graph
``num_generations`` times from one checkpoint inside a finished run (LangGraph's time travel: ``ainvoke(None,
{"thread_id": ..., "checkpoint_id": ...})``): its runs share everything before that point, so their group-relative
advantage measures the decision made there (and the ones after it) alone.

- ``Branching``: the settings (how many branch groups a step, at which nodes, every k-th decision or a rule).
- ``with_checkpointer``: the graph with a checkpointer, a copy with an ``InMemorySaver`` when it has none
  (``Pregel.copy``: nothing is recompiled; a ``with_config`` wrapper is kept). Its serializer falls back to pickle,
  so a state holding plain Python objects (an environment) can be checkpointed.
- ``afork_points``: the states inside finished runs where a node that called the model is next, from the run's
  checkpoint history (``aget_state_history``), chosen by the settings.
- ``abranch_groups``: one group per fork point, its continuations captured like any run. A continuation captures
  only what ran after the fork (its trained tokens exclude the shared history, which is its prompt) and records
  where it forked in ``metadata["branch"]`` (parent run, thread, checkpoint, node, step, depth).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig

from langgraph_art.capture.recorder import TurnRecorder
from langgraph_art.capture.rollout import RunWriter, afill_groups, arollout, find_pregel
from langgraph_art.errors import ConfigError
from langgraph_art.store import TrajectoryStore
from langgraph_art.types import Trajectory, TrajectoryGroup


@dataclass(frozen=True)
class ForkPoint:
    """A state inside a finished run from which continuations start: the checkpoint after ``step`` super-steps of
    thread ``thread_id``, where ``node`` runs next; ``depth`` decisions (trainable model calls) came before it.
    ``state`` is the checkpoint's values (Python objects; for a ``rule``, never stored)."""

    run_id: str
    thread_id: str
    checkpoint_id: str
    checkpoint_ns: str
    node: str
    step: int
    depth: int
    scenario_id: str | None = None
    group_id: str | None = None
    state: Any = field(default=None, compare=False, repr=False)

    def config(self) -> RunnableConfig:
        """The config that resumes the graph from this checkpoint (a fork: the runs after it are new)."""
        return {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": self.checkpoint_ns,
                                 "checkpoint_id": self.checkpoint_id}}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        """What a continuation (and its group) records of where it forked."""
        return {"parent_run": self.run_id, "thread_id": self.thread_id, "checkpoint_id": self.checkpoint_id,
                "node": self.node, "step": self.step, "depth": self.depth, "parent_group": self.group_id}  # fmt: skip


@dataclass
class Branching:
    """How a ``Trainer`` step branches (``Trainer(..., branching=art.Branching(groups_per_step=4))``).

    Each step first runs its whole-run groups (``scenarios_per_step`` x ``num_generations``), then picks
    ``groups_per_step`` fork points inside those runs and resumes ``num_generations`` continuations from each: they
    share everything before the fork, so their group-relative advantage measures the decision made there. Among the
    candidates left by ``nodes``, ``every`` and ``rule``, the points are drawn at random (``seed``), one run at a
    time, so they spread over the step's runs.

    Args:
        groups_per_step: Branch groups each step (>= 1).
        nodes: The nodes whose decisions may be re-sampled (None: every node that made a trainable ChatART call in
            the run). A fork point is a checkpoint where such a node runs next.
        every: Only the k-th, 2k-th, ... decision of a run (depth 1 is the second decision: depth 0, the first, is
            what a whole-run group already compares).
        rule: Your own filter, ``rule(point: ForkPoint) -> bool`` (``point.state`` is the checkpoint's values,
            ``point.depth``, ``point.node``, ``point.step``).
        num_generations: Continuations per point (>= 2; None: the trainer's ``num_generations``).
        train_whole_runs: False keeps the whole runs as parents only (stored, scored, not trained on).
        seed: Seeds the draw of fork points (None: a fresh draw each run).
        checkpointer: Used when the graph has none (None: an ``InMemorySaver``); a graph with its own keeps it.
            Either must be an async saver (runs are made with ``ainvoke``; ``SqliteSaver`` is refused, see
            ``check_checkpointer``).
        delete_threads: Delete each step's threads from the checkpointer after branching, and each evaluation's
            runs' threads after it (None: only from the one the trainer supplied; your own keeps the threads,
            named ``art-<run>``).

    Raises:
        ConfigError: A value out of range, with what to use.

    Example:
        ```python
        trainer = art.Trainer(graph, model, rewards=[game_result],
                              branching=art.Branching(groups_per_step=2, nodes=["agent"], every=2))
        ```
    """

    groups_per_step: int = 4
    nodes: Sequence[str] | None = None
    every: int = 1
    rule: Callable[[ForkPoint], bool] | None = None
    num_generations: int | None = None
    train_whole_runs: bool = True
    seed: int | None = None
    checkpointer: Any = None
    delete_threads: bool | None = None

    def __post_init__(self) -> None:
        for name in ("groups_per_step", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Branching({name}=...) must be an int >= 1, got {value!r}")
        if self.num_generations is not None and (
            isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int)
            or self.num_generations < 2
        ):  # fmt: skip
            raise ConfigError(
                f"Branching(num_generations=...) must be an int >= 2 (continuations compared with each other) or "
                f"None (the trainer's), got {self.num_generations!r}"
            )
        if isinstance(self.nodes, str):
            self.nodes = [self.nodes]
        if self.nodes is not None and (not self.nodes or not all(isinstance(n, str) for n in self.nodes)):
            raise ConfigError(f"Branching(nodes=...) must be node names, e.g. ['agent'], or None; got {self.nodes!r}")
        if self.rule is not None and not callable(self.rule):
            raise ConfigError(f"Branching(rule=...) must be a function of a ForkPoint returning a bool, got "
                              f"{type(self.rule).__name__}")  # fmt: skip


def with_checkpointer(graph: Runnable, checkpointer: Any = None) -> tuple[Runnable, bool]:
    """``graph`` if it has a checkpointer, else a copy with ``checkpointer`` (default ``InMemorySaver()``) and
    True: the trainer's own, whose threads it may delete. The user's graph object is not changed."""
    pregel = find_pregel(graph)
    if pregel is None:
        raise ConfigError(
            f"branching needs a compiled LangGraph graph (StateGraph(...).compile(), optionally .with_config(...)); "
            f"got {type(graph).__name__}. It resumes runs from the graph's checkpoints."
        )
    if pregel.checkpointer not in (None, False):
        if pregel.checkpointer is True:
            raise ConfigError("branching cannot resume a subgraph compiled with checkpointer=True on its own; "
                              "branch the parent graph")  # fmt: skip
        return graph, False
    if checkpointer is None:  # pickle for what msgpack cannot hold (a live environment object in the state)
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        checkpointer = InMemorySaver(serde=JsonPlusSerializer(pickle_fallback=True))
    copy = pregel.copy(update={"checkpointer": checkpointer})
    return _rewrap(graph, copy), True


def _rewrap(graph: Any, pregel: Any) -> Any:
    """``graph``'s wrappers around ``pregel`` instead of the original."""
    if isinstance(graph, RunnableBinding):
        return graph.model_copy(update={"bound": _rewrap(graph.bound, pregel)})
    return pregel


def _timestamp(created_at: str | None) -> float:
    return datetime.fromisoformat(created_at).timestamp() if created_at else float("inf")


def _decisions(run: Trajectory) -> list[tuple[float, str]]:
    """(start time, top-level node) of each trainable turn of ``run`` (the node a fork re-runs), in time order."""
    top: dict[str, str] = {}
    for span in run.spans:  # start order: parents first
        top[span.id] = top.get(span.parent_id or "", span.name) if span.parent_id else span.name
    found = [(turn.start_time, top[span.id]) for span in run.spans for turn in span.turns
             if turn.trainable and turn.has_tokens and turn.error is None]  # fmt: skip
    return sorted(found)


async def _history(pregel: Any, thread_id: str) -> list[Any]:
    """The thread's checkpoints, newest first (the saver's async list: ``check_checkpointer(history=True)``)."""
    return [s async for s in pregel.aget_state_history({"configurable": {"thread_id": thread_id}})]


async def acandidates(graph: Runnable, run: Trajectory, settings: Branching) -> list[ForkPoint]:
    """Every fork point of one finished run that ``settings`` allows, in run order."""
    thread_id = run.metadata.get("thread_id")
    if run.status == "failed" or not thread_id:
        return []
    decisions = _decisions(run)
    if len(decisions) < 2:
        return []
    wanted = set(settings.nodes) if settings.nodes is not None else {node for _, node in decisions}
    times = [start for start, _ in decisions]
    points = []
    run_key = run.metadata.get("langgraph_art_run")
    for snapshot in reversed(await _history(find_pregel(graph), thread_id)):  # oldest first
        if snapshot.metadata.get("langgraph_art_run") != run_key:
            continue  # another run's checkpoint on a shared thread (a config that named one thread for all)
        node = next((n for n in snapshot.next if n in wanted), None)
        if node is None:
            continue
        made = _timestamp(snapshot.created_at)
        depth = sum(t < made for t in times)
        if depth < 1 or depth >= len(times) or depth % settings.every:
            continue  # the first decision is the whole run's; a point after the last has nothing to re-sample
        configurable = snapshot.config["configurable"]
        point = ForkPoint(run_id=run.id, thread_id=thread_id, checkpoint_id=configurable["checkpoint_id"],
                          checkpoint_ns=configurable.get("checkpoint_ns", ""), node=node,
                          step=int(snapshot.metadata.get("step", -1)), depth=depth, scenario_id=run.scenario_id,
                          group_id=run.group_id, state=snapshot.values)  # fmt: skip
        if settings.rule is None or settings.rule(point):
            points.append(point)
    return points


async def afork_points(
    graph: Runnable, runs: Iterable[Trajectory], settings: Branching, rng: random.Random
) -> list[ForkPoint]:
    """Up to ``settings.groups_per_step`` fork points in ``runs``: drawn at random, one run at a time (each run
    in turn, in a random order, gives one of its candidates not drawn yet) so they spread over the runs."""
    per_run = [await acandidates(graph, run, settings) for run in runs]
    per_run = [points for points in per_run if points]
    rng.shuffle(per_run)
    chosen: list[ForkPoint] = []
    while per_run and len(chosen) < settings.groups_per_step:
        for points in list(per_run):
            chosen.append(points.pop(rng.randrange(len(points))))
            if not points:
                per_run.remove(points)
            if len(chosen) == settings.groups_per_step:
                break
    return chosen


async def abranch_groups(
    graph: Runnable,
    points: Sequence[ForkPoint],
    scenarios: Mapping[str, Any],
    num_generations: int,
    *,
    max_concurrency: int = 8,
    metadata: Mapping[str, Any] | None = None,
    recorders: Iterable[TurnRecorder] = (),
    store: TrajectoryStore | None = None,
    resume: Callable[[Any, Any], Any] | None = None,
) -> list[TrajectoryGroup]:
    """One group per fork point: ``num_generations`` continuations resumed from its checkpoint (concurrently, at
    most ``max_concurrency`` at once), each stored as it finishes. ``scenarios``: scenario id -> the scenario (the
    rewards' reference data)."""
    recorders = list(recorders)
    limit = asyncio.Semaphore(max_concurrency)
    writer = RunWriter(store) if store is not None else None
    groups = []
    for point in points:
        branch = point.metadata()
        groups.append(TrajectoryGroup(id=uuid.uuid4().hex, scenario_id=point.scenario_id,
                                      scenario=scenarios.get(point.scenario_id or ""),
                                      metadata={**(metadata or {}), "branch": branch}))  # fmt: skip

    async def one(group: TrajectoryGroup, point: ForkPoint, generation: int) -> Trajectory:
        meta = {**(metadata or {}), "scenario_id": point.scenario_id, "group_id": group.id, "generation": generation,
                "branch": group.metadata["branch"]}  # fmt: skip
        async with limit:
            trajectory = await arollout(graph, None, point.config(), metadata=meta, recorders=recorders,
                                        resume=resume)  # fmt: skip
        if writer is not None:
            writer.add(trajectory)
        return trajectory

    try:
        results = await asyncio.gather(*(one(g, p, i) for g, p in zip(groups, points, strict=True)
                                         for i in range(num_generations)))  # fmt: skip
    finally:  # cancelled or not, the continuations that finished are stored
        if writer is not None:
            await asyncio.shield(writer.drain())
    await afill_groups(groups, results, store)
    return groups


async def abranch(
    graph: Runnable,
    groups: Sequence[TrajectoryGroup],
    settings: Branching,
    rng: random.Random,
    *,
    num_generations: int,
    own_checkpointer: bool,
    **kwargs: Any,
) -> list[TrajectoryGroup]:
    """A step's branch groups: fork points drawn in ``groups``' finished runs, ``num_generations`` continuations
    from each (``kwargs``: ``abranch_groups``'); then the step's threads are deleted when ``settings`` says so
    (by default only from the checkpointer the trainer supplied, ``own_checkpointer``)."""
    runs = [t for g in groups for t in g.completed()]
    try:
        points = await afork_points(graph, runs, settings, rng)
        scenarios = {g.scenario_id or "": g.scenario for g in groups}
        return await abranch_groups(graph, points, scenarios, num_generations, **kwargs)
    finally:
        if deletes_threads(settings, own_checkpointer):
            await adelete_threads(graph, [t for g in groups for t in g.trajectories])


def branch_metrics(groups: Sequence[TrajectoryGroup], reward_mean: float) -> dict[str, float]:
    """A step's ``branch/*`` metrics: how many groups and continuations, where they forked, what they scored
    (``reward_mean``: their runs' mean weighted reward) and sampled."""
    depths = [g.metadata["branch"]["depth"] for g in groups]
    scored = any(g.completed() for g in groups)
    return {
        "branch/groups": float(len(groups)),
        "branch/runs": float(sum(len(g.trajectories) for g in groups)),
        "branch/depth_mean": sum(depths) / len(depths) if depths else float("nan"),
        "branch/reward/mean": reward_mean if scored else float("nan"),
        "branch/sampled_tokens": float(sum(t.sampled_tokens() for g in groups for t in g.trajectories)),
    }


def deletes_threads(settings: Branching | None, own_checkpointer: bool) -> bool:
    """Whether a trainer deletes its runs' threads (a step's, and its evaluations'): ``settings.delete_threads``,
    by default only from the checkpointer the trainer supplied (``own_checkpointer``); never without branching."""
    if settings is None:
        return False
    return bool(settings.delete_threads or (settings.delete_threads is None and own_checkpointer))


async def adelete_threads(graph: Runnable, runs: Iterable[Trajectory]) -> None:
    """Delete the checkpoints of ``runs``' threads (continuations forked on them included); nothing for a graph
    without a checkpointer."""
    pregel = find_pregel(graph)
    saver = pregel.checkpointer if pregel is not None else None
    if saver in (None, False, True):
        return
    for thread_id in {run.metadata.get("thread_id") for run in runs} - {None}:
        try:
            await saver.adelete_thread(thread_id)
        except NotImplementedError:
            await asyncio.to_thread(saver.delete_thread, thread_id)
