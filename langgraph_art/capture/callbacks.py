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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from langgraph_art.capture.assembly import CallRecord, RunRecord, SpanRecord, ToolRecord, assemble
from langgraph_art.capture.recorder import ART_LLM_TYPE, TurnRecorder, call_id_of, choices_of
from langgraph_art.types import NodeSpan, Trajectory, Turn

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_HIDDEN = "langsmith:hidden"  # langgraph.constants.TAG_HIDDEN: nodes LangGraph (or the user) hides from traces


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


@dataclass(slots=True)
class _Run:
    root: UUID
    span: SpanRecord | None
    namespace: str


class TrajectoryCallbackHandler(BaseCallbackHandler):
    """Capture every run of a graph as a ``Trajectory``; pass it in ``config={"callbacks": [handler]}``.

    Finished trajectories are in ``trajectories`` (assembled when read; ``take()`` returns and forgets them). One
    handler may serve many concurrent runs. It never raises into your graph: its own errors are counted in
    ``errors`` and logged. ``Trainer`` and ``gather_groups`` use one for you; this is for capturing runs outside
    training (production traffic, a dataset).

    Args:
        recorders: ChatART recorders (``model.recorder``, shared by every ChatART of a model, or
            ``llm.recorder``) whose calls the handler adopts when LangChain's callbacks never saw them (a node's own
            thread pool).

    Example:
        ```python
        handler = art.TrajectoryCallbackHandler(recorders=[model.recorder])
        graph.invoke({"messages": [("user", "hi")]}, {"callbacks": [handler]})
        trajectory = handler.trajectories[0]   # its node spans, turns (token ids, logprobs) and tool calls
        ```
    """

    run_inline = True  # called in the caller's thread/loop: ordering is exact and nothing is queued
    raise_error = False

    def __init__(self, *, recorders: Iterable[TurnRecorder] = ()) -> None:
        self._lock = threading.RLock()
        self._runs: dict[UUID, _Run] = {}
        self._active: dict[UUID, RunRecord] = {}
        self._calls: dict[UUID, CallRecord] = {}
        self._tools: dict[UUID, ToolRecord] = {}
        self._finished: list[RunRecord] = []
        self._trajectories: list[Trajectory] = []
        self.recorders = list(recorders)
        self.errors = 0

    @property
    def trajectories(self) -> list[Trajectory]:
        """Every finished run, in the order they ended."""
        with self._lock:
            self._assemble()
            return self._trajectories

    def take(self) -> list[Trajectory]:
        """Return the finished trajectories and forget them (for long-lived handlers)."""
        with self._lock:
            self._assemble()
            finished, self._trajectories = self._trajectories, []
            return finished

    def _assemble(self) -> None:
        while self._finished:
            run = self._finished.pop(0)
            try:
                trajectory = assemble(run)
                self._adopt_recorded(trajectory, run.overlapped)
            except Exception:
                self.errors += 1
                log.exception("could not assemble the trajectory of run %s", run.id)
                continue
            self._trajectories.append(trajectory)

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
        if node and namespace and namespace != parent.namespace:
            internal = str(node).startswith("__") or (tags is not None and _HIDDEN in tags)  # __start__ etc.
            if not internal:
                span = SpanRecord(str(run_id), str(node), metadata.get("langgraph_step"), namespace,
                                  parent.span.id if parent.span else None, time.time())  # fmt: skip
                self._active[parent.root].spans.append(span)
        self._track(run_id, _Run(parent.root, span, namespace or parent.namespace))

    @_guarded
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._untrack(run_id)
        if run is None:
            return
        if run.span is not None and run.span.id == str(run_id):
            run.span.end = time.time()
            if run.span.status == "running":
                run.span.status = "ok"
        if run.root == run_id:
            self._finish_root(run_id, outputs, None)

    @_guarded
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._untrack(run_id)
        if run is None:
            return
        if run.span is not None and run.span.id == str(run_id):
            run.span.end = time.time()
            if is_control_flow(error):
                run.span.status = "interrupted"
            else:
                run.span.status, run.span.error = "error", f"{type(error).__name__}: {error}"
        if run.root == run_id:
            self._finish_root(run_id, None, error)

    def _start_root(self, run_id: UUID, name: str | None, inputs: Any, metadata: dict[str, Any]) -> None:
        overlapping = bool(self._active)
        for other in self._active.values():
            other.overlapped = True
        self._active[run_id] = RunRecord(str(run_id), name, inputs, metadata, time.time(), overlapped=overlapping)
        self._track(run_id, _Run(run_id, None, metadata.get("langgraph_checkpoint_ns") or ""))

    def _track(self, run_id: UUID, run: _Run) -> None:
        self._runs[run_id] = run
        self._active[run.root].runs.add(run_id)

    def _untrack(self, run_id: UUID) -> _Run | None:
        """A run ended: forget it (its root keeps only the runs still open, for the cancelled-run sweep)."""
        run = self._runs.pop(run_id, None)
        if run is not None and run.root != run_id:
            root = self._active.get(run.root)
            if root is not None:
                root.runs.discard(run_id)
        return run

    def _finish_root(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        run = self._active.pop(run_id)
        for leftover in run.runs:  # runs that never reported an end (cancelled tasks)
            self._runs.pop(leftover, None)
            self._calls.pop(leftover, None)
            self._tools.pop(leftover, None)
        failure = f"{type(error).__name__}: {error}" if error is not None and not is_control_flow(error) else None
        run.finish(outputs, failure, interrupted=error is not None and failure is None)
        self._finished.append(run)

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
            parent = self._runs[run_id]
        else:
            self._track(run_id, _Run(parent.root, parent.span, parent.namespace))
        invocation = kwargs.get("invocation_params") or {}
        call = CallRecord(str(run_id), messages[0] if messages else [], invocation, metadata or {}, time.time(),
                          invocation.get("_type") == ART_LLM_TYPE)  # fmt: skip
        self._calls[run_id] = call
        (parent.span.calls if parent.span is not None else self._active[parent.root].calls).append(call)

    @_guarded
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._calls.pop(run_id, None)
        run = self._untrack(run_id)
        if call is None or run is None:
            return
        call.end, call.choices = time.time(), choices_of(response, call.invocation)  # not the response: see Choice
        if self.recorders:
            call_id = call_id_of(response)
            for recorder in self.recorders:
                if call_id:
                    recorder.claim(call_id)
        if run.root == run_id:
            self._finish_root(run_id, None, None)

    @_guarded
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._calls.pop(run_id, None)
        run = self._untrack(run_id)
        if call is None or run is None:
            return
        call.end, call.error = time.time(), f"{type(error).__name__}: {error}"
        if run.root == run_id:
            self._finish_root(run_id, None, error)

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
        record = ToolRecord(kwargs.get("tool_call_id"), str(run_id), str(name),
                            inputs if inputs is not None else input_str, time.time())  # fmt: skip
        self._tools[run_id] = record
        (parent.span.tools if parent.span is not None else self._active[parent.root].tools).append(record)

    @_guarded
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._untrack(run_id)
        record = self._tools.pop(run_id, None)
        if record is not None:
            record.end, record.output = time.time(), output

    @_guarded
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._untrack(run_id)
        record = self._tools.pop(run_id, None)
        if record is not None:
            record.end, record.error = time.time(), f"{type(error).__name__}: {error}"

    # -- calls callbacks never saw ---------------------------------------------------------------------------
    def _adopt_recorded(self, trajectory: Trajectory, overlapped: bool) -> None:
        if not self.recorders:
            return
        run_key = trajectory.metadata.get("langgraph_art_run")
        end = trajectory.end_time or time.time()
        window = (trajectory.start_time, end) if not overlapped else (end + 1, end)  # empty when runs overlapped
        for recorder in self.recorders:
            for turn, by_metadata in recorder.take_unclaimed(run_key, *window):
                turn.attribution = "metadata" if by_metadata else "time"
                span = _span_for(trajectory, turn)
                (span.turns if span is not None else trajectory.root_turns).append(turn)


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
