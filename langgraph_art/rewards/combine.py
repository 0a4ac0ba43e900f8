"""Apply every reward to groups of runs and combine: weighted total, named sub-scores, per-node rewards, metrics.

Anything with ``name``, ``weight``, ``node`` and ``async ascore_group(group) -> {id: Score}`` is a reward source:
``@reward`` functions and judges alike (``rewards=[fn, judge]``). A source that keeps files (a judge's cache) may
have ``use_home(home)``: ``Trainer`` calls it with its backend's home (``place_caches``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from langgraph_art.errors import LangGraphArtError
from langgraph_art.rewards.decorators import RewardFunction, Score
from langgraph_art.sync import run_sync
from langgraph_art.types import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)


class RewardSource(Protocol):
    name: str
    weight: float
    node: str | None

    async def ascore_group(self, group: TrajectoryGroup) -> dict[str, Score]: ...


class GroupSkipped(LangGraphArtError):
    """A reward source gave up on a whole group (e.g. a judge whose ``on_error="skip"``); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class RewardReport:
    """What scoring did: metrics (``reward/<name>``, ``reward/<name>/<sub>``, ``reward/total``...), runs where every
    reward abstained, reward errors handled by ``on_error``, and groups a judge skipped (with the reason)."""

    metrics: dict[str, float] = field(default_factory=dict)
    all_abstained: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped_groups: dict[str, str] = field(default_factory=dict)

    def summary(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """The reward metrics a step (or, under ``eval/``, an evaluation) records for the ``groups`` scored:
        ``reward/mean`` and ``reward/std`` of the runs' weighted totals, ``runs/failed``, and the per-reward means
        and counts (``reward/<name>``, ``reward/runs_scored``, ...)."""
        scored = dict(self.metrics)
        return {
            "reward/mean": scored.pop("reward/total", float("nan")),
            "reward/std": scored.pop("reward/total_std", float("nan")),
            "runs/failed": float(sum(len(g.failed) for g in groups)),
            **scored,
        }


def place_caches(rewards: Sequence[Any], home: Path) -> None:
    """Give each reward source with a ``use_home(home)`` (``RulerJudge``: its verdict cache) the data folder of the
    backend it is trained with."""
    for item in rewards:
        use_home = getattr(item, "use_home", None)
        if callable(use_home):
            use_home(home)


def as_source(item: Any) -> RewardSource:
    if isinstance(item, RewardFunction) or hasattr(item, "ascore_group"):
        return item
    if callable(item):
        return RewardFunction(item)
    raise TypeError(f"rewards must be @reward functions, plain functions or judges, got {item!r}")


async def ascore_groups(groups: Sequence[TrajectoryGroup], rewards: Sequence[Any]) -> RewardReport:
    """Score every completed run of every group with every reward; results are written onto the trajectories
    (``reward``, ``rewards``, ``explanations``) and node spans (``reward``, ``rewards``)."""
    sources = [as_source(r) for r in rewards]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise LangGraphArtError(f"reward names must be unique, got {names}; pass name=... to tell them apart")
    report = RewardReport()
    per_group = await asyncio.gather(*(_score_group(g, sources, report) for g in groups))
    for group, scores in zip(groups, per_group, strict=True):
        _apply(group, sources, scores, report)
    report.metrics = _metrics([t for g in groups for t in g.completed()], sources, report)
    if report.all_abstained:
        log.warning(
            "every reward abstained for %d run(s) (no reward, not trained on): %s",
            len(report.all_abstained),
            report.all_abstained[:5],
        )
    return report


def score_groups(groups: Sequence[TrajectoryGroup], rewards: Sequence[Any]) -> RewardReport:
    """Synchronous ``ascore_groups`` (works inside a running event loop too; there ``await ascore_groups(...)``
    does not block the loop)."""
    return run_sync(ascore_groups(groups, rewards))


async def _score_group(
    group: TrajectoryGroup, sources: list[RewardSource], report: RewardReport
) -> list[dict[str, Score] | None]:
    async def one(source: RewardSource) -> dict[str, Score] | None:
        if not group.completed():
            return {}
        try:
            return await source.ascore_group(group)
        except GroupSkipped as skip:
            report.skipped_groups[group.id] = f"{source.name}: {skip.reason}"
            group.metadata.setdefault("reward_skipped", {})[source.name] = skip.reason
            return None

    return list(await asyncio.gather(*(one(s) for s in sources)))


def _apply(
    group: TrajectoryGroup, sources: list[RewardSource], scores: list[dict[str, Score] | None], report: RewardReport
) -> None:
    for trajectory in group.completed():
        total, counted = 0.0, 0
        for source, by_id in zip(sources, scores, strict=True):
            if by_id is None:  # the source skipped the whole group
                continue
            if source.node is not None:
                _apply_node(trajectory, source, by_id, report)
                continue
            score = by_id.get(trajectory.id)
            if score is None:
                continue
            if score.error:
                report.errors.append(f"{source.name} on run {trajectory.id}: {score.error}")
            if score.explanation:
                trajectory.explanations[source.name] = score.explanation
            if score.value is None:
                continue
            trajectory.rewards[source.name] = score.value
            for part, value in score.parts.items():
                trajectory.rewards[f"{source.name}/{part}"] = value
            total += source.weight * score.value
            counted += 1
        trajectory.reward = total if counted else None
        if not counted and any(s.node is None for s in sources):
            report.all_abstained.append(trajectory.id)


def _apply_node(trajectory: Trajectory, source: RewardSource, by_id: dict[str, Score], report: RewardReport) -> None:
    for span in trajectory.spans:
        score = by_id.get(span.id)
        if score is None:
            continue
        if score.error:
            report.errors.append(f"{source.name} on run {trajectory.id}, span {span.id}: {score.error}")
        if score.value is None:
            continue
        span.rewards[source.name] = score.value
        for part, value in score.parts.items():
            span.rewards[f"{source.name}/{part}"] = value
        span.reward = (span.reward or 0.0) + source.weight * score.value


def _metrics(runs: list[Trajectory], sources: list[RewardSource], report: RewardReport) -> dict[str, float]:
    metrics: dict[str, float] = {}
    keys = sorted({k for t in runs for k in t.rewards})
    for key in keys:
        values = [t.rewards[key] for t in runs if key in t.rewards]
        metrics[f"reward/{key}"] = statistics.fmean(values)
    for source in sources:
        if source.node is not None:
            values = [s.rewards[source.name] for t in runs for s in t.spans if source.name in s.rewards]
            if values:
                metrics[f"reward/{source.name}"] = statistics.fmean(values)
    totals = [t.reward for t in runs if t.reward is not None]
    if totals:
        metrics["reward/total"] = statistics.fmean(totals)
        metrics["reward/total_std"] = statistics.pstdev(totals)
    metrics["reward/runs_scored"] = float(len(totals))
    metrics["reward/runs_all_abstained"] = float(len(report.all_abstained))
    metrics["reward/errors"] = float(len(report.errors))
    metrics["reward/groups_skipped"] = float(len(report.skipped_groups))
    for source in sources:
        usage = getattr(source, "usage", None)
        if isinstance(usage, dict):
            for key, value in usage.items():
                metrics[f"judge/{source.name}/{key}"] = float(value)
    return metrics
