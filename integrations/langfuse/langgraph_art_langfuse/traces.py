"""A stored ``Trajectory`` as a Langfuse trace: OpenTelemetry spans with Langfuse's attributes, and its scores.

The tree, per rollout::

    <trajectory name>            span        root: session = training run, tags = step/group/scenario/split
      <node>                     span        one per node invocation (subgraph nodes nest under their parent)
        ChatART <model@step>     generation  one per LLM turn: messages in/out, usage, sampled tokens, logprob sum
        <tool name>              tool        one per tool call: arguments in, result out

Ids are derived from ours: the trace id is ``Langfuse.create_trace_id(seed=trajectory.id)`` (what the SDK gives
for that seed, so another process can attach scores), observation ids hash the trajectory id with the span's own
id. Re-sending a trajectory therefore overwrites the same trace instead of making a second one. Spans carry the
run's real start and end times.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_art import Trajectory
from langgraph_art.types import ModelRef, NodeSpan, ToolCallRecord, Turn

TRACER_NAME = "langfuse-sdk"  # the SDK's instrumentation scope: the server reads our spans exactly like its own
SCORE_SOURCE = "langgraph-art"  # metadata["source"] of the scores we write; imports skip them


def trace_id(seed: str) -> str:
    """The Langfuse trace id of a trajectory (or of any seed): 32 hex characters, the SDK's own derivation."""
    from langfuse import Langfuse

    return Langfuse.create_trace_id(seed=seed)


def observation_id(trajectory_id: str, key: str) -> str:
    """A 16-hex-character OpenTelemetry span id, stable for ``(trajectory, key)``."""
    digest = hashlib.sha256(f"{trajectory_id}\x00{key}".encode()).digest()[:8]
    return digest.hex() if any(digest) else "0000000000000001"


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _ns(seconds: float | None, fallback: float) -> int:
    return int((seconds if seconds else fallback) * 1e9)


