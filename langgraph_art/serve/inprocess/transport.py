"""``InProcessTransport``: an httpx transport (sync and async, of the httpx flavour the openai SDK uses) that runs a
request through the embedded server's ASGI app on the server's event loop and streams the response back as the app
sends it, so the SDK, status codes, errors, headers and server-sent events are exactly those of HTTP, without
sockets or HTTP parsing. Over loopback HTTP, a 32-token call spent more CPU in the client's connection pool, h11 and
uvicorn than in the app (``py-spy --gil`` on 16 concurrent agent runs; ``benchmarks/rollout_efficiency.py``), all of
it holding the GIL the engine's decode loop needs.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from langgraph_art.capture.http import openai_httpx

_httpx = openai_httpx()
_DONE = object()  # the end of a response body


class InProcessTransport(_httpx.AsyncBaseTransport, _httpx.BaseTransport):  # type: ignore[name-defined]
    """Run requests through ``app`` on ``loop`` (the embedded server's event loop, in another thread)."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.app, self.loop, self.thread = app, loop, thread

    async def handle_async_request(self, request: Any) -> Any:
        caller = asyncio.get_running_loop()
        chunks: asyncio.Queue[Any] = asyncio.Queue()
        content = await request.aread()

        def deliver(message: Any) -> None:
            try:
                caller.call_soon_threadsafe(chunks.put_nowait, message)
            except RuntimeError as exc:  # asyncio.run closed the caller's loop before the response's close got here
                raise _CallerGone from exc

        exchange = _Exchange(self.app, self.loop, request, content, deliver)
        self._start(exchange)
        wait = _read_timeout(request)

        async def take() -> Any:
            try:
                return await asyncio.wait_for(chunks.get(), wait)
            except TimeoutError:
                raise _timed_out(exchange, request, wait) from None

        status, headers = await take()

        async def body() -> AsyncIterator[bytes]:
            try:
                while (chunk := await take()) is not _DONE:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    yield chunk
            finally:
                exchange.disconnect()

        return _httpx.Response(status, headers=headers, stream=_AsyncBody(body()), request=request)

    def handle_request(self, request: Any) -> Any:
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking call to the embedded server from its own event loop would wait forever")
        chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        exchange = _Exchange(self.app, self.loop, request, request.read(), chunks.put)
        self._start(exchange)
        wait = _read_timeout(request)

        def take() -> Any:
            try:
                return chunks.get(timeout=wait)
            except queue.Empty:
                raise _timed_out(exchange, request, wait) from None

        status, headers = take()

        def body() -> Iterator[bytes]:
            try:
                while (chunk := take()) is not _DONE:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    yield chunk
            finally:
                exchange.disconnect()

        return _httpx.Response(status, headers=headers, stream=_SyncBody(body()), request=request)

    def _start(self, exchange: _Exchange) -> None:
        if self.loop.is_closed() or not self.thread.is_alive():
            raise _httpx.ConnectError("the embedded server has stopped")
        asyncio.run_coroutine_threadsafe(exchange.run(), self.loop)


class _CallerGone(Exception):
    """The caller can take no more of the response (its event loop has closed)."""


class _Exchange:
    """One request/response through the ASGI app; ``deliver`` gets (status, headers), then body chunks, then
    ``_DONE`` (or an exception), from the server's loop."""

    def __init__(
        self, app: Any, loop: asyncio.AbstractEventLoop, request: Any, body: bytes, deliver: Callable[[Any], Any]
    ) -> None:
        self.app, self.loop, self.request, self.body, self.deliver = app, loop, request, body, deliver
        self.started = self.finished = False
        self.gone = asyncio.Event()  # set when the caller closes the response (bound to the server's loop on use)

    async def run(self) -> None:
        url = self.request.url
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": self.request.method,
            "headers": [(k.lower(), v) for k, v in self.request.headers.raw],
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "server": (url.host, url.port),
            "client": ("127.0.0.1", 0),
            "root_path": "",
        }
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            await self.gone.wait()  # Starlette listens for the client going away while it streams
            return {"type": "http.disconnect"}

        def pass_on(item: Any) -> None:
            if self.gone.is_set():
                return  # the caller left: what the app still sends goes nowhere (uvicorn does the same)
            try:
                self.deliver(item)
            except _CallerGone:
                self.gone.set()  # the app hears the client left, and a streaming app stops

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.started = True
                pass_on((message["status"], message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    pass_on(message["body"])
                if not message.get("more_body", False):
                    self.finished = True
                    pass_on(_DONE)

        try:
            await self.app(scope, receive, send)
        except BaseException as exc:  # handed to the caller (a cancel at shutdown too), not swallowed
            if not self.started:
                pass_on((500, [(b"content-type", b"text/plain")]))
                pass_on(f"the embedded server failed this request: {exc!r}".encode())
                pass_on(_DONE)
            elif not self.finished:
                pass_on(_httpx.RemoteProtocolError(f"the embedded server failed this request: {exc!r}"))
            if not isinstance(exc, Exception):
                raise

    def disconnect(self) -> None:
        """The caller closed the response: tell a streaming app (from its own loop)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.gone.set)


def _timed_out(exchange: _Exchange, request: Any, wait: float | None) -> Exception:
    """Give up on ``exchange`` (the app hears the client left) and say so as httpx does."""
    exchange.disconnect()
    return _httpx.ReadTimeout(f"no answer from the embedded server within {wait} s", request=request)


def _read_timeout(request: Any) -> float | None:
    """httpx's read timeout of the request (a custom transport enforces its own timeouts)."""
    timeout = request.extensions.get("timeout") or {}
    value = timeout.get("read")
    return float(value) if value is not None else None


class _AsyncBody(_httpx.AsyncByteStream):  # type: ignore[name-defined]
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        await self.chunks.aclose()  # type: ignore[attr-defined]


class _SyncBody(_httpx.SyncByteStream):  # type: ignore[name-defined]
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks

    def close(self) -> None:
        self.chunks.close()  # type: ignore[attr-defined]
