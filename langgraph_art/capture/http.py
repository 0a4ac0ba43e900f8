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


class Replicas:
    """Several base URLs of one policy's servers (replicas), taken in turn. A request to the first URL's prefix is
    sent to the next replica's; a replica that refuses the connection is skipped for that request (the next one
    takes it); when all refuse, the last error is raised."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("base_urls needs at least one URL")
        self.urls = [url.rstrip("/") for url in urls]
        self._turn = 0
        self._lock = threading.Lock()

    def order(self) -> list[str]:
        """The replicas for the next request, the one whose turn it is first."""
        with self._lock:
            start, self._turn = self._turn, self._turn + 1
        return [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]

    def retarget(self, request: Any, url: str) -> Any:
        """``request`` (addressed under ``urls[0]``) addressed under ``url`` instead."""
        target = str(request.url)
        if target.startswith(self.urls[0]):
            target = url + target[len(self.urls[0]) :]
        moved = _httpx.URL(target)
        request.url = moved
        request.headers["host"] = moved.netloc.decode("ascii")
        return request


class ReplicaTransport(_httpx.BaseTransport):  # type: ignore[name-defined]
    """A sync transport that spreads requests over ``Replicas``."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self._inner = _httpx.HTTPTransport(limits=openai.DEFAULT_CONNECTION_LIMITS)

    def handle_request(self, request: Any) -> Any:
        error: Exception | None = None
        for url in self.replicas.order():
            try:
                return self._inner.handle_request(self.replicas.retarget(request, url))
            except _httpx.ConnectError as exc:  # this replica is down: the next one takes the request
                error = exc
        assert error is not None
        raise error

    def close(self) -> None:
        self._inner.close()


class AsyncReplicaTransport(_httpx.AsyncBaseTransport):  # type: ignore[name-defined]
    """An async transport that spreads requests over ``Replicas``, with a connection pool per event loop."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self._inner = LoopLocalTransport()

    async def handle_async_request(self, request: Any) -> Any:
        error: Exception | None = None
        for url in self.replicas.order():
            try:
                return await self._inner.handle_async_request(self.replicas.retarget(request, url))
            except _httpx.ConnectError as exc:
                error = exc
        assert error is not None
        raise error

    async def aclose(self) -> None:
        await self._inner.aclose()


def replica_clients(urls: list[str]) -> tuple[Any, Any]:
    """A sync and an async openai client that take ``urls`` in turn (one ``Replicas`` between them)."""
    replicas = Replicas(urls)
    return (
        openai.DefaultHttpxClient(transport=ReplicaTransport(replicas)),
        openai.DefaultAsyncHttpxClient(transport=AsyncReplicaTransport(replicas)),
    )
