"""A GRPO group's runs share their first prompt: the engine prefills it once. What that saves, by prompt length.

    OMP_NUM_THREADS=1 python benchmarks/shared_prefill.py [--model tiny-5m] [--repeats 5]

Eight samples of 32 tokens each, in one batch, on the HFEngine: from ONE prompt (what a group of num_generations
runs sends; prefilled once, the other rows copy its KV cache) against EIGHT different prompts of the same length
(nothing to share: what every batch cost before). Times are medians over ``--repeats``, the two cases alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
from langgraph_art.serve.engines.hf.engine import HFEngine

N, NEW_TOKENS = 8, 32


async def timed(engine: HFEngine, prompts: list[list[int]]) -> float:
    params = [SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=i) for i in range(N)]
    started = time.perf_counter()
    await asyncio.gather(*(engine.generate(GenerationRequest(p, s)) for p, s in zip(prompts, params, strict=True)))
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-5m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", default="16,256,1024")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = HFEngine(args.model, max_batch_size=N)
    await engine.start()
    print(f"{args.model}: {N} samples x {NEW_TOKENS} tokens in one batch, median of {args.repeats}")
    print("| prompt tokens | one shared prompt ms | 8 different prompts ms | speed-up | prefills shared |")
    print("|---:|---:|---:|---:|---:|")
    for length in (int(x) for x in args.lengths.split(",")):
        gen = torch.Generator().manual_seed(length)
        distinct = [torch.randint(10, 2000, (length,), generator=gen).tolist() for _ in range(N)]
        shared, different = [], []
        before = engine.prefills_shared
        await timed(engine, [distinct[0]] * N)  # warm-up
        for _ in range(args.repeats):
            shared.append(await timed(engine, [distinct[0]] * N))
            different.append(await timed(engine, distinct))
        one, eight = statistics.median(shared), statistics.median(different)
        saved = (engine.prefills_shared - before) // (args.repeats + 1)
        print(f"| {length} | {one * 1e3:.0f} | {eight * 1e3:.0f} | {eight / one:.2f}x | {saved} of {N} |")
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
