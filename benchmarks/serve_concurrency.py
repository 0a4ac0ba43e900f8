"""Throughput of the embedded service at 1, 8, 64 and 256 concurrent requests: dynamic batching against
one-at-a-time serving (the same engine with max_batch_size=1), in the same run, over loopback HTTP.

    OMP_NUM_THREADS=1 python benchmarks/serve_concurrency.py [--model tiny] [--max-tokens 32] [--rounds 2]

Every request asks for exactly --max-tokens tokens (min_tokens is not an OpenAI field, so the EOS of a random
model can end one early: the table counts the tokens actually returned).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx

from langgraph_art.serve.embedded import EmbeddedServer


async def burst(base_url: str, model: str, concurrency: int, max_tokens: int) -> tuple[float, int]:
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"benchmark request {i}"}],
            "max_tokens": max_tokens,
            "logprobs": True,
            "seed": i,
        }
        response = await client.post(f"{base_url}/chat/completions", json=body)
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])

    # at most 32 connections per client: httpcore's pool scans every connection of its pool for each request, so
    # one client with 256 connections measured its own pool (O(n^2) in the burst), not the server
    per_client = 32
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    clients = [httpx.AsyncClient(timeout=600, limits=limits) for _ in range(-(-concurrency // per_client))]
    try:
        await one(clients[0], -1)  # warm the connection and the engine
        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(clients[i % len(clients)], i) for i in range(concurrency)))
        return time.perf_counter() - start, sum(tokens)
    finally:
        for client in clients:
            await client.aclose()


def measure(
    model: str, max_batch_size: int, levels: list[int], max_tokens: int, rounds: int
) -> dict[int, tuple[float, float]]:
    """level -> (median completion tokens/s, mean decode batches per round)."""
    out: dict[int, tuple[float, float]] = {}
    with EmbeddedServer(model, served_name="bench", max_batch_size=max_batch_size) as server:
        for level in levels:
            rates, batches = [], []
            for _ in range(rounds):
                before = server.engine.batches_run
                seconds, tokens = asyncio.run(burst(server.base_url, "bench", level, max_tokens))
                rates.append(tokens / seconds)
                batches.append(server.engine.batches_run - before - 1)  # minus the warm-up request
            out[level] = (statistics.median(rates), statistics.mean(batches))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levels", default="1,8,64,256")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    batched = measure(args.model, 256, levels, args.max_tokens, args.rounds)
    single = measure(args.model, 1, levels, args.max_tokens, args.rounds)
    print(
        f"model={args.model} max_tokens={args.max_tokens} rounds={args.rounds} "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )
    print("| concurrent | batched tok/s | batches per burst | one-at-a-time tok/s | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for level in levels:
        (fast, batches), (slow, _) = batched[level], single[level]
        print(f"| {level} | {fast:.0f} | {batches:.1f} | {slow:.0f} | {fast / slow:.1f}x |")


if __name__ == "__main__":
    main()
