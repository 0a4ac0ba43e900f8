"""``run_sync``: how every sync entry point (``Trainer.train``, ``gather_groups``, ``score_groups``...) runs its async
implementation, whether or not an event loop is already running in the caller's thread.

The coroutine runs on one private event loop that lives, in its own daemon thread, as long as the process:

- Called repeatedly from plain sync code, every call uses the same loop. Async clients created during one call
  (a judge's ``ChatOpenAI``, whose httpx client langchain-openai caches per base URL; a Langfuse client) stay usable
  in the next; ``asyncio.run`` per call would close the loop under them (``RuntimeError: Event loop is closed``).
- Called inside a running loop (Jupyter, an async web handler), the caller's thread waits for the private loop
  instead of nesting loops. (In async code, prefer the ``a``-prefixed twin: it does not block your loop.)
- The caller's context variables travel with the coroutine (LangChain's tracing and callback context).
- A call made from the private loop's own thread (a sync reward function calling ``score_groups``) runs on a
  one-off loop in a helper thread instead of deadlocking.
- Ctrl-C (or any exception raised while waiting) cancels the coroutine, waits briefly for it to unwind, and
  re-raises.
- The loop's default executor has ``NODE_THREADS`` threads (made as needed), not asyncio's ``cpu_count + 4``:
  LangGraph runs a graph's sync nodes there (``run_in_executor(None, ...)``), and each run in a model call holds
  one thread. With 2 cores, 32 concurrent runs of a one-node sync graph took 1.06-1.34 s a round against
  0.41-0.58 s for the same graph with an async node: six of them sampled at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_CANCEL_WAIT_S = 5.0
NODE_THREADS = 256


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=NODE_THREADS, thread_name_prefix="langgraph-art-node")
        )
        self.thread = threading.Thread(target=self._run, name="langgraph-art-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


class _Private:
    """Holds the process's private loop; created on first use and again after ``fork`` (threads do not survive)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: _LoopThread | None = None

    def get(self) -> _LoopThread:
        with self._lock:
            if self._current is None or self._current.pid != os.getpid() or not self._current.thread.is_alive():
                self._current = _LoopThread()
            return self._current


_private = _Private()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result (or raise its exception); see the module docstring."""
    runner = _private.get()
    if threading.current_thread() is runner.thread:
        return _run_in_helper_thread(coro)
    # the future exists before the coroutine is handed over: a Ctrl-C that lands while the hand-over is under way
    # (writing to the loop's wake-up pipe lets other threads run) still cancels it. asyncio's
    # run_coroutine_threadsafe returns its future only afterwards, and such a Ctrl-C left the coroutine running.
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    ended = threading.Event()
    try:
        runner.loop.call_soon_threadsafe(_start, coro, future, ended)  # the handle carries this thread's context
        return future.result()
    except BaseException:
        if future.cancel():  # not finished yet: the task is cancelled on the loop, or never starts
            ended.wait(_CANCEL_WAIT_S)
        raise


def _start(coro: Coroutine[Any, Any, T], future: concurrent.futures.Future[T], ended: threading.Event) -> None:
    """On the private loop: run ``coro`` as a task whose outcome settles ``future``, cancelled with it."""
    if future.cancelled():  # cancelled before the loop got here
        coro.close()
        ended.set()
        return
    task = asyncio.get_running_loop().create_task(coro)  # in the context the caller's handle copied
    task.add_done_callback(lambda done: _settle(future, done, ended))
    future.add_done_callback(lambda f: f.cancelled() and task.get_loop().call_soon_threadsafe(task.cancel))


def _settle(future: concurrent.futures.Future[T], task: asyncio.Task[T], ended: threading.Event) -> None:
    try:
        if task.cancelled():
            future.cancel()
        elif future.set_running_or_notify_cancel():  # False: the caller cancelled it meanwhile
            error = task.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(task.result())
    finally:
        ended.set()


def _run_in_helper_thread(coro: Coroutine[Any, Any, T]) -> T:
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="langgraph-art-nested") as pool:
        return pool.submit(contextvars.copy_context().run, asyncio.run, coro).result()


def private_loop() -> asyncio.AbstractEventLoop:
    """The loop ``run_sync`` uses (for tests and for objects that must live on it)."""
    return _private.get().loop
