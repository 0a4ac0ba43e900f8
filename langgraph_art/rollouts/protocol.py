"""What ``Trainer(rollouts=...)`` takes: an object whose ``agather`` runs a step's rollouts (``Rollouts``) and returns
them with its own metrics (``RolloutBatch``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from langchain_core.runnables import Runnable

from langgraph_art.store import TrajectoryStore
from langgraph_art.types import TrajectoryGroup


class RolloutBatch(NamedTuple):
    """What a ``Rollouts`` gathers for one step: the groups in scenario order (each run already stored) and the
    step's metrics about the rollouts themselves (``rollouts/...``)."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, float]


class Rollouts(Protocol):
    """Where ``Trainer(rollouts=...)`` runs a step's rollouts (``None``: on the trainer's event loop)."""

    async def agather(
        self,
        graph: Runnable,
        scenarios: Sequence[Mapping[str, Any]],
        num_generations: int,
        *,
        max_concurrency: int,
        metadata: Mapping[str, Any],
        store: TrajectoryStore | None,
    ) -> RolloutBatch:
        """Run every scenario ``num_generations`` times, store each run once as it finishes, then its group."""
        ...
