"""Rollout efficiency: sampled tokens per second through the whole stack against the engine alone, same run.

    OMP_NUM_THREADS=1 python benchmarks/rollout_efficiency.py [--model tiny-5m] [--runs 16,64] [--calls 1,3]

Whole stack: ``gather_groups`` runs a LangGraph graph ``runs`` times (one scenario), each run a node that calls
``ChatART`` ``calls`` times in a row (each call sees the conversation so far), through the openai SDK and the
embedded server's app of a ``LocalBackend`` (in process: ``serve/inprocess/``) into its ``HFEngine``, with the
trajectories captured and stored. Engine alone: the same
engine object, the same number of requests (``calls`` rounds of ``runs`` requests that arrive together, each
round's prompts rendered by the chat template over the conversation so far, as the server renders the stack's),
no HTTP, no graph, no capture; only its sampling is timed. Both sample
exactly ``--max-tokens`` tokens per call at temperature 1 (``ignore_eos``). Efficiency = stack tok/s / engine
tok/s: the median of ``--rounds`` ratios of rounds run back to back (this machine's speed drifts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art
from langgraph_art.capture.rollout import agather_groups
from langgraph_art.serve.chat import render_prompt
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
from langgraph_art.sync import run_sync

PROMPT = "Count the letters in the word strawberry, then say the number."


def build_graph(llm: Any, calls: int) -> Any:
    """One node calling the model ``calls`` times, each time on the conversation so far (an agent's loop)."""

    async def think(state: MessagesState) -> dict:
        messages = list(state["messages"])
        new: list[Any] = []
        for i in range(calls):
            reply = await llm.ainvoke(messages)
            new.append(reply)
            messages.append(reply)
            if i < calls - 1:
                follow = HumanMessage(f"Step {i + 2}: go on.")
                new.append(follow)
                messages.append(follow)
        return {"messages": new}

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_edge(START, "think")
    return graph.compile()


async def stack_round(graph: Any, model: Any, store: Any, runs: int) -> tuple[float, int]:
    scenario = {"id": "s", "input": {"messages": [("user", PROMPT)]}}
    start = time.perf_counter()
    groups = await agather_groups(
        graph, [scenario], runs, max_concurrency=runs, recorders=[model.recorder], store=store, progress=False
    )
    seconds = time.perf_counter() - start
    failed = sum(len(g.failed) for g in groups)
    if failed:
        raise RuntimeError(f"{failed} runs failed: {groups[0].failed[0].error}")
    tokens = sum(len(turn.token_ids) for g in groups for t in g.trajectories for turn in t.turns())
    return seconds, tokens


async def engine_round(engine: Any, adapter: str | None, runs: int, calls: int, max_tokens: int) -> tuple[float, int]:
    """``calls`` rounds of ``runs`` requests arriving together. Each round's prompts are rendered as the server
    renders the stack's (the chat template over the conversation so far: the previous answers as text, then the
    graph's follow-up message), so both sides sample from prompts of the same length; only the sampling is timed."""
    tokenizer = engine.tokenizer
    conversations = [[{"role": "user", "content": PROMPT}] for _ in range(runs)]
    tokens, seconds = 0, 0.0
    for i in range(calls):
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
        requests = [
            GenerationRequest(prompt_token_ids=render_prompt(tokenizer, c, None), params=params, adapter=adapter)
            for c in conversations
        ]
        start = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        seconds += time.perf_counter() - start
        for conversation, result in zip(conversations, results, strict=True):
            conversation.append({"role": "assistant", "content": result.samples[0].text})
            conversation.append({"role": "user", "content": f"Step {i + 2}: go on."})
            tokens += len(result.samples[0].token_ids)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-5m")
    parser.add_argument("--runs", default="16,64")
    parser.add_argument("--calls", default="1,3")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home, max_batch_size=256) as backend:
        model = art.TrainableModel(name="bench", project="bench", base_model=args.model)
        model.register(backend)
        server = backend.server(args.model)
        store = backend.store(model)
        llm = art.ChatART(  # type: ignore[call-arg]
            model=model,  # type: ignore[arg-type]
            temperature=1.0,
            max_tokens=args.max_tokens,
            extra_body={"ignore_eos": True},
        )
        adapter = None  # a fresh model serves the base weights until its first checkpoint
        for runs in [int(x) for x in args.runs.split(",")]:
            for calls in [int(x) for x in args.calls.split(",")]:
                graph = build_graph(llm, calls)
                run_sync(stack_round(graph, model, store, runs))  # warm-up
                server.run(engine_round(server.engine, adapter, runs, calls, args.max_tokens))
                stack, engine = [], []
                for _ in range(args.rounds):
                    s, n = run_sync(stack_round(graph, model, store, runs))
                    stack.append(n / s)
                    s, n = server.run(engine_round(server.engine, adapter, runs, calls, args.max_tokens))
                    engine.append(n / s)
                ratios = [a / b for a, b in zip(stack, engine, strict=True)]
                rows.append(
                    (runs, calls, statistics.median(engine), statistics.median(stack), statistics.median(ratios))
                )
                print(f"runs={runs} calls={calls}: engine {rows[-1][2]:.0f} tok/s, stack {rows[-1][3]:.0f}", flush=True)
    print(f"\nmodel={args.model} max_tokens={args.max_tokens} rounds={args.rounds} OMP_NUM_THREADS=1")
    print("| runs | calls per run | engine alone tok/s | whole stack tok/s | efficiency |")
    print("|---:|---:|---:|---:|---:|")
    for runs, calls, engine_rate, stack_rate, ratio in rows:
        print(f"| {runs} | {calls} | {engine_rate:.0f} | {stack_rate:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
