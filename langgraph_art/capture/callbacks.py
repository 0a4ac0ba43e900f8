"""``TrajectoryCallbackHandler``: one ``Trajectory`` per root run, a tree of ``NodeSpan``s with turns and tool calls.

How node invocations are found: LangGraph runs every node task with metadata ``langgraph_node``,
``langgraph_step`` and ``langgraph_checkpoint_ns`` (unique per task: ``node:task_id``, nested with ``|`` in
subgraphs). A chain run whose checkpoint namespace differs from its parent's is a node invocation; everything
else (routing functions, channel writers, runnables inside a node) belongs to the nearest enclosing span. This
holds for subgraphs added as nodes or invoked inside a node, parallel branches and ``Send`` fan-out.

The handler never raises into the graph: each callback body is guarded, failures are counted in ``errors`` and
logged. LangGraph interrupts (``GraphBubbleUp``) are control flow: the span is marked ``interrupted``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from langgraph_art.capture.messages import to_jsonable, to_openai_messages
from langgraph_art.capture.recorder import ART_LLM_TYPE, TurnRecorder, build_turns
from langgraph_art.types import NodeSpan, ToolCallRecord, Trajectory, Turn

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_HIDDEN = "langgraph:hidden"


def _guarded(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: TrajectoryCallbackHandler, *args: Any, **kwargs: Any) -> None:
        try:
            with self._lock:
                method(self, *args, **kwargs)
        except Exception:
            self.errors += 1
            if self.errors <= 5:
                log.exception("TrajectoryCallbackHandler.%s failed (capture continues)", method.__name__)

    return wrapper  # type: ignore[return-value]


def is_control_flow(error: BaseException) -> bool:
    """LangGraph's interrupts and parent commands bubble up as exceptions; they are not failures."""
    try:
        from langgraph.errors import GraphBubbleUp
    except ImportError:  # pragma: no cover - langgraph is a core dependency
        return False
    return isinstance(error, GraphBubbleUp)


@dataclass
class _Run:
    root: UUID
    span: NodeSpan | None
    namespace: str


@dataclass
class _Pending:
    messages: Sequence[BaseMessage]
    invocation: dict[str, Any]
    metadata: dict[str, Any]
    start: float
    trainable: bool


@dataclass
class _Active:
    trajectory: Trajectory
    runs: set[UUID] = field(default_factory=set)
    converted: dict[int, dict[str, Any]] = field(default_factory=dict)  # message id -> OpenAI dict
    overlapped: bool = False


