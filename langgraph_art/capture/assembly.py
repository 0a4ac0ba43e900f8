"""Plain records that the callback handler fills while a run executes, and their assembly into a ``Trajectory``.

Split so that the per-event work inside the user's graph stays a few dict and list operations: converting
messages to OpenAI dicts and building pydantic objects happens once, in ``assemble``, when trajectories are read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.messages import BaseMessage

from langgraph_art.capture.messages import to_jsonable, to_openai_messages
from langgraph_art.capture.recorder import Choice, build_turns
from langgraph_art.types import NodeSpan, ToolCallRecord, Trajectory, TrajectoryStatus, Turn


@dataclass(slots=True)
class CallRecord:
    """One chat-model call: what was asked (raw LangChain objects) and what came back (or the error)."""

    run_id: str
    messages: list[BaseMessage]
    invocation: dict[str, Any]
    metadata: dict[str, Any]
    start: float
    trainable: bool
    end: float | None = None
    choices: list[Choice] | None = None  # set when the call ended (compact: see recorder.Choice)
    error: str | None = None

    def build(self, cache: dict[int, Any]) -> list[Turn]:
        messages = to_openai_messages(self.messages, cache)
        if self.choices is not None:
            return build_turns(messages=messages, invocation=self.invocation, choices=self.choices,
                               metadata=self.metadata, start_time=self.start, end_time=self.end or self.start,
                               trainable=self.trainable, run_id=self.run_id)  # fmt: skip
        return [
            Turn(id=self.run_id, run_id=self.run_id, messages=messages, start_time=self.start, trainable=False,
                 latency_s=(self.end or self.start) - self.start, error=self.error or "the call never finished",
                 source="chat_art" if self.trainable else "other", node=self.metadata.get("langgraph_node"),
                 step=self.metadata.get("langgraph_step"), namespace=self.metadata.get("langgraph_checkpoint_ns"))
        ]  # fmt: skip


@dataclass(slots=True)
class ToolRecord:
    id: str | None
    run_id: str
    name: str
    inputs: Any
    start: float
    output: Any = None
    error: str | None = None
    end: float | None = None

    def build(self, cache: dict[int, Any]) -> ToolCallRecord:
        return ToolCallRecord(id=self.id, run_id=self.run_id, name=self.name, arguments=to_jsonable(self.inputs),
                              result=to_jsonable(getattr(self.output, "content", self.output), cache=cache),
                              error=self.error, start_time=self.start, end_time=self.end)  # fmt: skip


@dataclass(slots=True)
class SpanRecord:
    """A node invocation while it runs."""

    id: str
    name: str
    step: int | None
    namespace: str
    parent_id: str | None
    start: float
    end: float | None = None
    status: str = "running"
    error: str | None = None
    calls: list[CallRecord] = field(default_factory=list)
    tools: list[ToolRecord] = field(default_factory=list)

    def build(self, cache: dict[int, Any]) -> NodeSpan:
        return NodeSpan(id=self.id, name=self.name, step=self.step, namespace=self.namespace,
                        parent_id=self.parent_id, start_time=self.start, end_time=self.end,
                        status=self.status,  # type: ignore[arg-type]
                        error=self.error, turns=[t for c in self.calls for t in c.build(cache)],
                        tool_calls=[t.build(cache) for t in self.tools])  # fmt: skip


@dataclass(slots=True)
class RunRecord:
    """One root run while it executes, then until it is assembled."""

    id: str
    name: str | None
    inputs: Any
    metadata: dict[str, Any]
    start: float
    spans: list[SpanRecord] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)  # made outside any node
    tools: list[ToolRecord] = field(default_factory=list)
    runs: set[UUID] = field(default_factory=set)
    overlapped: bool = False
    end: float | None = None
    outputs: Any = None
    status: TrajectoryStatus = "running"
    error: str | None = None

    def finish(self, outputs: Any, error: str | None, interrupted: bool) -> None:
        """Close the run: spans still running were cancelled; the status follows the error and interrupts."""
        self.end = time.time()
        self.outputs = outputs
        for span in self.spans:
            if span.status == "running":
                span.status, span.end = "error", self.end
                span.error = span.error or "the run ended before this node finished (cancelled)"
        if error is not None:
            self.status, self.error = "failed", error
        elif interrupted or any(s.status == "interrupted" for s in self.spans):
            self.status = "interrupted"
        else:
            self.status = "ok"


def assemble(run: RunRecord) -> Trajectory:
    """Build the ``Trajectory`` of a finished run; each state message is converted once (``cache``)."""
    cache: dict[int, Any] = {}
    return Trajectory(
        id=run.id,
        name=run.name,
        spans=[s.build(cache) for s in run.spans],
        root_turns=[t for c in run.calls for t in c.build(cache)],
        root_tool_calls=[t.build(cache) for t in run.tools],
        input=to_jsonable(run.inputs, cache=cache),
        output=to_jsonable(run.outputs, cache=cache),
        status=run.status,
        error=run.error,
        start_time=run.start,
        end_time=run.end,
        metadata={k: to_jsonable(v) for k, v in run.metadata.items()},
    )
