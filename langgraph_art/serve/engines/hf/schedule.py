"""``WorkQueue``: what ``HFEngine``'s worker thread does next, in arrival order, from requests and commands that
the callers' event loops put in.

- A batch is the oldest request plus the queued requests for the same adapter behind it (up to
  ``max_batch_size`` rows); a command is a barrier: nothing queued behind it joins an earlier batch.
- While a batch decodes, requests for its adapter at the head of the queue join it between steps
  (``take_joiners``); a command or another adapter's request at the head stops that, so nothing waits behind a
  stream of joiners. Commands marked ``between_steps`` (a new adapter to add) run between two steps instead of
  waiting for the batch to drain (``take_between_steps``), still in order.
- An idle worker waits for a burst of arrivals to end before it starts a batch (``batch_wait``, see
  ``_gather_burst``).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langgraph_art.serve.engines.hf.batch import Job


@dataclass
class Command:
    run: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    between_steps: bool = False  # may run between two steps of a running batch (else: once the batch is done)


class WorkQueue:
    """Requests (``Job``) and ``Command``s in arrival order; thread-safe."""

    def __init__(self, max_batch_size: int, batch_wait: float) -> None:
        self.max_batch_size, self.batch_wait = max_batch_size, batch_wait
        self.last_batch_rows = 0  # the most rows the last batch ran at once (the worker sets it)
        self._items: collections.deque[Job | Command] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False

    def put(self, item: Job | Command) -> None:
        with self._cv:
            self._items.append(item)
            self._cv.notify()

    def close(self) -> list[Job | Command]:
        """Stop the worker's wait; the items nobody will run, for the caller to fail."""
        with self._cv:
            self._closed = True
            pending = list(self._items)
            self._items.clear()
            self._cv.notify_all()
        return pending

    def next_work(self) -> Command | list[Job] | None:
        """Wait for the next command or batch (None once closed)."""
        with self._cv:
            while not self._items and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            self._gather_burst()
            return self._take_batch()

    def take_between_steps(self) -> list[Command]:
        """The commands at the head of the queue that may run while a batch is running."""
        commands: list[Command] = []
        with self._cv:
            while self._items and isinstance(self._items[0], Command) and self._items[0].between_steps:
                commands.append(self._items.popleft())  # type: ignore[arg-type]
        return commands

    def take_joiners(self, adapter: str | None, rows: int) -> list[Job]:
        """The queued requests that may join a running batch of ``rows`` rows for ``adapter``: those at the head
        of the queue, in order, while they are for the same adapter and fit."""
        joiners: list[Job] = []
        with self._cv:
            while self._items:
                head = self._items[0]
                if isinstance(head, Command) or head.request.adapter != adapter:
                    break
                if not head.cancelled and rows + head.request.params.n > self.max_batch_size:
                    break
                self._items.popleft()
                if not head.cancelled:
                    joiners.append(head)
                    rows += head.request.params.n
        return joiners

    def _gather_burst(self) -> None:
        """Called with the lock held, the worker idle and a request queued: wait while requests keep arriving
        (each within ``batch_wait`` of the last, for at most 10 x ``batch_wait``), so a burst starts as one batch.
        Agent runs whose calls end together send their next calls one after another (each run's Python between
        them holds the GIL); started at the first, the batch prefilled it alone and the rest joined a step later:
        one more prefill per turn, and that row stayed a step ahead of the others for the rest of the run. Only
        after a batch of several rows, or with several requests queued: a lone client calling in turn pays nothing."""
        if self.batch_wait <= 0 or (len(self._items) == 1 and self.last_batch_rows <= 1):
            return  # a lone request after lone requests (one client calling in turn) never waits
        deadline = time.monotonic() + 10 * self.batch_wait
        quiet_until = time.monotonic() + self.batch_wait
        queued = len(self._items)
        while not self._closed and queued < self.max_batch_size and not isinstance(self._items[-1], Command):
            now = time.monotonic()
            if now >= min(quiet_until, deadline):
                return
            self._cv.wait(min(quiet_until, deadline) - now)
            if len(self._items) != queued:  # another arrival: wait for a quiet gap again
                queued, quiet_until = len(self._items), time.monotonic() + self.batch_wait

    def _take_batch(self) -> Command | list[Job]:
        """Called with the lock held: the next command, or the oldest job plus same-adapter jobs behind it."""
        head = self._items[0]
        if isinstance(head, Command):
            self._items.popleft()
            return head
        batch: list[Job] = []
        rows = 0
        kept: collections.deque[Job | Command] = collections.deque()
        while self._items:
            item = self._items.popleft()
            if isinstance(item, Command):  # a barrier: nothing behind it joins this batch
                kept.append(item)
                kept.extend(self._items)
                self._items.clear()
                break
            fits = rows + item.request.params.n <= self.max_batch_size or not batch
            if item.request.adapter == head.request.adapter and fits and not item.cancelled:
                batch.append(item)
                rows += item.request.params.n
            elif not item.cancelled:
                kept.append(item)
        self._items.extendleft(reversed(kept))
        return batch


def run_command(command: Command) -> None:
    """Run a command on the worker; its result or error goes to the awaiting caller's loop."""
    try:
        result = command.run()
        command.loop.call_soon_threadsafe(set_result, command.future, result)
    except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller, not swallowed
        command.loop.call_soon_threadsafe(set_exception, command.future, exc)


def set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
