"""Group-relative advantages (pure Python, hand-checkable).

Within a group (runs of one scenario), advantage = reward - group mean, optionally divided by the group's std
(``scale_rewards="group"``, GRPO), by the std of the whole batch (``"batch"``, more stable when groups are small)
or not at all (``"none"``, Dr. GRPO). A group whose rewards are all equal teaches nothing: it is skipped and
counted. Per-node rewards (``NodeSpan.reward``) get their own group-relative advantages among the same node's
spans in the group, and those are used for that node's turns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from langgraph_art.types import Trajectory, TrajectoryGroup

ScaleRewards = Literal["group", "batch", "none"]
EPS = 1e-4


def centred(rewards: Sequence[float], scale: float | None) -> list[float]:
    """``(r - mean) / scale`` (or just ``r - mean`` when ``scale`` is None)."""
    mean = statistics.fmean(rewards)
    return [(r - mean) / (scale + EPS) if scale is not None else r - mean for r in rewards]


@dataclass
class Advantages:
    """Advantage per trajectory id, and per span id for node rewards; plus what was skipped and why."""

    by_trajectory: dict[str, float] = field(default_factory=dict)
    by_span: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def of_turns(self, trajectory: Trajectory) -> dict[str, float]:
        """The advantage of each of ``trajectory``'s turns, by turn id: its node span's (a per-node reward), else
        the run's; empty for a run without one."""
        run = self.by_trajectory.get(trajectory.id)
        out: dict[str, float] = {}
        if run is not None:
            out.update(dict.fromkeys((turn.id for turn in trajectory.root_turns), run))
        for span in trajectory.spans:
            advantage = self.by_span.get(span.id, run)
            if advantage is not None:
                out.update(dict.fromkeys((turn.id for turn in span.turns), advantage))
        return out

    def skip(self, reason: str, count: int = 1) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + count


def scored_runs(group: TrajectoryGroup) -> list[Trajectory]:
    """The group's completed runs with a finite reward: the ones GRPO compares."""
    return [t for t in group.completed() if t.reward is not None and math.isfinite(t.reward)]


def all_equal(rewards: Sequence[float]) -> bool:
    """Rewards a group cannot tell apart (no advantage to teach)."""
    return max(rewards) - min(rewards) < 1e-9


def is_uniform(group: TrajectoryGroup) -> bool:
    """At least two scored runs, every one's reward the same: a group ``group_advantages`` skips."""
    runs = scored_runs(group)
    return len(runs) >= 2 and all_equal([float(t.reward) for t in runs])  # type: ignore[arg-type]


def group_advantages(
    groups: Sequence[TrajectoryGroup], scale_rewards: ScaleRewards = "group", keep_uniform: bool = False
) -> Advantages:
    """``keep_uniform``: a group whose rewards are all equal gets advantages of 0 instead of being skipped (a
    teacher's per-token advantage still has something to teach there)."""
    out = Advantages()
    scored: list[tuple[list[str], list[float]]] = []
    for group in groups:
        runs = scored_runs(group)
        out.skip("run failed", len(group.failed))
        out.skip("run has no reward", len(group.completed()) - len(runs))
        if len(runs) < 2:
            out.skip("group of fewer than 2 scored runs", len(runs))
            continue
        rewards = [float(t.reward) for t in runs]  # type: ignore[arg-type]
        if all_equal(rewards):
            if keep_uniform:
                out.by_trajectory.update(dict.fromkeys((t.id for t in runs), 0.0))
            else:
                out.skip("group with all-equal rewards", len(runs))
            continue
        scored.append(([t.id for t in runs], rewards))
        _node_advantages(group, scale_rewards, out)
    batch_std = statistics.pstdev([r for _, rs in scored for r in rs]) if scored else 0.0
    for ids, rewards in scored:
        scale = {"group": statistics.pstdev(rewards), "batch": batch_std, "none": None}[scale_rewards]
        out.by_trajectory.update(zip(ids, centred(rewards, scale), strict=True))
    return out


def _node_advantages(group: TrajectoryGroup, scale_rewards: ScaleRewards, out: Advantages) -> None:
    spans = [s for t in group.completed() for s in t.spans if s.reward is not None]
    for node in sorted({s.name for s in spans}):
        same = [s for s in spans if s.name == node]
        rewards = [float(s.reward) for s in same]  # type: ignore[arg-type]
        if len(same) < 2 or max(rewards) - min(rewards) < 1e-9:
            continue
        scale = statistics.pstdev(rewards) if scale_rewards != "none" else None
        out.by_span.update(zip([s.id for s in same], centred(rewards, scale), strict=True))