class TrajectoryCallbackHandler(BaseCallbackHandler):
    """Capture every run of a graph as a ``Trajectory``; pass it in ``config={"callbacks": [handler]}``.

    Finished trajectories accumulate in ``trajectories``. One handler may serve many concurrent runs. Give it
    ChatART recorders (``recorders=[llm.recorder]``) to also adopt calls that callbacks never saw.
    """

    run_inline = True  # called in the caller's thread/loop: ordering is exact and nothing is queued
    raise_error = False

    def __init__(self, *, recorders: Iterable[TurnRecorder] = ()) -> None:
        self._lock = threading.RLock()
        self._runs: dict[UUID, _Run] = {}
        self._active: dict[UUID, _Active] = {}
        self._pending: dict[UUID, _Pending] = {}
        self._tools: dict[UUID, ToolCallRecord] = {}
        self.recorders = list(recorders)
        self.trajectories: list[Trajectory] = []
        self.errors = 0
        self.unattributed_turns = 0

    # -- chains: graph runs and node invocations -------------------------------------------------------------
    @_guarded
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        metadata = metadata or {}
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            self._start_root(run_id, kwargs.get("name"), inputs, metadata)
            return
        namespace = metadata.get("langgraph_checkpoint_ns") or ""
        node = metadata.get("langgraph_node")
        span = parent.span
        internal = str(node).startswith("__") or (tags is not None and _HIDDEN in tags)  # __start__ etc.
        if node and namespace and namespace != parent.namespace and not internal:
            span = NodeSpan(
                id=str(run_id),
                name=str(node),
                step=metadata.get("langgraph_step"),
                namespace=namespace,
                parent_id=parent.span.id if parent.span else None,
                start_time=time.time(),
            )
            self._active[parent.root].trajectory.spans.append(span)
        self._track(run_id, _Run(parent.root, span, namespace or parent.namespace))

    @_guarded
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.span is not None and run.span.id == str(run_id):
            run.span.end_time = time.time()
            if run.span.status == "running":
                run.span.status = "ok"
        if run.root == run_id:
            self._finish_root(run_id, outputs, None)

    @_guarded
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        if run.span is not None and run.span.id == str(run_id):
            run.span.end_time = time.time()
            run.span.status = "interrupted" if is_control_flow(error) else "error"
            if not is_control_flow(error):
                run.span.error = f"{type(error).__name__}: {error}"
        if run.root == run_id:
            self._finish_root(run_id, None, error)

    def _start_root(self, run_id: UUID, name: str | None, inputs: Any, metadata: dict[str, Any]) -> None:
        overlapping = bool(self._active)
        for other in self._active.values():
            other.overlapped = True
        trajectory = Trajectory(
            id=str(run_id),
            name=name,
            input=to_jsonable(inputs),
            start_time=time.time(),
            metadata={k: to_jsonable(v) for k, v in metadata.items()},
        )
        self._active[run_id] = _Active(trajectory=trajectory, overlapped=overlapping)
        self._track(run_id, _Run(run_id, None, metadata.get("langgraph_checkpoint_ns") or ""))

    def _track(self, run_id: UUID, run: _Run) -> None:
        self._runs[run_id] = run
        self._active[run.root].runs.add(run_id)

    def _finish_root(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        active = self._active.pop(run_id)
        trajectory = active.trajectory
        trajectory.end_time = time.time()
        for leftover in active.runs:  # runs that never reported an end (cancelled tasks)
            self._runs.pop(leftover, None)
            self._pending.pop(leftover, None)
            self._tools.pop(leftover, None)
        for span in trajectory.spans:
            if span.status == "running":
                span.status, span.end_time = "error", trajectory.end_time
                span.error = span.error or "the run ended before this node finished (cancelled)"
        if error is not None and not is_control_flow(error):
            trajectory.status, trajectory.error = "failed", f"{type(error).__name__}: {error}"
        elif error is not None or any(s.status == "interrupted" for s in trajectory.spans):
            trajectory.status = "interrupted"
        else:
            trajectory.status = "ok"
        if outputs is not None:
            trajectory.output = to_jsonable(outputs)
        self._adopt_recorded(active)
        self.trajectories.append(trajectory)

    # -- chat model calls ------------------------------------------------------------------------------------
    @_guarded
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:  # a chat model invoked on its own with this handler: a trajectory of one call
            self._start_root(run_id, kwargs.get("name"), {"messages": messages[0] if messages else []}, {})
        else:
            self._track(run_id, _Run(parent.root, parent.span, parent.namespace))
        invocation = kwargs.get("invocation_params") or {}
        self._pending[run_id] = _Pending(
            messages=messages[0] if messages else [],
            invocation=invocation,
            metadata=metadata or {},
            start=time.time(),
            trainable=invocation.get("_type") == ART_LLM_TYPE,
        )

    @_guarded
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        pending = self._pending.pop(run_id, None)
        run = self._runs.pop(run_id, None)
        if pending is None or run is None:
            return
        active = self._active[run.root]
        turns = build_turns(
            messages=to_openai_messages(pending.messages, active.converted),
            invocation=pending.invocation,
            result=response,
            metadata=pending.metadata,
            start_time=pending.start,
            end_time=time.time(),
            trainable=pending.trainable,
            run_id=str(run_id),
        )
        self._attach(active.trajectory, run.span, turns)
        for recorder in self.recorders:
            for call_id in {t.call_id for t in turns if t.call_id}:
                recorder.claim(call_id)
        if run.root == run_id:
            self._finish_root(run_id, None, None)

    @_guarded
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        pending = self._pending.pop(run_id, None)
        run = self._runs.pop(run_id, None)
        if pending is None or run is None:
            return
        active = self._active[run.root]
        turn = Turn(
            id=str(run_id),
            run_id=str(run_id),
            start_time=pending.start,
            messages=to_openai_messages(pending.messages, active.converted),
            latency_s=time.time() - pending.start,
            trainable=False,
            error=f"{type(error).__name__}: {error}",
            source="chat_art" if pending.trainable else "other",
            node=pending.metadata.get("langgraph_node"),
            step=pending.metadata.get("langgraph_step"),
        )
        self._attach(active.trajectory, run.span, [turn])
        if run.root == run_id:
            self._finish_root(run_id, None, error)

    @staticmethod
    def _attach(trajectory: Trajectory, span: NodeSpan | None, turns: list[Turn]) -> None:
        (span.turns if span is not None else trajectory.root_turns).extend(turns)

    # -- tools -----------------------------------------------------------------------------------------------
    @_guarded
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            return
        self._track(run_id, _Run(parent.root, parent.span, parent.namespace))
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        record = ToolCallRecord(
            id=kwargs.get("tool_call_id"),
            run_id=str(run_id),
            name=str(name),
            arguments=to_jsonable(inputs) if inputs is not None else input_str,
            start_time=time.time(),
        )
        self._tools[run_id] = record
        trajectory = self._active[parent.root].trajectory
        (parent.span.tool_calls if parent.span is not None else trajectory.root_tool_calls).append(record)

    @_guarded
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)
        record = self._tools.pop(run_id, None)
        if record is not None:
            record.end_time = time.time()
            record.result = to_jsonable(getattr(output, "content", output))

    @_guarded
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)
        record = self._tools.pop(run_id, None)
        if record is not None:
            record.end_time = time.time()
            record.error = f"{type(error).__name__}: {error}"

    # -- calls callbacks never saw ---------------------------------------------------------------------------
    def _adopt_recorded(self, active: _Active) -> None:
        trajectory = active.trajectory
        run_key = trajectory.metadata.get("langgraph_art_run")
        for recorder in self.recorders:
            end = trajectory.end_time or time.time()
            window = (trajectory.start_time, end) if not active.overlapped else (end + 1, end)  # empty if shared
            for turn, by_metadata in recorder.take_unclaimed(run_key, *window):
                turn.attribution = "metadata" if by_metadata else "time"
                span = _span_for(trajectory, turn)
                self._attach(trajectory, span, [turn])

    def take(self) -> list[Trajectory]:
        """Return the finished trajectories and forget them (for long-lived handlers)."""
        with self._lock:
            finished, self.trajectories = self.trajectories, []
            return finished


def _span_for(trajectory: Trajectory, turn: Turn) -> NodeSpan | None:
    """The span a recorded turn belongs to: by its node metadata if it has some, else the one innermost span
    that was running when the call started (None when that is ambiguous: the turn stays at the root)."""
    if turn.namespace:
        match = [s for s in trajectory.spans if s.namespace == turn.namespace]
        if len(match) == 1:
            return match[0]
    running = [s for s in trajectory.spans if s.start_time <= turn.start_time <= (s.end_time or float("inf"))]
    parents = {s.parent_id for s in running}
    innermost = [s for s in running if s.id not in parents]
    return innermost[0] if len(innermost) == 1 else None
