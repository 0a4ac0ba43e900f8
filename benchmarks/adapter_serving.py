"""How the HF engine serves a LoRA adapter, timed: merged into the weights (the default for small models: a copy of
the targeted weights), unmerged on weights shared with the trainer (``share_weights``: FastLM's fused LoRA path, or
transformers' forward through our hooks), against peft's LoRA layers (transformers + peft unmerged), same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/adapter_serving.py [--models tiny-5m,qwen-0.5b-shape]

Each engine samples 8 runs x 32 tokens from one prompt with an all-linear rank-8 adapter (non-zero B), 3 timed
rounds after a warm-up; the table gives the median seconds per round and sampled tokens per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROWS, NEW_TOKENS, ROUNDS = 8, 32, 3
OPTIONS: dict[str, dict[str, Any]] = {
    "merged (FastLM)": {},
    "shared, FastLora": {"share_weights": True},
    "shared, hooks": {"share_weights": True, "fast_decode": False},
    "peft layers (peer)": {"fast_decode": False, "merge_adapters": False},
}


def adapter(model: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = get_peft_model(AutoModelForCausalLM.from_pretrained(model), LoraConfig(r=8, target_modules="all-linear"))
    for name, param in lm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    lm.save_pretrained(str(out))
    return out


async def time_engine(model: Path, folder: Path, options: dict[str, Any]) -> float:
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
    from langgraph_art.serve.engines.hf.engine import HFEngine

    engine = HFEngine(str(model), max_batch_size=ROWS, **options)
    await engine.start()
    try:
        await engine.load_adapter("a@1", str(folder))
        engine._eos = set()  # benchmark only: every row samples exactly NEW_TOKENS tokens
        prompt = list(
            engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": "Write some numbers."}], add_generation_prompt=True, return_dict=False
            )
        )
        params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, n=ROWS, seed=1)
        rounds = []
        for index in range(ROUNDS + 1):
            start = time.perf_counter()
            await engine.generate(GenerationRequest(prompt, params, adapter="a@1"))
            if index:  # the first round warms up
                rounds.append(time.perf_counter() - start)
        return statistics.median(rounds)
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-5m,qwen-0.5b-shape")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.path.insert(0, str(Path(__file__).parent))
    from engines import model_folder

    print(f"{ROWS} runs x {NEW_TOKENS} tokens per round, all-linear rank-8 adapter, fp32, CPU")
    print("| model | how the adapter is served | s per round | tokens/s |")
    print("|---|---|---:|---:|")
    for name in args.models.split(","):
        model = model_folder(name)
        folder = adapter(model, Path(tempfile.mkdtemp()) / "adapter")
        for label, options in OPTIONS.items():
            seconds = asyncio.run(time_engine(model, folder, options))
            print(f"| {name} | {label} | {seconds:.2f} | {ROWS * NEW_TOKENS / seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
