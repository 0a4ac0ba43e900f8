"""``InProcessCompletions``: the endpoint a ``LocalBackend`` gives ``ChatART`` (``ChatART(in_process=...)``) for what an
agent's rollouts mostly send, non-streaming chat completions. ChatART hands it the JSON body; it validates it as the
route does and calls the route's own ``ChatCompletions.complete`` on the server's loop, and the response dict goes
back as it is (no ASGI app, no JSON response, no SDK parsing: those were about half of a call's client CPU).
Whatever the endpoint would answer with an error status is not answered here: ChatART then sends the same request
through the SDK and the app, so errors, their exception classes and the SDK's retries are exactly HTTP's.

The endpoint also hands ChatART its client side (``wrap``, ``through_sdk``; ``client.py``), so ChatART knows this
object's methods and nothing of how they work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from contextlib import AbstractContextManager
from typing import Any

from pydantic import ValidationError

from langgraph_art.serve.inprocess.client import DirectCompletions, through_sdk
from langgraph_art.serve.protocol import ChatCompletionRequest

log = logging.getLogger(__name__)


class InProcessCompletions:
    """``POST /v1/chat/completions`` without streaming, answered by the app's ``ChatCompletions`` directly (see the
    module docstring). ``acreate``/``create`` take the request's JSON body and return (response body, headers),
    or None when the endpoint would answer with an error (the caller sends the request over HTTP to get it as
    HTTP has it); they raise ``TimeoutError`` after ``timeout`` seconds (the request is cancelled) and
    ``ConnectionError`` when the server has stopped. Only the process's own clients get one: the app's API-key
    check does not apply."""

    def __init__(self, completions: Any, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.completions, self.loop, self.thread = completions, loop, thread
        self.answered = 0  # requests answered here (not sent over HTTP)

    def wrap(self, resource: Any) -> Any:
        """The SDK's ``chat.completions`` resource (sync or async) with its non-streaming creates answered here."""
        return resource if getattr(resource, "endpoint", None) is self else DirectCompletions(resource, self)

    def wraps(self, resource: Any) -> bool:
        """Whether ``resource`` is one ``wrap`` made for this endpoint."""
        return getattr(resource, "endpoint", None) is self

    @staticmethod
    def through_sdk() -> AbstractContextManager[None]:
        """Calls made inside skip this endpoint (for a request it has just refused: asking again would repeat it)."""
        return through_sdk()

    async def acreate(self, body: str, timeout: float | None) -> tuple[dict[str, Any], dict[str, str]] | None:
        future = asyncio.wrap_future(self._submit(body))  # cancelling the caller cancels the request
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(f"no answer from the embedded server within {timeout} s") from None

    def create(self, body: str, timeout: float | None) -> tuple[dict[str, Any], dict[str, str]] | None:
        if threading.current_thread() is self.thread:
            raise RuntimeError("a blocking call to the embedded server from its own event loop would wait forever")
        future = self._submit(body)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from the embedded server within {timeout} s") from None

    def _submit(self, body: str) -> concurrent.futures.Future[Any]:
        if self.loop.is_closed() or not self.thread.is_alive():
            raise ConnectionError("the embedded server has stopped")
        return asyncio.run_coroutine_threadsafe(self._answer(body), self.loop)

    async def _answer(self, body: str) -> tuple[dict[str, Any], dict[str, str]] | None:
        try:
            request = ChatCompletionRequest.model_validate_json(body)  # the JSON the route would validate
        except ValidationError:
            return None  # a 400: the HTTP path words it
        try:
            answer = await self.completions.complete(request)
        except Exception as exc:  # noqa: BLE001 - not lost: the caller replays the request over HTTP for it
            log.debug("in-process completion failed (%s: %s); the caller retries over HTTP", type(exc).__name__, exc)
            return None
        self.answered += 1
        return answer