class SpanBuilder:
    """Builds finished OpenTelemetry spans (not exported: the caller sends them and learns if they arrived)."""

    def __init__(self, public_key: str, environment: str | None = None) -> None:
        from langfuse import LangfuseOtelSpanAttributes
        from langfuse import __version__ as sdk_version
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator

        self.attr = LangfuseOtelSpanAttributes
        self.environment = environment
        self._done: list[Any] = []
        done, chosen = self._done, threading.local()

        class _Collect(SpanProcessor):
            def on_end(self, span: Any) -> None:
                done.append(span)

        class _ChosenIds(IdGenerator):  # hands out the ids ``_start`` chose (per thread), for the next span
            def generate_trace_id(self) -> int:
                return int(chosen.trace)

            def generate_span_id(self) -> int:
                return int(chosen.span)

        self._chosen = chosen
        self._provider = TracerProvider(id_generator=_ChosenIds())  # ours alone: the global provider is untouched
        self._provider.add_span_processor(_Collect())
        self._tracer = self._provider.get_tracer(TRACER_NAME, sdk_version, attributes={"public_key": public_key})
        self._lock = threading.Lock()

    def trajectory(self, t: Trajectory, *, session_id: str | None = None) -> list[Any]:
        """All spans of one trajectory, root first."""
        with self._lock:
            self._done.clear()
            tid = trace_id(t.id)
            end = t.end_time or t.start_time
            tags = [f"{k}:{t.metadata[m]}" for k, m in _TAGS if t.metadata.get(m) is not None]
            fork = t.metadata.get("branch")
            if isinstance(fork, Mapping):  # a continuation: linked to the run it forked from
                tags += ["branch", f"fork:{fork.get('node')}@{fork.get('depth')}"]
            session = session_id or t.metadata.get("training_run")
            root_attrs = {
                self.attr.TRACE_NAME: t.name or "rollout",
                self.attr.TRACE_TAGS: [*tags, f"status:{t.status}"],
                **self._observation("span", t.input, t.output, _root_metadata(t)),
                **self._level(t.error),
            }
            if session:
                root_attrs[self.attr.TRACE_SESSION_ID] = str(session)
            root = self._start(tid, observation_id(t.id, "root"), t.name or "rollout", t.start_time, root_attrs, None)
            spans: dict[str, Any] = {}
            for span in t.spans:  # start order: a parent always comes before its children
                parent = spans.get(span.parent_id or "", root)
                spans[span.id] = self._node(t, tid, span, parent, session, end)
            for turn in t.root_turns:
                self._turn(t, tid, turn, root, session, end)
            for call in t.root_tool_calls:
                self._tool(t, tid, call, root, session, end)
            for span in reversed(t.spans):
                spans[span.id].end(end_time=_ns(span.end_time, end))
            root.end(end_time=_ns(t.end_time, end))
            return list(reversed(self._done))

    def step(self, record: Mapping[str, Any]) -> list[Any]:
        """One span for a training step: its metrics as metadata (and, sent separately, as scores)."""
        with self._lock:
            self._done.clear()
            step, run, name = step_number(record), str(record["run"]), record.get("model")
            finished = float(record.get("finished") or 0.0)
            started = float(record.get("started") or finished)
            what = "eval after step" if is_eval(record) else "train step"
            tags = ["evaluation", "split:eval"] if is_eval(record) else ["training-step", "split:train"]
            attrs = {
                self.attr.TRACE_NAME: f"{name} · {what} {step}" if name else f"{what} {step}",
                self.attr.TRACE_SESSION_ID: run,
                self.attr.TRACE_TAGS: [*tags, f"step:{step}"],
                **self._observation("span", {"step": step}, {"updated": record.get("train/updated")}, record),
            }
            key = step_key(record)
            span = self._start(trace_id(key), observation_id(key, "root"), f"{what} {step}", started, attrs, None)
            span.end(end_time=_ns(finished, started))
            return list(self._done)

    # -- pieces --------------------------------------------------------------------------------------------
    def _node(self, t: Trajectory, tid: str, span: NodeSpan, parent: Any, session: Any, end: float) -> Any:
        meta = {  # rewards are not here but in scores: a trace is sent once, scores again when they change
            "langgraph_step": span.step,
            "langgraph_namespace": span.namespace or None,
            "status": span.status,
        }
        attrs = {**self._observation("span", None, None, meta), **self._level(span.error), **self._session(session)}
        node = self._start(tid, observation_id(t.id, f"span:{span.id}"), span.name, span.start_time, attrs, parent)
        for turn in span.turns:
            self._turn(t, tid, turn, node, session, end)
        for call in span.tool_calls:
            self._tool(t, tid, call, node, session, end)
        return node

    def _turn(self, t: Trajectory, tid: str, turn: Turn, parent: Any, session: Any, end: float) -> None:
        model = _model_name(turn)
        meta = {
            "node": turn.node,
            "policy_step": turn.policy_step,
            "sampled_tokens": len(turn.token_ids),
            "logprob_sum": _logprob_sum(turn.logprobs),
            "finish_reason": turn.finish_reason,
            "constrained": turn.grammar is not None,  # sampled under a grammar: structured output, a forced call
            "closing_tokens": turn.closing_tokens,  # appended by the server to close a structure max_tokens cut
            "unparsed_tool_calls": turn.unparsed_tool_calls,  # call-like text the server's parser could not read
            "trainable": turn.trainable and turn.has_tokens,
            "source": turn.source,
            "call_id": turn.call_id,
            "latency_s": turn.latency_s,
        }
        usage = {"output": len(turn.token_ids)} if turn.token_ids else {}
        if turn.prompt_token_ids:
            usage["input"] = len(turn.prompt_token_ids)
        if usage:
            usage["total"] = sum(usage.values())
        attrs = {
            **self._observation("generation", _prompt(turn), turn.output or None, meta),
            **self._level(turn.error),
            **self._session(session),
            self.attr.OBSERVATION_MODEL: model,
        }
        if usage:
            attrs[self.attr.OBSERVATION_USAGE_DETAILS] = _json(usage)
        params = {k: v for k, v in turn.params.items() if isinstance(v, str | int | float | bool)}
        if params:
            attrs[self.attr.OBSERVATION_MODEL_PARAMETERS] = _json(params)
        key = f"turn:{turn.id}:{turn.choice_index}"
        span = self._start(tid, observation_id(t.id, key), f"ChatART {model}", turn.start_time, attrs, parent)
        stop = turn.start_time + turn.latency_s if turn.latency_s is not None else None
        span.end(end_time=_ns(stop, turn.start_time or end))

    def _tool(self, t: Trajectory, tid: str, call: ToolCallRecord, parent: Any, session: Any, end: float) -> None:
        attrs = {
            **self._observation("tool", call.arguments, call.result, {"tool_call_id": call.id}),
            **self._level(call.error),
            **self._session(session),
        }
        key = f"tool:{call.run_id or call.id or call.name}:{call.start_time}"
        span = self._start(tid, observation_id(t.id, key), call.name, call.start_time, attrs, parent)
        span.end(end_time=_ns(call.end_time, call.start_time or end))

    def _start(self, tid: str, sid: str, name: str, start: float, attrs: dict[str, Any], parent: Any) -> Any:
        from opentelemetry import trace

        if self.environment:
            attrs[self.attr.ENVIRONMENT] = self.environment
        context = trace.set_span_in_context(parent) if parent is not None else None
        self._chosen.trace, self._chosen.span = int(tid, 16), int(sid, 16)
        return self._tracer.start_span(name, context=context, attributes=attrs, start_time=_ns(start, 0.0))

    def _observation(self, kind: str, input: Any, output: Any, metadata: Mapping[str, Any]) -> dict[str, Any]:
        attrs: dict[str, Any] = {self.attr.OBSERVATION_TYPE: kind}
        if input is not None:
            attrs[self.attr.OBSERVATION_INPUT] = _json(input)
        if output is not None:
            attrs[self.attr.OBSERVATION_OUTPUT] = _json(output)
        for key, value in metadata.items():  # the SDK's format: one JSON-encoded attribute per key
            if value is not None:
                attrs[f"{self.attr.OBSERVATION_METADATA}.{key}"] = json.dumps(value, default=str, ensure_ascii=False)
        return attrs

    def _level(self, error: str | None) -> dict[str, Any]:
        if not error:
            return {}
        return {self.attr.OBSERVATION_LEVEL: "ERROR", self.attr.OBSERVATION_STATUS_MESSAGE: error}

    def _session(self, session: Any) -> dict[str, Any]:
        return {self.attr.TRACE_SESSION_ID: str(session)} if session else {}


