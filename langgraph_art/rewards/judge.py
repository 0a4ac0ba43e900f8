"""``RulerJudge``: score a whole group of runs in one call to any LangChain chat model (the RULER idea).

GRPO only needs scores that are right relative to each other inside a group, so the judge sees every run of a
group at once: the shared beginning of the conversations once, the available tools once, then each run under a
short id, node by node. Scores are mapped back by id (never by position), clamped to [0, 1], and kept with the
judge's explanation. Malformed output, missing or duplicate ids are retried with the problem stated; after
``max_retries`` the ``on_error`` policy applies: ``"raise"`` a ``RewardError``, or ``"skip"`` the group (reported).
Verdicts are cached on disk, keyed by a hash of the judge model, the rubric and the rendered group: under
``cache_dir`` when given, else under the home of the backend a ``Trainer`` trains with (``<home>/judge-cache``), else
under ``LANGGRAPH_ART_HOME`` (``.art/judge-cache``) for a judge used on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field, ValidationError, create_model

from langgraph_art.errors import ConfigError, RewardError
from langgraph_art.rewards.combine import GroupSkipped
from langgraph_art.rewards.decorators import Score
from langgraph_art.rewards.render import render_group
from langgraph_art.store import default_home
from langgraph_art.types import TrajectoryGroup

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = """\
- A run that reaches the user's goal always scores higher than one that does not.
- Among runs that reach the goal, the more efficient one (fewer steps, fewer needless tool calls) scores higher.
- A run that does not reach the goal gets partial credit for real progress toward it.
- Mistakes, made-up facts and ignored instructions lower the score."""

_INSTRUCTIONS = """\
You are grading runs of an AI agent. {scope}

Rubric:
{rubric}

