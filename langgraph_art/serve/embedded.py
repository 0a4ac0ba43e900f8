"""Serve the app from the user's own process: uvicorn on a free loopback port in a background thread."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_art.errors import EngineNotReadyError

if TYPE_CHECKING:
    from fastapi import FastAPI

T = TypeVar("T")
_heap_holders: set[int] = set()  # running servers that keep the GC heap frozen (the heap is the process's)
_heap_lock = threading.Lock()


def hold_frozen_heap(holder: object) -> None:
    """Collect, then freeze every object alive now (``gc.freeze``): the ~500k objects of the loaded libraries and
    model leave the collector's view. A full collection of them took ~270 ms, every few rollout rounds of 16 runs
    on tiny-5m (``benchmarks/rollout_efficiency.py``). vLLM freezes its heap after start-up for the same reason."""
    with _heap_lock:
        _heap_holders.add(id(holder))
        gc.collect()
        gc.freeze()


def release_frozen_heap(holder: object) -> None:
    """Give the frozen objects back to the collector (what was freezed and died since can be collected); freeze
    again what is still alive if other servers still hold the heap."""
    with _heap_lock:
        if id(holder) not in _heap_holders:
            return
        _heap_holders.discard(id(holder))
        gc.unfreeze()
        gc.collect()
        if _heap_holders:
            gc.freeze()


class EmbeddedServer:
    """``with EmbeddedServer("tiny") as server: ChatOpenAI(base_url=server.base_url, ...)``.

    ``start()`` returns once the engine has loaded (or raises its load error); ``stop()`` shuts uvicorn down,
    closes the engine and joins the thread.
    """

    def __init__(
        self,
        model: str | Any = "tiny",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        adapter_roots: Any = None,
        engine: str = "hf",
        freeze_gc: bool = True,
        app: FastAPI | None = None,
        tool_call_parser: str = "auto",
        reasoning_parser: str | None = "auto",
        **engine_kwargs: Any,
    ) -> None:
        """``model``: a model (name, folder, hub id) for a new ``engine`` (``"hf"`` or ``"vllm"``, built with
        ``engine_kwargs``), or an engine object. ``adapter_roots``: folders ``POST /v1/adapters`` may load from
        (None: any; see ``create_app``). ``freeze_gc``: once loaded, move the objects alive then out of the garbage
        collector's view until ``stop()`` (``hold_frozen_heap``). ``app``: serve this app (``create_app``'s, with
        whatever routes it was given, e.g. a service's from ``backends.service.build_service``) instead of building
        one; ``model``, ``api_key``, ``adapter_roots`` and the parsers are then the app's business.
        ``tool_call_parser``/``reasoning_parser``: see ``create_app``."""
        from langgraph_art.serve.app import create_app

        if app is not None:
            self.engine = app.state.engine
            self.app = app
        else:
            if isinstance(model, str | os.PathLike):
                from langgraph_art.serve.engines.choose import build_engine

                model = build_engine(engine, model, **engine_kwargs)
            self.engine = model
            self.app = create_app(self.engine, api_key=api_key, adapter_roots=adapter_roots,
                                  tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)  # fmt: skip
        self.api_key = api_key
        self._host, self._port = host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: dict[str, Any] | None = None
        self._freeze_gc = freeze_gc

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}/v1"

    def start(self, timeout: float = 300.0) -> EmbeddedServer:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit TCP_NODELAY; without it small responses wait ~40 ms for a delayed ACK
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve(sock)),
            name="langgraph-art-embedded-server",
            daemon=True,
        )
        self._thread.start()
        self._wait_ready(timeout)
        if self._freeze_gc:
            hold_frozen_heap(self)
        return self

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[sock])

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600.0) -> T:
        """Run ``coro`` on the server's own event loop (where the engine is used) and wait for its result."""
        if self._loop is None or self._thread is None:
            coro.close()
            raise EngineNotReadyError("the embedded server is not running: call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def in_process_clients(self) -> dict[str, Any]:
        """``http_client`` and ``http_async_client`` for openai/langchain-openai clients in this process: requests
        go straight to the app on the server's loop (``InProcessTransport``), not through loopback sockets; and
        ``in_process``, which answers ChatART's non-streaming completions without the app
        (``InProcessCompletions``)."""
        if self._loop is None or self._thread is None:
            raise EngineNotReadyError("the embedded server is not running: call start() first")
        if self._clients is None:
            import openai

            from langgraph_art.serve.inprocess import InProcessCompletions, InProcessTransport

            transport = InProcessTransport(self.app, self._loop, self._thread)
            self._clients = {
                "http_client": openai.DefaultHttpxClient(transport=transport),
                "http_async_client": openai.DefaultAsyncHttpxClient(transport=transport),
                "in_process": InProcessCompletions(self.app.state.chat_completions, self._loop, self._thread),
            }
        return self._clients

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._thread is not None and not self._thread.is_alive():
                raise EngineNotReadyError("the embedded server thread exited during start-up; see the log")
            try:
                response = httpx.get(f"http://{self._host}:{self._port}/health", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            body = response.json()
            if response.status_code == 200:
                return
            if body.get("status") == "error":
                self.stop()
                raise EngineNotReadyError(f"the engine failed to load: {body.get('error')}")
            time.sleep(0.05)
        self.stop()
        raise EngineNotReadyError(f"the embedded server was not ready within {timeout:.0f} s")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        release_frozen_heap(self)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded_server(model: str | Any = "tiny", **kwargs: Any) -> EmbeddedServer:
    """Start the inference service in this process on a free loopback port; ``.base_url`` to talk to it."""
    return EmbeddedServer(model, **kwargs).start()
