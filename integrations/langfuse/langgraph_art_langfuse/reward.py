"""``LangfuseScoreReward``: scores people (or evaluators) gave in Langfuse, used as rewards.

Training from production feedback: runs captured by langgraph-art (with ChatART, so with token ids) are traced
to Langfuse; people score those traces there (annotation queues, thumbs up/down from the app, evaluators); this
reward fetches the scores of each trajectory's trace and the trainer learns from them like from any reward::

    feedback = LangfuseScoreReward("user-feedback")                   # our traces: ids derived from the runs
    feedback = LangfuseScoreReward("helpfulness", trace_id="langfuse_trace_id")   # ids the app recorded itself
    report = art.score_groups(store.groups(step=3), [feedback])

A run whose trace has no such score abstains (not trained on). Scores we exported ourselves are never read back.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Mapping
from typing import Any, Literal

from langgraph_art import ConfigError, RewardError, Score, Trajectory, TrajectoryGroup
from langgraph_art_langfuse.connection import LangfuseSettings
from langgraph_art_langfuse.traces import SCORE_SOURCE, trace_id

TraceIdOf = Callable[[Trajectory], str | None]


class LangfuseScoreReward:
    """A reward read from Langfuse: the value of the score named ``score_name`` on each run's trace.

    ``trace_id``: how a trajectory finds its trace — None (default: the trace our exporter made for it), the
    name of a metadata key holding a Langfuse trace id (``rollout(..., metadata={"langfuse_trace_id": ...})``),
    or a function ``trajectory -> trace id``. Several scores of that name on one trace (several annotators) are
    combined by ``aggregate`` ("mean", "latest", "min", "max"). Boolean scores count 1/0; categorical ones need
    ``categories={"good": 1.0, "bad": 0.0}``.
    """

    node = None

    def __init__(
        self,
        score_name: str,
        *,
        name: str | None = None,
        weight: float = 1.0,
        trace_id: str | TraceIdOf | None = None,
        aggregate: Literal["mean", "latest", "min", "max"] = "mean",
        categories: Mapping[str, float] | None = None,
        public_key: str | None = None,
        secret_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if not score_name:
            raise ConfigError("LangfuseScoreReward needs the name of the Langfuse score to read, e.g. 'user-feedback'")
        if aggregate not in ("mean", "latest", "min", "max"):
            raise ConfigError(f"aggregate must be 'mean', 'latest', 'min' or 'max', got {aggregate!r}")
        self.score_name, self.name, self.weight = score_name, name or f"langfuse/{score_name}", float(weight)
        self.aggregate, self.categories = aggregate, dict(categories or {})
        self._trace_id = _trace_id_function(trace_id)
        self.settings = LangfuseSettings.resolve(public_key, secret_key, base_url, timeout)
        self._api = self.settings.api()

    def __repr__(self) -> str:
        return f"LangfuseScoreReward({self.score_name!r}, base_url={self.settings.base_url!r})"

    async def ascore_group(self, group: TrajectoryGroup) -> dict[str, Score]:
        traces = {t.id: self._trace_id(t) for t in group.completed()}
        wanted = sorted({tid for tid in traces.values() if tid})
        found = await asyncio.to_thread(self.fetch, wanted) if wanted else {}
        return {
            run: self._score(found.get(tid, []), run, tid) if tid else Score(None, {}) for run, tid in traces.items()
        }

    def fetch(self, trace_ids: list[str]) -> dict[str, list[Any]]:
        """Scores named ``score_name`` on the given traces (paged; 50 trace ids per request), by trace id."""
        by_trace: dict[str, list[Any]] = {tid: [] for tid in trace_ids}
        for start in range(0, len(trace_ids), 50):
            chunk = ",".join(trace_ids[start : start + 50])
            cursor = None
            while True:
                page = self._api.scores.get_many(
                    trace_id=chunk, name=self.score_name, fields="details,subject", limit=100, cursor=cursor
                )
                for score in page.data:
                    owner = _trace_of(score) or (chunk if "," not in chunk else None)
                    if owner in by_trace and (score.metadata or {}).get("source") != SCORE_SOURCE:
                        by_trace[owner].append(score)
                cursor = page.meta.cursor
                if not cursor:
                    break
        return by_trace

    def _score(self, scores: list[Any], run: str, tid: str) -> Score:
        values = [(s.timestamp, self._value(s, run)) for s in scores]
        if not values:
            return Score(None, {})
        numbers = [v for _, v in sorted(values, key=lambda tv: tv[0])]
        combine: dict[str, Callable[[list[float]], float]] = {
            "mean": statistics.fmean,
            "latest": lambda xs: xs[-1],
            "min": min,
            "max": max,
        }
        value = combine[self.aggregate](numbers)
        comments = [s.comment for s in scores if getattr(s, "comment", None)]
        return Score(float(value), {}, explanation="\n".join(comments) or None)

    def _value(self, score: Any, run: str) -> float:
        value, kind = score.value, getattr(score, "data_type", None)
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str) and value in self.categories:
            return float(self.categories[value])
        raise RewardError(
            f"{self!r}: score {score.id} on run {run} is {kind or 'categorical'} {value!r}; pass "
            f"categories={{{value!r}: <number>, ...}} to map its categories to rewards"
        )


def _trace_id_function(spec: str | TraceIdOf | None) -> TraceIdOf:
    if spec is None:
        return lambda t: trace_id(t.id)
    if isinstance(spec, str):
        key = spec
        return lambda t: t.metadata.get(key)
    if callable(spec):
        return spec
    raise ConfigError(f"trace_id must be None, a metadata key or a function trajectory -> trace id, got {spec!r}")


def _trace_of(score: Any) -> str | None:
    subject = getattr(score, "subject", None)
    if subject is None:
        return getattr(score, "trace_id", None)
    kind = getattr(subject, "kind", None)
    if kind == "trace":
        return subject.id
    if kind == "observation":
        return getattr(subject, "trace_id", None)
    return None
