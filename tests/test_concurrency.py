"""Bounded load on loopback: 64 concurrent requests all answered correctly."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = pytest.mark.integration


async def test_64_concurrent_requests_all_answered_correctly(server, tokenizer) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> dict:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"request number {i}"}],
            "max_tokens": 8 + i % 9,
            "logprobs": True,
            "seed": i,
            "n": 1 + i % 2,
        }
        response = await client.post(f"{server.base_url}/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return {"i": i, "body": response.json(), "call": response.headers["x-langgraph-art-call-id"]}

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        results = await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(64))), timeout=120)
    assert len({r["call"] for r in results}) == 64
    for r in results:
        i, body = r["i"], r["body"]
        assert len(body["choices"]) == 1 + i % 2
        for choice in body["choices"]:
            entries = choice["logprobs"]["content"]
            ids = [e["token_id"] for e in entries]
            assert choice["finish_reason"] in ("stop", "length")
            assert len(ids) <= 8 + i % 9 and (choice["finish_reason"] == "stop" or len(ids) == 8 + i % 9)
            assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
        assert body["usage"]["completion_tokens"] == sum(len(c["logprobs"]["content"]) for c in body["choices"])
