"""HFEngine against VLLMEngine, in the same run, on the same prompts: tokens per second at 1, 8 and 64 concurrent
requests, start-up time, and the cost of serving a new checkpoint (load + first request on it).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/engines.py [--models tiny-5m,qwen-0.5b-shape,smollm2-135m]
        [--threads 2] [--concurrency 1,8,32] [--grammar]

Needs vLLM (``./dev test-vllm`` builds ``.venv-vllm``). ``qwen-0.5b-shape`` is a Qwen2.5-0.5B-shaped model built
here with random weights (24 layers, hidden 896, 14 heads of 64, 2 KV heads, MLP 4864) on the tiny tokenizer
(vocabulary 2048, so ~360M parameters instead of 494M). Every request samples exactly ``--max-tokens`` tokens at
temperature 1 (EOS is not a stop here: the random models would end at different lengths per engine). Engines run
one after the other (one heavy process at a time). On these CPUs both are within a small factor of each other; on a
GPU vLLM's paged attention, continuous batching and CUDA graphs are where the gap opens (``gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TQDM_DISABLE", "1")


def qwen_half_b_shape() -> Path:
    """A Qwen2.5-0.5B-shaped random model on the tiny tokenizer, built once under the tiny-model cache."""
    from langgraph_art.models.tiny import NORM_SCALE, default_cache_dir, tiny_model

    target = default_cache_dir() / "bench" / "qwen-0.5b-shape-v1"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    source = tiny_model()
    staging = Path(tempfile.mkdtemp(dir=default_cache_dir()))
    for name in os.listdir(source):
        if "token" in name or name.endswith(".jinja"):
            shutil.copy(source / name, staging / name)
    tiny = json.loads((source / "config.json").read_text())
    config = Qwen2Config(
        vocab_size=tiny["vocab_size"], hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        tie_word_embeddings=True, eos_token_id=tiny["eos_token_id"], pad_token_id=tiny["pad_token_id"],
        bos_token_id=None, dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(NORM_SCALE)  # as the tiny models: sharper logits than a flat random init
    model.save_pretrained(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return target


def model_folder(name: str) -> Path:
    from langgraph_art.models.loading import resolve_model

    return qwen_half_b_shape() if name == "qwen-0.5b-shape" else Path(resolve_model(name))


def random_adapter(model: Path, out: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    lm = AutoModelForCausalLM.from_pretrained(model)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(lm, config).save_pretrained(str(out))
    return out


def build(kind: str, model: Path, device: str) -> Any:
    from langgraph_art.serve.engines.choose import build_engine

    if kind == "hf":
        return build_engine("hf", model, device=device, max_batch_size=256)
    cpu_only = {"kv_cache_gib": 1.0} if device == "cpu" else {"enable_sleep_mode": False}
    return build_engine("vllm", model, device=device, max_lora_rank=8, **cpu_only)


# --grammar: every request decodes under a JSON grammar whose one string cannot end before max_tokens (the mask is
# computed for every token: the cost in question on a 49k vocabulary)
LONG_STRING = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000}}, "required": ["text"]}


def long_string_grammar() -> str:
    from langgraph_art.serve.structured import JSON_STYLE

    return f"start: answer\nanswer: %json {json.dumps({**LONG_STRING, 'x-guidance': JSON_STYLE})}\n"


async def burst(
    engine: Any, prompts: list[list[int]], concurrency: int, max_tokens: int, grammar: str | None = None
) -> float:
    """Tokens per second over ``len(prompts)`` requests, ``concurrency`` in flight at a time."""
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams

    gate = asyncio.Semaphore(concurrency)
    eos_free = SamplingParams(temperature=1.0, max_tokens=max_tokens)

    async def one(i: int, ids: list[int]) -> int:
        async with gate:
            request = GenerationRequest(ids, SamplingParams(**{**eos_free.__dict__, "seed": i}), grammar=grammar)
            return len((await engine.generate(request)).samples[0].token_ids)

    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    return tokens / (time.perf_counter() - started)


async def measure(kind: str, model: Path, adapters: list[Path], args: argparse.Namespace) -> dict[str, float]:
    from langgraph_art.serve.chat import render_prompt
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams

    engine = build(kind, model, args.device)
    started = time.perf_counter()
    await engine.start()
    row: dict[str, float] = {"start_s": time.perf_counter() - started}
    # benchmark only: no EOS, so random rows do not end early and unevenly; both engines sample exactly max_tokens
    engine._eos = [] if kind == "vllm" else set()
    prompts = [
        render_prompt(engine.tokenizer, [{"role": "user", "content": f"benchmark request number {i}"}], None)
        for i in range(max(64, *args.levels))
    ]
    await burst(engine, prompts[:2], 2, 4)  # warm
    for concurrency in args.levels:
        count = max(4, 2 * concurrency) if concurrency < 64 else concurrency
        row[f"tok_s_{concurrency}"] = await burst(engine, prompts[:count], concurrency, args.max_tokens)
        if args.grammar:
            row[f"grammar_tok_s_{concurrency}"] = await burst(
                engine, prompts[:count], concurrency, args.max_tokens, long_string_grammar()
            )
    loads, firsts = [], []
    short = SamplingParams(temperature=1.0, max_tokens=1)
    base_latency = []
    for _ in range(3):
        t = time.perf_counter()
        await engine.generate(GenerationRequest(prompts[0], short))
        base_latency.append(time.perf_counter() - t)
    for step, folder in enumerate(adapters, 1):  # as publish does: a new name@step per checkpoint
        t = time.perf_counter()
        await engine.load_adapter(f"bench@{step}", str(folder))
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        await engine.generate(GenerationRequest(prompts[0], short, adapter=f"bench@{step}"))
        firsts.append(time.perf_counter() - t)
        if step > 1:
            await engine.unload_adapter(f"bench@{step - 1}")
    row["load_ms"] = 1000 * statistics.median(loads)
    row["first_request_ms"] = 1000 * statistics.median(firsts)
    row["base_request_ms"] = 1000 * statistics.median(base_latency)
    await engine.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-5m,qwen-0.5b-shape")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=int(os.environ["OMP_NUM_THREADS"]))
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    parser.add_argument("--grammar", action="store_true", help="also every level under a JSON grammar (llguidance)")
    args = parser.parse_args()
    args.levels = [int(level) for level in args.concurrency.split(",")]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # vLLM's CPU worker reads it
    import torch

    torch.set_num_threads(args.threads)
    results: dict[tuple[str, str], dict[str, float]] = {}
    for name in args.models.split(","):
        model = model_folder(name)
        with tempfile.TemporaryDirectory() as tmp:
            adapters = [random_adapter(model, Path(tmp) / f"a{i}", i) for i in range(args.swaps)]
            for kind in args.engines.split(","):
                results[(name, kind)] = asyncio.run(measure(kind, model, adapters, args))
                print(f"  {name} {kind}: {results[(name, kind)]}", flush=True)
    levels = [f"tok_s_{level}" for level in args.levels]
    levels += [f"grammar_tok_s_{level}" for level in args.levels] if args.grammar else []
    columns = ["start_s", *levels, "load_ms", "first_request_ms", "base_request_ms"]
    print(f"\ndevice={args.device}, max_tokens={args.max_tokens}, threads={args.threads}; tok_s_N: generated tokens /"
          " wall time with N requests in flight; load_ms: load_adapter of a new name@step; first_request_ms: a 1-token"
          " request on it right after (base_request_ms: the same on the base model)")  # fmt: skip
    print("| model | engine | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for (name, kind), row in results.items():
        print(f"| {name} | {kind} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    for name in args.models.split(","):
        if (name, "hf") in results and (name, "vllm") in results:
            hf, vl = results[(name, "hf")], results[(name, "vllm")]
            ratios = ", ".join(f"{c} {vl[c] / hf[c]:.2f}x" for c in levels)
            print(f"{name}: vLLM / HF throughput: {ratios}")


if __name__ == "__main__":
    main()