_TAGS = (("step", "policy_step"), ("group", "group_id"), ("scenario", "scenario_id"), ("split", "split"))


def step_number(record: Mapping[str, Any]) -> int:
    """Which training step of its run a metrics record is (older records only have the checkpoint step)."""
    return int(record.get("iteration", record["step"]))


def is_eval(record: Mapping[str, Any]) -> bool:
    """True for an evaluation's record (``Trainer(eval_scenarios=...)``), False for a training step's."""
    return record.get("split") == "eval"


def step_key(record: Mapping[str, Any]) -> str:
    """The delivery key (and trace-id seed) of a training step's (or an evaluation's) record."""
    return f"{'eval' if is_eval(record) else 'step'}:{record['run']}:{step_number(record)}"


def _model_name(turn: Turn) -> str:
    """``name@step``: what was served, with the policy step even when the model name lacks it."""
    ref = ModelRef.parse(turn.model or "unknown")
    return str(ref.at(turn.policy_step) if ref.latest and turn.policy_step is not None else ref)


def _logprob_sum(logprobs: Sequence[float]) -> float | None:
    total = math.fsum(logprobs) if logprobs else None
    return total if total is None or math.isfinite(total) else None


def _prompt(turn: Turn) -> Any:
    return {"messages": turn.messages, "tools": turn.tools} if turn.tools else turn.messages


