"""``LangfuseExporter``: send stored trajectories to Langfuse as traces, their rewards as scores — exactly once.

The trajectory store stays the source of truth. What Langfuse confirmed receiving is recorded in the store
(``deliveries``: one key per trace, score and training step, with a digest of what was sent), so an export sends
only what is missing or changed: after an outage, the next export (the trainer's next step, or
``langgraph-art export langfuse``) delivers the rest, and nothing that arrived is sent twice.

Spans are built here and sent by the exporter itself, in batches of at most ``max_batch_spans``, each batch one
OTLP request whose answer we read. No OpenTelemetry queue sits in between, so none can overflow and drop a
step's spans, and a failed request is known, not guessed. Inside a trainer, exports run on a background thread
(``submit``, once per training step): training never waits for Langfuse, whether it is down, slow or answering
5xx; ``flush(timeout)`` waits a bounded time at the end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langgraph_art import Trajectory, TrajectoryStore
from langgraph_art_langfuse.connection import LangfuseSettings
from langgraph_art_langfuse.traces import (
    SpanBuilder,
    digest,
    step_key,
    step_scores,
    trajectory_scores,
)

log = logging.getLogger(__name__)
SINK = "langfuse"


@dataclass
class ExportReport:
    """What one export did. ``failed`` items stay in the store and go with the next export."""

    traces: int = 0
    spans: int = 0
    scores: int = 0
    steps: int = 0
    unchanged: int = 0
    failed: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def add(self, other: ExportReport) -> None:
        for name in ("traces", "spans", "scores", "steps", "unchanged", "failed", "rejected"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(other.errors)

    def __str__(self) -> str:
        text = (
            f"{self.traces} traces ({self.spans} spans), {self.scores} scores, {self.steps} training steps sent; "
            f"{self.unchanged} already in Langfuse"
        )
        if self.rejected:
            text += f"; {self.rejected} scores rejected by Langfuse"
        if self.failed:
            text += f"; {self.failed} not delivered ({self.errors[-1] if self.errors else 'unknown error'})"
        return text


class LangfuseExporter:
    """Export a project's trajectories (and training steps) from ``store`` to Langfuse.

    Keys and URL come from the arguments or ``LANGFUSE_PUBLIC_KEY``/``LANGFUSE_SECRET_KEY``/``LANGFUSE_BASE_URL``.
    """

    def __init__(
        self,
        store: TrajectoryStore,
        *,
        public_key: str | None = None,
        secret_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        environment: str | None = None,
        session_id: str | None = None,
        max_batch_spans: int = 512,
        max_batch_scores: int = 100,
    ) -> None:
        self.settings = LangfuseSettings.resolve(public_key, secret_key, base_url, timeout, environment)
        self.store, self.session_id = store, session_id
        self.max_batch_spans, self.max_batch_scores = max(1, max_batch_spans), max(1, min(max_batch_scores, 100))
        self._builder = SpanBuilder(self.settings.public_key, self.settings.environment)
        self._otlp = self.settings.span_exporter()
        self._api = self.settings.api()
        self._sending = threading.Lock()  # one export at a time (background worker or an explicit call)
        # background state
        self._cond = threading.Condition()
        self._pending, self._since = False, cast(int | None, None)  # a round is due: steps >= _since (None: all)
        self._steps: list[dict[str, Any]] = []  # training-step records seen by this exporter
        self._retry, self._retry_since = False, cast(int | None, None)  # a round failed from this step on
        self._busy, self._closed = False, False
        self._worker: threading.Thread | None = None
        self.total = ExportReport()  # everything the background rounds did
        self.last = ExportReport()  # the latest round: it retried all that earlier rounds left behind

    @classmethod
    def from_env(cls, store: TrajectoryStore, **kwargs: Any) -> LangfuseExporter | None:
        """An exporter when ``LANGFUSE_PUBLIC_KEY`` and ``LANGFUSE_SECRET_KEY`` are set, else None."""
        return cls(store, **kwargs) if LangfuseSettings.configured() else None

    # -- one synchronous export ------------------------------------------------------------------------------
    def export(
        self,
        *,
        since_step: int | None = None,
        trajectories: Iterable[Trajectory] | None = None,
        steps: Sequence[Mapping[str, Any]] = (),
    ) -> ExportReport:
        """Send what Langfuse does not have yet: finished trajectories (all, those of policy step ``since_step``
        and later, or the given ones) with their scores, and training-step records. Never raises for an
        unreachable or failing Langfuse: the report counts what was not delivered."""
        with self._sending:
            report = ExportReport()
            runs = list(trajectories) if trajectories is not None else self.store.trajectories(since_step=since_step)
            runs = [t for t in runs if t.status != "running"]
            scores = [s for t in runs for s in trajectory_scores(t)]
            scores += [s for record in steps for s in step_scores(record)]
            keys = [f"trace:{t.id}" for t in runs] + [step_key(r) for r in steps] + [f"score:{s['id']}" for s in scores]
            sent = self.store.delivered(SINK, keys)
            todo = [t for t in runs if sent.get(f"trace:{t.id}") != "1"]
            report.unchanged += len(runs) - len(todo)
            self._send_traces(todo, report)
            new_steps = [r for r in steps if sent.get(step_key(r)) != "1"]
            report.unchanged += len(steps) - len(new_steps)
            self._send_steps(new_steps, report)
            pending = [s for s in scores if sent.get(f"score:{s['id']}") != digest(s)]
            report.unchanged += len(scores) - len(pending)
            self._send_scores(pending, report)
            return report

    def _send_traces(self, runs: list[Trajectory], report: ExportReport) -> None:
        batch: list[tuple[Trajectory, list[Any]]] = []
        for index, t in enumerate(runs):
            spans = self._builder.trajectory(t, session_id=self.session_id)
            if batch and sum(len(s) for _, s in batch) + len(spans) > self.max_batch_spans:
                if not self._post_traces(batch, report):
                    report.failed += len(runs) - index
                    return
                batch = []
            batch.append((t, spans))
        if batch:
            self._post_traces(batch, report)

    def _post_traces(self, batch: list[tuple[Trajectory, list[Any]]], report: ExportReport) -> bool:
        if not self._post([s for _, spans in batch for s in spans], report):
            report.failed += len(batch)
            return False
        self.store.mark_delivered(SINK, [(f"trace:{t.id}", "1") for t, _ in batch])
        report.traces += len(batch)
        return True

    def _send_steps(self, records: list[Mapping[str, Any]], report: ExportReport) -> None:
        for index, record in enumerate(records):
            if not self._post(self._builder.step(record), report):
                report.failed += len(records) - index
                return
            self.store.mark_delivered(SINK, [(step_key(record), "1")])
            report.steps += 1

    def _post(self, spans: list[Any], report: ExportReport) -> bool:
        """One OTLP request (the exporter retries 429/5xx within the timeout); True when Langfuse accepted it."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            ok = self._otlp.export(spans) is SpanExportResult.SUCCESS
        except Exception as exc:  # the exporter reports failures as FAILURE; anything raised is one too
            log.debug("Langfuse span export raised", exc_info=True)
            report.errors.append(f"{type(exc).__name__}: {exc}")
            return False
        if not ok:
            report.errors.append(f"Langfuse did not accept {len(spans)} spans at {self.settings.base_url}")
            return False
        report.spans += len(spans)
        return True

    def _send_scores(self, scores: list[dict[str, Any]], report: ExportReport) -> None:
        from langfuse.api.scores.types.create_score_batch_results import CreateScoreBatchResults

        for start in range(0, len(scores), self.max_batch_scores):
            batch = scores[start : start + self.max_batch_scores]
            try:
                answer = self._api.scores.create(request=batch, request_options={"max_retries": 2})
            except Exception as exc:  # ApiError (4xx/5xx after retries) or a transport error
                log.debug("Langfuse score upload raised", exc_info=True)
                report.failed += len(scores) - start
                report.errors.append(_describe(exc))
                return
            if isinstance(answer, CreateScoreBatchResults) and answer.rejected:
                # A 207: Langfuse validated and refused some; sending the same again would be refused again.
                report.rejected += answer.rejected
                messages = "; ".join(e.message for e in answer.errors)
                log.warning("Langfuse rejected %d of %d scores: %s", answer.rejected, len(batch), messages)
            self.store.mark_delivered(SINK, [(f"score:{s['id']}", digest(s)) for s in batch])
            report.scores += len(batch) - (answer.rejected if isinstance(answer, CreateScoreBatchResults) else 0)

    # -- in the background, once per training step -----------------------------------------------------------
    def submit(self, *, step: int | None = None, record: Mapping[str, Any] | None = None) -> None:
        """Export in the background: trajectories of policy step ``step`` (plus anything earlier that did not
        arrive) and the training-step ``record``. Returns at once."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this LangfuseExporter is closed")
            if record is not None:
                self._steps.append(dict(record))
            since = step
            if self._retry:
                since = _earliest(since, self._retry_since)
            if self._pending:
                since = _earliest(since, self._since)
            self._pending, self._since = True, since
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="langgraph-art-langfuse", daemon=True)
                self._worker.start()
            self._cond.notify_all()

    @property
    def backlog(self) -> int:
        """How many items the latest background round could not deliver (they wait in the store)."""
        return self.last.failed

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait (at most ``timeout`` seconds) until submitted exports are done; True when all were attempted."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush, then stop the background thread."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                since, self._pending = self._since, False
                steps, self._busy = list(self._steps), True
            report = ExportReport()
            try:
                report = self.export(since_step=since, steps=steps)
            except Exception as exc:  # e.g. a store error: reported, never raised into training
                log.warning("Langfuse export failed: %s", exc, exc_info=True)
                report.failed, report.errors = report.failed + 1, [f"{type(exc).__name__}: {exc}"]
            self._after_round(since, len(steps), report)

    def _after_round(self, since: int | None, steps_sent: int, report: ExportReport) -> None:
        with self._cond:
            was_down = not self.last.ok
            self.total.add(report)
            self.last = report
            self._busy = False
            if report.ok:
                self._retry = False
                del self._steps[:steps_sent]  # all delivered; records submitted since stay for the next round
            else:
                self._retry_since = _earliest(self._retry_since, since) if self._retry else since
                self._retry = True
            self._cond.notify_all()
        if not report.ok and not was_down:
            log.warning(
                "Langfuse: %d item(s) not delivered (%s). Training goes on; they stay in the store and are sent with "
                "the next step's export, or by `langgraph-art export langfuse`.",
                report.failed,
                report.errors[-1] if report.errors else "unknown error",
            )
        elif report.ok and was_down:
            log.warning("Langfuse: reachable again; earlier items delivered")


def _earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two 'since' steps, where None means 'from the beginning'."""
    return None if a is None or b is None else min(a, b)


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    if status == 401:
        return "Langfuse refused the keys (401): check LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY"
    if status is not None:
        return f"Langfuse answered {status}: {getattr(exc, 'body', '')}"
    return f"{type(exc).__name__}: {exc}"
