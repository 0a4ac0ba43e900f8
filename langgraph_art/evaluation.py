"""Held-out evaluation: run a graph on scenarios it is not trained on, score the runs, report ``eval/*`` metrics.

``Trainer(eval_scenarios=..., eval_every=N)`` calls it before the first step, every N steps and after the last; on
its own, ``art.evaluate(graph, scenarios, rewards)`` scores the policy the graph's ``ChatART`` serves now. Its runs
are stored (with ``store=``) like training runs but marked ``split="eval"`` (``store.trajectories(split="eval")``;
Langfuse tag ``split:eval``), and nothing trains on them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import Runnable

from langgraph_art.capture.branching import adelete_threads
from langgraph_art.capture.rollout import agather_groups
from langgraph_art.rewards.combine import ascore_groups
from langgraph_art.sync import run_sync
from langgraph_art.types import TrajectoryGroup

EVAL = "eval"


@dataclass
class Evaluation:
    """An evaluation's metrics (``eval/reward/mean``, ``eval/reward/std``, ``eval/reward/<name>`` per reward,
    ``eval/runs``, ``eval/runs/failed``, ``eval/time_s``) and its scored groups."""

    metrics: dict[str, float]
    groups: list[TrajectoryGroup] = field(default_factory=list)


async def aevaluate(
    graph: Runnable,
    scenarios: Sequence[Mapping[str, Any]],
    rewards: Sequence[Any],
    *,
    num_generations: int = 1,
    max_concurrency: int = 8,
    store: Any = None,
    recorders: Sequence[Any] = (),
    metadata: Mapping[str, Any] | None = None,
    resume: Any = None,
    delete_threads: bool = False,
) -> Evaluation:
    """Run each scenario ``num_generations`` times, score with ``rewards``, store (when given) as ``split="eval"``.

    The mean is over the runs' weighted reward totals, as the training steps' ``reward/mean``; failed runs count in
    ``eval/runs/failed``, not in the mean. A group-relative judge (``RulerJudge``) needs ``num_generations >= 2``
    to compare runs. ``resume``: resumes runs that stop at ``interrupt()`` (``arollout``). ``delete_threads``:
    delete the runs' threads (``art-<run key>``) from the graph's checkpointer once they ran (their final states
    are in the groups), as ``Trainer`` does with ``Branching(delete_threads=True)``."""
    started = time.perf_counter()
    groups = await agather_groups(
        graph,
        scenarios,
        num_generations,
        max_concurrency=max_concurrency,
        recorders=recorders,
        store=store,
        progress=False,
        metadata={**(metadata or {}), "split": EVAL},
        resume=resume,
    )
    if delete_threads:
        await adelete_threads(graph, [t for g in groups for t in g.trajectories])
    report = await ascore_groups(groups, rewards)
    if store is not None:  # with their rewards now
        for group in groups:
            await asyncio.to_thread(store.add_group, group)
    metrics = {f"eval/{key}": value for key, value in report.summary(groups).items()}
    metrics["eval/runs"] = float(sum(len(g.trajectories) for g in groups))
    metrics["eval/time_s"] = time.perf_counter() - started
    return Evaluation(metrics, groups)


def evaluate(
    graph: Runnable, scenarios: Sequence[Mapping[str, Any]], rewards: Sequence[Any], **kwargs: Any
) -> Evaluation:
    """Synchronous ``aevaluate`` (works inside a running event loop too)."""
    return run_sync(aevaluate(graph, scenarios, rewards, **kwargs))
