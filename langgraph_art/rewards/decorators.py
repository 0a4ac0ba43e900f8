"""``@reward``: turn a plain function into a reward, with its parameters injected by name.

Injectable parameters: ``state`` (the graph's final state, Python objects), ``trajectory``, ``scenario`` (the
scenario dict: input plus reference data), ``metadata`` (the run's metadata), ``span`` (for ``node=`` rewards:
the node invocation being scored) and ``group`` (a group-level reward: called once per group, returns one value
per trajectory, as a list in group order or a dict by trajectory id).

``state`` exists only for runs made in this process: the store keeps a run's messages, turns and tool calls, not
the graph's Python state, so runs read back from it (``store.groups(...)``, re-scoring production runs) have none.
A reward that takes ``state`` abstains on such runs, with a warning saying how many; score stored runs from
``trajectory`` (``trajectory.conversations()``, ``trajectory.turns()``) instead.

A reward returns a number, a bool, ``None`` (abstains for this run) or a dict of named sub-scores (its value is
their mean). NaN, infinity or another type raise ``RewardError`` naming the function, the value and the run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from langgraph_art.errors import ConfigError, RewardError
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)
OnError = Literal["raise", "abstain", "zero"]
INJECTABLE = frozenset({"state", "trajectory", "scenario", "metadata", "span", "group"})


@dataclass(frozen=True)
class Score:
    """One reward's verdict on one run (or one span): ``value`` (None = abstained) and named sub-scores."""

    value: float | None
    parts: Mapping[str, float]
    explanation: str | None = None
    error: str | None = None


def check_value(value: Any, where: str) -> Score:
    """Validate what a reward returned; ``where`` names the function and the run for the error message."""
    if value is None:
        return Score(None, {})
    if isinstance(value, bool):
        return Score(float(value), {})
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise RewardError(f"{where} returned {value!r}; rewards must be finite numbers (or None to abstain)")
        return Score(float(value), {})
    if isinstance(value, Mapping):
        parts = {}
        for key, sub in value.items():
            if isinstance(sub, bool):
                sub = float(sub)
            if not isinstance(sub, int | float) or not math.isfinite(sub):
                raise RewardError(f"{where} returned sub-score {key!r}={sub!r}; sub-scores must be finite numbers")
            parts[str(key)] = float(sub)
        if not parts:
            return Score(None, {})
        return Score(sum(parts.values()) / len(parts), parts)
    raise RewardError(
        f"{where} returned {value!r} of type {type(value).__name__}; return a number, a bool, None or a dict of "
        "named numbers"
    )


class RewardFunction:
    """A reward function with its options; call ``ascore_group`` to score a whole group."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        weight: float = 1.0,
        node: str | None = None,
        on_error: OnError = "raise",
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"@reward decorates a function, got {fn!r}")
        if not math.isfinite(weight):
            raise ConfigError(f"weight must be a finite number, got {weight!r}")
        if on_error not in ("raise", "abstain", "zero"):
            raise ConfigError(f"on_error must be 'raise', 'abstain' or 'zero', got {on_error!r}")
        self.fn = fn
        self.name = name or fn.__name__
        self.weight = float(weight)
        self.node = node
        self.on_error: OnError = on_error
        self.params = list(inspect.signature(fn).parameters)
        unknown = [p for p in self.params if p not in INJECTABLE]
        if unknown:
            raise ConfigError(
                f"reward {self.name!r} asks for {unknown}; rewards can take: {sorted(INJECTABLE)} (by name)"
            )
        if "group" in self.params and (node is not None or "span" in self.params):
            raise ConfigError(f"reward {self.name!r}: a group-level reward cannot also be a node= reward")
        if "span" in self.params and node is None:
            raise ConfigError(f"reward {self.name!r} takes 'span': give it node='<node name>' to say which spans")
        self.is_async = inspect.iscoroutinefunction(fn)
        self.group_level = "group" in self.params

    def __repr__(self) -> str:
        return f"RewardFunction({self.name!r}, weight={self.weight}, node={self.node!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Still callable as the plain function."""
        return self.fn(*args, **kwargs)

    async def _call(self, where: str, **available: Any) -> Any:
        kwargs = {p: available.get(p) for p in self.params}
        if self.is_async:
            return await self.fn(**kwargs)
        return self.fn(**kwargs)

    async def _guarded(self, where: str, **available: Any) -> Any:
        try:
            return await self._call(where, **available)
        except Exception as exc:
            if self.on_error == "raise":
                raise RewardError(f"{where} raised {type(exc).__name__}: {exc}") from exc
            return _Failed(f"{type(exc).__name__}: {exc}")

    def _score(self, value: Any, where: str) -> Score:
        if isinstance(value, _Failed):
            return Score(0.0 if self.on_error == "zero" else None, {}, error=value.error)
        return check_value(value, where)

    async def ascore_group(self, group: TrajectoryGroup) -> dict[str, Score]:
        """Scores by trajectory id (for ``node=`` rewards: by span id)."""
        runs = group.completed()
        if self.group_level:
            where = f"reward {self.name!r} on group {group.id}"
            values = await self._guarded(where, group=group, scenario=group.scenario)
            if isinstance(values, _Failed):
                return {t.id: self._score(values, where) for t in runs}
            return {t.id: self._score(v, f"{where}, run {t.id}") for t, v in _align(values, runs, where)}
        jobs: list[tuple[str, Any]] = []
        stateless = [t.id for t in runs if t.final_state is None] if "state" in self.params else []
        if stateless:
            log.warning(
                "reward %r takes `state`, but %d run(s) have no final state (runs read back from the store keep "
                "messages and turns, not the graph's Python state): they abstain; score them from `trajectory`",
                self.name,
                len(stateless),
            )
        for trajectory in runs:
            if trajectory.id in stateless:
                continue
            for key, span in _targets(trajectory, self.node):
                where = f"reward {self.name!r} on run {trajectory.id}" + (f", node {span.name}" if span else "")
                jobs.append(
                    (
                        key,
                        self._guarded(
                            where,
                            state=trajectory.final_state,
                            trajectory=trajectory,
                            scenario=group.scenario,
                            metadata=trajectory.metadata,
                            span=span,
                        ),
                    )
                )
        results = await asyncio.gather(*(job for _, job in jobs))  # async rewards run concurrently
        return {
            key: self._score(value, f"reward {self.name!r} on {key}")
            for (key, _), value in zip(jobs, results, strict=True)
        }