def _root_metadata(t: Trajectory) -> dict[str, Any]:
    """The trace's metadata: the run's scalar metadata; a continuation's fork point (``branch_*``) with the trace id
    of the run it forked from (``branch_parent_trace_id``: the link to open in Langfuse)."""
    meta = {k: v for k, v in t.metadata.items() if isinstance(v, str | int | float | bool)}
    fork = t.metadata.get("branch")
    if isinstance(fork, Mapping):
        meta.update({f"branch_{k}": v for k, v in fork.items() if isinstance(v, str | int | float | bool)})
        if fork.get("parent_run"):
            meta["branch_parent_trace_id"] = trace_id(str(fork["parent_run"]))
    return {"trajectory_id": t.id, "status": t.status, **meta}


# -- scores --------------------------------------------------------------------------------------------------
def score_id(subject: str, name: str) -> str:
    """A stable score id: the same score sent again updates it in Langfuse instead of adding another."""
    return hashlib.sha256(f"{subject}\x00{name}".encode()).hexdigest()[:32]


def trajectory_scores(t: Trajectory) -> list[dict[str, Any]]:
    """The scores of one run: ``reward`` (the weighted total; comment: the judges' explanations; metadata: the
    GRPO advantage), ``reward/<name>`` per reward and sub-score, and the same for node rewards on node spans."""
    tid = trace_id(t.id)
    meta = {
        "source": SCORE_SOURCE,
        "trajectory_id": t.id,
        "advantage": t.metadata.get("advantage"),
        "policy_step": t.metadata.get("policy_step"),
        "group_id": t.group_id,
        "scenario_id": t.scenario_id,
    }
    meta = {k: v for k, v in meta.items() if v is not None}
    explanation = "\n\n".join(f"{name}: {text}" for name, text in t.explanations.items()) or None
    scores = []
    if t.reward is not None:
        scores.append(_score(tid, None, "reward", t.reward, explanation, meta))
    for key, value in t.rewards.items():
        scores.append(_score(tid, None, f"reward/{key}", value, t.explanations.get(key), meta))
    for span in t.spans:
        oid = observation_id(t.id, f"span:{span.id}")
        if span.reward is not None:
            scores.append(_score(tid, oid, "reward", span.reward, None, {**meta, "node": span.name}))
        for key, value in span.rewards.items():
            scores.append(_score(tid, oid, f"reward/{key}", value, None, {**meta, "node": span.name}))
    return scores


def step_scores(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A training step's numeric metrics as scores on its trace (``reward/mean``, ``train/loss``, ...)."""
    meta = {"source": SCORE_SOURCE, "run": str(record["run"]), "step": step_number(record)}
    tid = trace_id(step_key(record))
    skip = {"step", "iteration", "policy_step", "run", "started", "finished", "split"}
    return [
        _score(tid, None, name, value, None, meta)
        for name, value in record.items()
        if name not in skip and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]


def _score(tid: str, oid: str | None, name: str, value: float, comment: str | None, meta: dict) -> dict[str, Any]:
    score: dict[str, Any] = {
        "id": score_id(f"{tid}/{oid or ''}", name),
        "traceId": tid,
        "name": name,
        "value": float(value),
        "dataType": "NUMERIC",
        "metadata": meta,
    }
    if oid:
        score["observationId"] = oid
    if comment:
        score["comment"] = comment
    return score


def digest(item: Any) -> str:
    return hashlib.sha256(json.dumps(item, sort_keys=True, default=str).encode()).hexdigest()[:16]
