"""Agent loops at the engine: BFCL ``multi_turn_base`` conversations, 8 runs each, several turns, on HFEngine with its
prefix cache, HFEngine without it and VLLMEngine with its own prefix caching, one after the other in the same run.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/prefix_cache.py [--cases 2] [--runs 8] [--turns 3]
        [--max-tokens 48] [--calls-per-user-turn 0] [--engines hf,hf-no-cache,vllm] [--model smollm2-135m]
        [--dtype float32]

Each run is a tool loop replayed at the engine: its prompt is the case's first user turn with the case's functions
(3k-8k tokens of documentation) rendered by the bundled ``chatml-tools`` template; the model samples up to
``--max-tokens`` at temperature 0.7 (seeded per run and turn); its text goes back as the assistant turn, then a tool
result, and the next turn's prompt is the whole conversation again, as LangGraph's tool loop sends it; with
``--calls-per-user-turn K`` the case's next user turn follows every K-th call (``examples/multi_turn.py``'s shape:
BFCL's cases have 2-5 user turns, the example makes one to ``max_calls`` calls in each). The runs of a
case go concurrently (a GRPO group), the cases one after the other. Reported per engine: wall seconds, prompt tokens
sent, tokens prefilled and their share, the prefix cache's hits, sampled tokens per second. The runs' texts differ a
little between engines (float rounding picks other tokens now and then), so their prompts do too; the token counts
are each engine's own. ``lscpu`` flags go with the table: engines rank differently on other CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

TOOL_RESULT = '{"status": "ok", "result": "done", "entries": ["report.txt", "notes.md", "budget.csv"]}'


def cases(count: int, tokenizer: Any, room: int) -> list[Any]:
    """The first ``count`` cases (by id) whose documentation and first turn leave ``room`` tokens of context."""
    import bfcl_multi_turn as mt

    chosen = []
    for case in mt.load():
        ids = tokenizer.apply_chat_template(list(case.turns[0]), tools=mt.tools(case), add_generation_prompt=True,
                                            return_dict=False)  # fmt: skip
        if len(ids) + room <= 8192:
            chosen.append(case)
        if len(chosen) == count:
            break
    return chosen


def build(kind: str, model: str, template: str, dtype: str) -> Any:
    import torch

    from langgraph_art.serve.engines.choose import build_engine

    if kind == "vllm":
        return build_engine("vllm", model, device="cpu", chat_template=template, max_model_len=8192, kv_cache_gib=4,
                            dtype=dtype)  # fmt: skip
    return build_engine("hf", model, chat_template=template, enable_prefix_caching=kind == "hf",
                        dtype=getattr(torch, dtype))  # fmt: skip


async def run_case(engine: Any, case: Any, runs: int, turns: int, max_tokens: int, per_user_turn: int) -> int:
    """``runs`` concurrent tool loops of ``turns`` model calls on ``case``; the tokens they sampled. Each call's
    reply is followed by a tool result; with ``per_user_turn`` > 0, every ``per_user_turn``-th call's result is also
    followed by the case's next user turn (while it has one), as ``examples/multi_turn.py``'s graph goes on."""
    import bfcl_multi_turn as mt

    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams

    tools = mt.tools(case)

    async def one(run: int) -> int:
        messages = list(case.turns[0])
        sampled, user_turn = 0, 0
        for turn in range(turns):
            ids = engine.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                       return_dict=False)  # fmt: skip
            params = SamplingParams(temperature=0.7, max_tokens=max_tokens, seed=1000 * run + turn)
            result = await engine.generate(GenerationRequest(list(ids), params))
            sample = result.samples[0]
            sampled += len(sample.token_ids)
            messages = [*messages, {"role": "assistant", "content": sample.text},
                        {"role": "tool", "content": TOOL_RESULT}]  # fmt: skip
            if per_user_turn and (turn + 1) % per_user_turn == 0 and user_turn + 1 < len(case.turns):
                user_turn += 1
                messages += list(case.turns[user_turn])
        return sampled

    return sum(await asyncio.gather(*(one(run) for run in range(runs))))


async def measure(kind: str, args: argparse.Namespace, template: str) -> dict[str, float]:
    engine = build(kind, args.model, template, args.dtype)
    await engine.start()
    try:
        users = args.turns // args.calls_per_user_turn if args.calls_per_user_turn else 0  # user turns added
        chosen = cases(args.cases, engine.tokenizer, room=args.turns * (args.max_tokens + 60) + users * 100)
        before = engine.stats()
        started = time.perf_counter()
        sampled = 0
        for case in chosen:
            sampled += await run_case(engine, case, args.runs, args.turns, args.max_tokens, args.calls_per_user_turn)
        seconds = time.perf_counter() - started
        stats = {key: value - before.get(key, 0) for key, value in engine.stats().items()}
    finally:
        await engine.close()
    return {"seconds": seconds, "sampled": sampled, "cases": len(chosen), **stats}


def cpu_flags() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "lscpu unavailable"
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags")), [])
    wanted = [f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma", "avx_vnni")]
    return f"{model}; {os.cpu_count()} cores; {' '.join(wanted)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cases", type=int, default=2)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--calls-per-user-turn", type=int, default=0, help="the next user turn follows every K-th call; 0: never"
    )
    parser.add_argument("--engines", default="hf,hf-no-cache,vllm")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="every engine's")
    args = parser.parse_args()
    import torch

    from langgraph_art.models.templates import read_chat_template

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    template = read_chat_template("chatml-tools")
    results = {kind: asyncio.run(measure(kind, args, template)) for kind in args.engines.split(",")}
    users = f" ({args.calls_per_user_turn} a user turn)" if args.calls_per_user_turn else ""
    print(f"\n{args.model}, {args.cases} BFCL multi_turn_base cases x {args.runs} runs x {args.turns} calls{users}, "
          f"up to {args.max_tokens} tokens a turn, {args.dtype}, torch threads {torch.get_num_threads()}; "
          f"{cpu_flags()}")  # fmt: skip
    print("| engine | wall s | prefill s | decode s | prompt tokens | prefilled | prefilled share | cache hits | "
          "sampled tok/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, r in results.items():
        share = r["prefill_tokens"] / max(r["prompt_tokens"], 1)
        split = " | ".join(f"{r[k]:.1f}" if k in r else "-" for k in ("prefill_seconds", "decode_seconds"))
        print(f"| {kind} | {r['seconds']:.1f} | {split} | {r['prompt_tokens']:.0f} | {r['prefill_tokens']:.0f} | "
              f"{share:.1%} | {r.get('prefix_cache_hits', 0):.0f} | {r['sampled'] / r['seconds']:.1f} |")  # fmt: skip
    if "hf" in results and "hf-no-cache" in results:
        print(f"HF with the cache: {results['hf-no-cache']['seconds'] / results['hf']['seconds']:.2f}x faster")
    if "hf" in results and "vllm" in results:
        print(f"HF (cache) / vLLM (prefix caching) throughput: "
              f"{results['vllm']['seconds'] / results['hf']['seconds']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