Answer with JSON only, exactly this shape, one entry per run id, each id once:
{{"scores": [{{"trajectory_id": "<id>", "explanation": "<one or two sentences>", "score": <number from 0 to 1>}}]}}"""


class JudgeScore(BaseModel):
    trajectory_id: str
    explanation: str = ""
    score: float


class JudgeVerdict(BaseModel):
    scores: list[JudgeScore]


def verdict_schema(ids: list[str]) -> type[JudgeVerdict]:
    """``JudgeVerdict`` for one group: each ``trajectory_id`` one of ``ids``, one entry per run. A judge whose output
    the schema constrains (a local model under a grammar) can then write no other id: SmolLM2-135M, asked with the
    open schema, wrote an id it made up (an email's) in 16 of 16 groups."""
    allowed: Any = Literal[tuple(ids)]  # the ids as a type: Literal["t1", "t2", ...]
    score: Any = create_model("JudgeScore", __base__=JudgeScore, trajectory_id=(allowed, ...))
    entries = Field(min_length=len(ids), max_length=len(ids))
    return create_model("JudgeVerdict", __base__=JudgeVerdict, scores=(list[score], entries))


class RulerJudge:
    """A group-relative LLM judge usable wherever rewards are listed (``rewards=[fn, judge]``).

    It shows the judge model every run of a group at once (the shared start once, then each run under a short id)
    and asks for a score in [0, 1] per run with an explanation (kept in ``trajectory.explanations``); malformed
    answers are retried with the problem stated. A group of one run is scored on an absolute scale, with a warning.

    Args:
        judge_model: Any LangChain chat model (structured output is used when it supports it, JSON text otherwise).
        rubric: What a better run is, as bullet points (default: reaching the goal first, then efficiency, partial
            credit for progress, penalties for mistakes and made-up facts).
        name: The reward's name in the metrics (``reward/<name>``, ``judge/<name>/...``).
        weight: Its weight in the run's total reward.
        max_retries: Retries of a malformed answer (missing or duplicate ids, not JSON) before ``on_error``.
        on_error: After the retries: ``"raise"`` a ``RewardError``, or ``"skip"`` the group (reported, not trained).
        cache: Keep verdicts on disk, keyed by the judge model, the rubric and the rendered group.
        cache_dir: Where (None: ``<home>/judge-cache``, the trainer's backend's home when a ``Trainer`` uses it).
        max_concurrency: Judge calls at once per event loop (<= 0: no limit).

    Example:
        ```python
        from langchain_openai import ChatOpenAI

        judge = art.RulerJudge(ChatOpenAI(model="gpt-4.1"), rubric="- The answer cites the email it comes from.")
        trainer = art.Trainer(graph, model, rewards=[found_answer, judge])
        ```
    """

    node = None

    def __init__(
        self,
        judge_model: BaseChatModel,
        *,
        rubric: str = DEFAULT_RUBRIC,
        name: str = "ruler",
        weight: float = 1.0,
        max_retries: int = 2,
        on_error: Literal["raise", "skip"] = "raise",
        cache: bool = True,
        cache_dir: str | Path | None = None,
        max_concurrency: int = 4,
    ) -> None:
        if not isinstance(judge_model, BaseChatModel):
            raise ConfigError(f"RulerJudge needs a LangChain chat model, got {type(judge_model).__name__}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        self.judge_model, self.rubric, self.name, self.weight = judge_model, rubric.strip(), name, float(weight)
        self.max_retries, self.on_error = max_retries, on_error
        self.cache_dir = (Path(cache_dir) if cache_dir else default_home() / "judge-cache") if cache else None
        self._cache_dir_given = bool(cache_dir)
        self.max_concurrency = max_concurrency
        # per event loop: a semaphore is bound to the loop that first used it (and refers to it, so entries of
        # closed loops are dropped explicitly in _call)
        self._limits: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._structured: bool | None = None  # unknown until tried
        self.usage: dict[str, float] = {
            "calls": 0,
            "retries": 0,
            "cache_hits": 0,
            "input_tokens": 0,
            "output_tokens": 0,
        }

    def __repr__(self) -> str:
        return f"RulerJudge({self.name!r}, model={_model_id(self.judge_model)!r})"

    def use_home(self, home: str | Path) -> None:
        """Cache under ``<home>/judge-cache``: ``Trainer`` calls it with its backend's home, so the verdicts live with
        the model's other data. A ``cache_dir`` given, or ``cache=False``, stays as it is."""
        if self.cache_dir is not None and not self._cache_dir_given:
            self.cache_dir = Path(home) / "judge-cache"

    async def ascore_group(self, group: TrajectoryGroup) -> dict[str, Score]:
        runs = group.completed()
        if not runs:
            return {}
        ids = {f"t{i + 1}": run.id for i, run in enumerate(runs)}
        text = render_group(runs, list(ids))
        if len(runs) == 1:
            log.warning(
                "group %s has one run: the judge scores it on an absolute scale, not relative to others", group.id
            )
            scope = "There is one run; score it on an absolute scale."
        else:
            scope = f"Score each of the {len(runs)} runs relative to the others: they all try the same task."
        system = _INSTRUCTIONS.format(scope=scope, rubric=self.rubric)
        key = hashlib.sha256(json.dumps([_model_id(self.judge_model), system, text]).encode()).hexdigest()
        verdict = self._cached(key)
        if verdict is None:
            verdict = await self._ask(system, text, list(ids), group.id)
            self._store(key, verdict)
        else:
            self.usage["cache_hits"] += 1
        return {ids[short]: Score(score, {}, explanation=why) for short, (score, why) in verdict.items()}

    async def _ask(self, system: str, text: str, ids: list[str], group_id: str) -> dict[str, tuple[float, str]]:
        messages: list[BaseMessage] = [SystemMessage(system), HumanMessage(text)]
        problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage["retries"] += 1
                messages = [
                    *messages,
                    HumanMessage(
                        f"That answer was not usable: {problem}. Answer again, with "
                        "JSON only, one entry for each run id."
                    ),
                ]
            reply = await self._call(messages, ids)
            try:
                return _parse(reply, ids)
            except ValueError as exc:
                problem = str(exc)
                messages = [*messages, AIMessage(_text(reply)[:4000])]
        reason = f"no usable verdict after {self.max_retries + 1} attempts; last problem: {problem}"
        if self.on_error == "skip":
            log.warning("judge %s skipped group %s: %s", self.name, group_id, reason)
            raise GroupSkipped(reason)
        raise RewardError(f"judge {self.name!r} on group {group_id}: {reason}")

    async def _call(self, messages: list[BaseMessage], ids: list[str]) -> Any:
        if self.max_concurrency <= 0:
            return await self._invoke(messages, ids)
        loop = asyncio.get_running_loop()
        if loop not in self._limits:
            for closed in [other for other in self._limits if other.is_closed()]:
                del self._limits[closed]
            self._limits[loop] = asyncio.Semaphore(self.max_concurrency)
        limit = self._limits[loop]
        async with limit:
            return await self._invoke(messages, ids)

    async def _invoke(self, messages: list[BaseMessage], ids: list[str]) -> Any:
        """Structured output (the group's own ids the only ones allowed: ``verdict_schema``) when the judge model
        supports it; plain text parsed as strict JSON otherwise (and from then on, once structured output has failed
        for this model)."""
        self.usage["calls"] += 1
        if self._structured is not False:
            try:
                structured = self.judge_model.with_structured_output(verdict_schema(ids), include_raw=True)
                out = await structured.ainvoke(messages)
            except Exception as exc:  # noqa: BLE001 - unsupported here: fall back to JSON text, said in the log
                log.info("judge %s: structured output unavailable (%s); parsing JSON text instead", self.name, exc)
                self._structured = False
            else:
                self._structured = True
                self._count(out.get("raw") if isinstance(out, dict) else None)
                return out
        reply = await self.judge_model.ainvoke(messages)
        self._count(reply)
        return reply

    def _count(self, message: Any) -> None:
        usage = getattr(message, "usage_metadata", None) or {}
        self.usage["input_tokens"] += usage.get("input_tokens", 0)
        self.usage["output_tokens"] += usage.get("output_tokens", 0)

    def _cached(self, key: str) -> dict[str, tuple[float, str]] | None:
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return {k: (float(v[0]), str(v[1])) for k, v in data.items()}

    def _store(self, key: str, verdict: dict[str, tuple[float, str]]) -> None:
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".{key}.tmp"
        tmp.write_text(json.dumps(verdict))
        tmp.replace(self.cache_dir / f"{key}.json")


def _model_id(model: BaseChatModel) -> str:
    params = {k: v for k, v in model._identifying_params.items() if isinstance(v, str | int | float | bool)}
    return f"{type(model).__module__}.{type(model).__name__}:{json.dumps(params, sort_keys=True)}"


def _text(reply: Any) -> str:
    message = reply.get("raw") if isinstance(reply, dict) else reply
    content = getattr(message, "content", message)
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _parse(reply: Any, ids: list[str]) -> dict[str, tuple[float, str]]:
    """Strictly parse a verdict: every id exactly once, finite scores (clamped to [0, 1])."""
    if isinstance(reply, dict) and isinstance(reply.get("parsed"), JudgeVerdict):
        verdict = reply["parsed"]
    else:
        raw = _text(reply)
        match = re.search(r"\{.*\}", raw, re.DOTALL)
        if match is None:
            raise ValueError(f"no JSON object in the answer ({raw[:120]!r})")
        try:
            verdict = JudgeVerdict.model_validate_json(match.group(0))
        except ValidationError as exc:
            raise ValueError(f"the JSON does not have the asked shape: {exc.errors()[0]['msg']}") from exc
    seen: dict[str, tuple[float, str]] = {}
    for entry in verdict.scores:
        if entry.trajectory_id in seen:
            raise ValueError(f"run id {entry.trajectory_id!r} appears twice")
        if entry.trajectory_id not in ids:
            raise ValueError(f"unknown run id {entry.trajectory_id!r}; the ids are {ids}")
        if not math.isfinite(entry.score):
            raise ValueError(f"score of {entry.trajectory_id!r} is not a finite number")
        seen[entry.trajectory_id] = (min(1.0, max(0.0, entry.score)), entry.explanation)
    missing = [i for i in ids if i not in seen]
    if missing:
        raise ValueError(f"no score for run ids {missing}")
    return seen
