"""Bad input gets a 4xx in OpenAI's error format naming the problem, and the server keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def with_(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


CASES = [
    ("no messages", with_(messages=[]), 400, "messages"),
    ("missing messages", {"model": "tiny"}, 400, "messages"),
    ("unknown role", with_(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("unknown model", with_(model="gpt-9"), 404, "model"),
    ("unknown adapter step", with_(model="weather@99"), 404, "model"),
    ("negative max_tokens", with_(max_tokens=-1), 400, "max_tokens"),
    ("zero max_completion_tokens", with_(max_completion_tokens=0), 400, "max_tokens"),
    ("temperature out of range", with_(temperature=-0.5), 400, "temperature"),
    ("top_p zero", with_(top_p=0), 400, "top_p"),
    ("n too large", with_(n=1000), 400, "n"),
    ("too many top_logprobs", with_(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("top_logprobs without logprobs", with_(top_logprobs=2), 400, "top_logprobs"),
    ("prompt over context", with_(messages=[{"role": "user", "content": "a b " * 3000}]), 400, "messages"),
    ("max_tokens over context", with_(max_tokens=5000), 400, "max_tokens"),
    ("tool without function", with_(tools=[{"type": "function"}]), 400, "tools[0].function"),
    (
        "tool with bad name",
        with_(tools=[{"type": "function", "function": {"name": "no spaces!"}}]),
        400,
        "tools[0].function.name",
    ),
    (
        "tool schema not object",
        with_(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
        400,
        "tools[0].function.parameters",
    ),
    (
        "tool_choice names a missing tool",
        with_(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        400,
        "tool_choice",
    ),
    (
        "tool_calls on a user message",
        with_(messages=[{"role": "user", "content": "a", "tool_calls": [{"function": {"name": "f"}}]}]),
        400,
        "messages[0].tool_calls",
    ),
    (
        "tool message without content",
        with_(messages=[{"role": "tool", "tool_call_id": "x"}]),
        400,
        "messages[0].content",
    ),
    (
        "image content",
        with_(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "messages[0].content[0]",
    ),
    ("penalty", with_(presence_penalty=1.0), 400, "presence_penalty"),
    ("unknown response_format", with_(response_format={"type": "regex"}), 400, "response_format"),
    (
        "json_schema without a schema",
        with_(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format",
    ),
    (
        "schema that cannot be enforced",
        with_(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
        400,
        "response_format",
    ),
    (
        "forced tool with a dangling $ref",
        with_(
            tools=[TOOL, {**TOOL, "function": {"name": "g", "parameters": {"$ref": "#/nope", "type": "object"}}}],
            tool_choice="required",
        ),
        400,
        "tools[1].function.parameters",
    ),
    ("required without tools", with_(tool_choice="required"), 400, "tool_choice"),
    (
        "ignore_eos with structured output",
        with_(response_format={"type": "json_object"}, ignore_eos=True),
        400,
        "ignore_eos",
    ),
]


@pytest.mark.parametrize(("name", "body", "status", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_names_the_problem(server, name: str, body: dict, status: int, param: str) -> None:
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"] == "invalid_request_error"
    assert httpx.post(f"{server.base_url}/chat/completions", json=GOOD, timeout=30).status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'{"model": "tiny", "messages": "hi"}'])
def test_malformed_bodies_are_400(server, raw: bytes) -> None:
    response = httpx.post(
        f"{server.base_url}/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert "error" in response.json()


def test_api_key_is_required_when_set(tiny_path) -> None:
    from langgraph_art.serve.embedded import EmbeddedServer

    with EmbeddedServer(str(tiny_path), served_name="tiny", api_key="s3cret") as keyed:
        url = f"{keyed.base_url}/chat/completions"
        denied = httpx.post(url, json=GOOD)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        allowed = httpx.post(url, json=GOOD, headers={"authorization": "Bearer s3cret"})
        assert allowed.status_code == 200
        assert httpx.get(keyed.base_url.removesuffix("/v1") + "/health").status_code == 200


class SlowEngine:
    """Wraps a real engine and holds ``start`` until released, to observe the loading state."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.release = inner, asyncio.Event()
        self.base_model, self.max_model_len = inner.base_model, 0

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    async def start(self) -> None:
        await self.release.wait()
        await self.inner.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def health_until(client: httpx.AsyncClient, status: str, seconds: float = 60.0) -> dict[str, Any]:
    """``/health``'s answer once it says ``status`` (polled; the deadline only bounds a hang)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (health := (await client.get("/health")).json())["status"] != status:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"/health never said {status!r} in {seconds:.0f} s; it says {health}")
        await asyncio.sleep(0.05)
    return health


async def test_503_while_loading_then_serves(tiny_path) -> None:
    from langgraph_art.serve.app import create_app
    from langgraph_art.serve.engines.hf.engine import HFEngine

    engine = SlowEngine(HFEngine(str(tiny_path), served_name="tiny"))
    app = create_app(engine)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        loading = await c.post("/v1/chat/completions", json=GOOD)
        assert loading.status_code == 503 and loading.headers["retry-after"]
        assert (await c.get("/health")).json() == {"status": "loading"}
        engine.release.set()
        assert (await health_until(c, "ok"))["model"] == "tiny"
        assert (await c.post("/v1/chat/completions", json=GOOD)).status_code == 200


async def test_load_failure_is_reported_not_hung(tmp_path) -> None:
    from langgraph_art.serve.app import create_app
    from langgraph_art.serve.engines.hf.engine import HFEngine

    app = create_app(HFEngine(str(tmp_path / "missing" / "model")))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        assert "does not exist" in (await health_until(c, "error"))["error"]
        response = await c.post("/v1/chat/completions", json=GOOD)
        assert response.status_code == 503 and "failed to load" in response.json()["error"]["message"]