@dataclass(frozen=True)
class _Failed:
    error: str


def _targets(trajectory: Trajectory, node: str | None) -> list[tuple[str, NodeSpan | None]]:
    if node is None:
        return [(trajectory.id, None)]
    return [(span.id, span) for span in trajectory.spans if span.name == node]


def _align(values: Any, runs: list[Trajectory], where: str) -> list[tuple[Trajectory, Any]]:
    if isinstance(values, Mapping):
        missing = [t.id for t in runs if t.id not in values]
        if missing:
            raise RewardError(f"{where} returned no value for runs {missing}; return one per trajectory id")
        return [(t, values[t.id]) for t in runs]
    if isinstance(values, list | tuple) and len(values) == len(runs):
        return list(zip(runs, values, strict=True))
    raise RewardError(
        f"{where} returned {values!r:.200}; a group-level reward returns a list with one value per completed run "
        f"({len(runs)}, in group.completed() order) or a dict by trajectory id"
    )


@overload
def reward(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    weight: float = 1.0,
    node: str | None = None,
    on_error: OnError = "raise",
) -> RewardFunction: ...


@overload
def reward(
    *, name: str | None = None, weight: float = 1.0, node: str | None = None, on_error: OnError = "raise"
) -> Callable[[Callable[..., Any]], RewardFunction]: ...


def reward(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    weight: float = 1.0,
    node: str | None = None,
    on_error: OnError = "raise",
) -> Any:
    """Declare a reward: ``@reward``, ``@reward(name=..., weight=..., node=..., on_error=...)``, or
    ``reward(fn, name=...)`` for a function defined elsewhere.

    The function's parameters are injected by name: ``state`` (the graph's final state), ``trajectory``,
    ``scenario`` (the scenario dict), ``metadata`` (the run's), ``span`` (for ``node=`` rewards: the node
    invocation scored) and ``group`` (a group-level reward: called once per group, it returns one value per run,
    a list in group order or a dict by trajectory id). It returns a number, a bool, None (abstains for this run)
    or a dict of named sub-scores (its value is their mean); it may be ``async``.

    Args:
        fn: The function, when called as ``reward(fn, ...)`` or as the bare ``@reward``.
        name: The reward's name in the metrics (``reward/<name>``) and in ``trajectory.rewards`` (default: the
            function's name).
        weight: Its weight in the run's total reward (the weighted sum of all rewards).
        node: Score each invocation of this node (``span``) instead of the run: the node's turns then get an
            advantage of their own.
        on_error: When the function raises: ``"raise"`` (default: a ``RewardError`` naming the function and the
            run), ``"abstain"`` (None for that run) or ``"zero"`` (scores 0). Either way the error is in the
            scoring report.

    Returns:
        A ``RewardFunction`` (or, without ``fn``, a decorator that makes one), usable wherever rewards are listed.

    Example:
        ```python
        @art.reward
        def found_answer(state, scenario) -> float:
            return float(scenario["answer"] in state["messages"][-1].content)

        @art.reward(name="brevity", weight=0.3)
        def brevity(trajectory) -> dict:
            return {"calls": 1 / len(trajectory.turns())}
        ```
    """

    def declare(f: Callable[..., Any]) -> RewardFunction:
        return RewardFunction(f, name=name, weight=weight, node=node, on_error=on_error)

    return declare(fn) if fn is not None else declare
