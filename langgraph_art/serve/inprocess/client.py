"""The client side of ChatART's shortcut to a server in its own process: non-streaming completions skip the openai SDK.

``InProcessCompletions.wrap`` (``completions.py``) puts a ``DirectCompletions`` in place of ChatART's SDK resources.
``DirectCompletions`` stands in
for the SDK's ``chat.completions`` resource (ChatOpenAI's ``client`` and ``async_client``): langchain-openai's
``with_raw_response.create(**payload)`` of a non-streaming request without extra headers or query goes to the
endpoint, and the response body comes back as a dict from ``parse()`` (langchain-openai's
``_create_chat_result`` takes dicts). Everything else goes through the SDK unchanged: streams, ``parse``
(structured output), and every request the endpoint would answer with an error, so errors, their exception
classes and the SDK's retries are HTTP's. A timeout raises ``openai.APITimeoutError`` without retrying.

Why: 16 agent runs of one 32-token call each spent about a third of the client's CPU in the SDK (building the
request, transforming the params, parsing the JSON into models that langchain-openai dumps back to a dict), and
the app around the endpoint cost as much again, all of it holding the GIL the engine's decode loop needs
(``benchmarks/rollout_efficiency.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import openai

from langgraph_art.capture.http import openai_httpx

_httpx = openai_httpx()
_REQUEST_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
Answer = tuple[dict[str, Any], dict[str, str]]  # response body, headers
_SDK_ONLY: ContextVar[bool] = ContextVar("langgraph_art_sdk_only", default=False)


@contextmanager
def through_sdk() -> Iterator[None]:
    """Calls made inside go through the SDK only: for a request the endpoint has just refused (asking it again
    would repeat the work, a failed generation included)."""
    token = _SDK_ONLY.set(True)
    try:
        yield
    finally:
        _SDK_ONLY.reset(token)


class InProcessEndpoint(Protocol):
    """What ``InProcessCompletions`` offers the wrapped resource: an answer, or None for "ask over HTTP"."""

    async def acreate(self, body: str, timeout: float | None) -> Answer | None: ...

    def create(self, body: str, timeout: float | None) -> Answer | None: ...


def request_body(payload: dict[str, Any]) -> str | None:
    """The JSON body the SDK would send for ``create(**payload)``; None when the shortcut does not apply."""
    if _SDK_ONLY.get() or payload.get("stream") or payload.get("extra_headers") or payload.get("extra_query"):
        return None
    body = {k: v for k, v in payload.items() if k not in _REQUEST_OPTIONS and not _unset(v)}
    extra = payload.get("extra_body")
    if extra is not None and not _unset(extra):
        if not isinstance(extra, dict):
            return None
        body.update(extra)
    try:
        return json.dumps(body)
    except (TypeError, ValueError):  # something only the SDK's transforms turn into JSON
        return None


class InProcessResponse:
    """What ``with_raw_response.create`` returns for an answer of the process's own server."""

    def __init__(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        self._body = body
        self.headers = _httpx.Headers({"content-type": "application/json", **headers})

    def parse(self) -> dict[str, Any]:
        return self._body


class DirectCompletions:
    """The SDK's ``chat.completions`` resource (sync or async, like ``sdk``) with ``with_raw_response.create``
    answered by ``endpoint`` where it can be; any other attribute is the SDK's."""

    def __init__(self, sdk: Any, endpoint: InProcessEndpoint) -> None:
        self.sdk, self.endpoint = sdk, endpoint
        raw = _AsyncRaw if isinstance(sdk, openai.resources.chat.AsyncCompletions) else _SyncRaw
        self.with_raw_response = raw(sdk, endpoint)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sdk, name)


class _Raw:
    def __init__(self, sdk: Any, endpoint: InProcessEndpoint) -> None:
        self.sdk, self.endpoint = sdk, endpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sdk.with_raw_response, name)

    def _timeout(self, payload: dict[str, Any]) -> float | None:
        """The read timeout the SDK would apply: the call's ``timeout``, else the client's."""
        value = payload.get("timeout", openai.NOT_GIVEN)
        if _unset(value):
            value = self.sdk._client.timeout
        if value is None or isinstance(value, int | float):
            return None if value is None else float(value)
        read = getattr(value, "read", None)  # an httpx.Timeout
        return float(read) if read is not None else None

    def _timed_out(self, timeout: float | None) -> openai.APITimeoutError:
        url = f"{str(self.sdk._client.base_url).rstrip('/')}/chat/completions"
        error = openai.APITimeoutError(request=_httpx.Request("POST", url))
        error.add_note(f"the embedded server did not answer within {timeout} s")
        return error


class _AsyncRaw(_Raw):
    async def create(self, **payload: Any) -> Any:
        return await self.answer(payload) or await self.sdk.with_raw_response.create(**payload)

    async def answer(self, payload: dict[str, Any]) -> InProcessResponse | None:
        """The endpoint's answer, or None when the request must go through the SDK."""
        body = request_body(payload)
        if body is None:
            return None
        timeout = self._timeout(payload)
        try:
            answer = await self.endpoint.acreate(body, timeout)
        except TimeoutError:
            raise self._timed_out(timeout) from None
        except ConnectionError:  # the server stopped: the SDK says so its own way
            return None
        return InProcessResponse(*answer) if answer is not None else None


class _SyncRaw(_Raw):
    def create(self, **payload: Any) -> Any:
        body = request_body(payload)
        if body is not None:
            timeout = self._timeout(payload)
            try:
                answer = self.endpoint.create(body, timeout)
            except TimeoutError:
                raise self._timed_out(timeout) from None
            except ConnectionError:
                answer = None
            if answer is not None:
                return InProcessResponse(*answer)
        return self.sdk.with_raw_response.create(**payload)


def _unset(value: Any) -> bool:
    return isinstance(value, openai.NotGiven | openai.Omit)
