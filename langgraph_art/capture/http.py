"""An async HTTP client for ``ChatART`` that is safe to use from any event loop, one after another or at once.

langchain-openai gives every ``ChatOpenAI`` with the same base URL one cached ``httpx.AsyncClient``. Its pooled
connections belong to the event loop that opened them, so the second ``asyncio.run(llm.ainvoke(...))`` (or a
training step after a notebook cell's ``await``) reuses a connection of a closed loop and fails with
``RuntimeError: Event loop is closed``. Here the client's transport keeps one connection pool per running loop and
drops the pools of loops that have closed.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import weakref
from typing import Any

import openai


def openai_httpx() -> Any:
    """The httpx flavour the installed openai SDK is built on (``httpx2`` for openai>=3, ``httpx`` before)."""
    client = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(client.__module__.split(".")[0])


_httpx = openai_httpx()


class LoopLocalTransport(_httpx.AsyncBaseTransport):  # type: ignore[name-defined]
    """An async transport with one connection pool per event loop (pools of closed loops are dropped)."""

    def __init__(self, **pool_options: Any) -> None:
        self._options = {"limits": openai.DEFAULT_CONNECTION_LIMITS, **pool_options}
        # keyed weakly, but a pool's connections refer to their loop: closed loops are pruned explicitly below
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def pool(self) -> Any:
        """This loop's pool (created on first use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pools.get(loop)
            if pool is None:
                for closed in [other for other in self._pools if other.is_closed()]:
                    del self._pools[closed]  # their sockets close when collected; they can never be used again
                pool = self._pools[loop] = _httpx.AsyncHTTPTransport(**self._options)
            return pool

    @property
    def loops(self) -> int:
        """How many event loops currently hold a pool (for tests and diagnostics)."""
        with self._lock:
            return len(self._pools)

    async def handle_async_request(self, request: Any) -> Any:
        return await self.pool().handle_async_request(request)

    async def aclose(self) -> None:
        """Close this loop's pool (other loops' pools stay usable)."""
        with self._lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()


def loop_safe_async_client() -> Any:
    """An ``openai.DefaultAsyncHttpxClient`` (the SDK's timeouts and redirects) over a ``LoopLocalTransport``."""
    return openai.DefaultAsyncHttpxClient(transport=LoopLocalTransport())
