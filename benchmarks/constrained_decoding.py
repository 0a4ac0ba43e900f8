"""What decoding under a grammar costs per token, by library and in the engine, against a decode step of the model.

    OMP_NUM_THREADS=1 python benchmarks/constrained_decoding.py [--model tiny-5m] [--batch 16] [--steps 400]

Issue 17's target: the mask under 10% of a decode step on tiny-5m at batch 16.

1. The libraries alone, in one harness: ``--batch`` matchers of one JSON schema (a router's answer: an enum, a free
   string, a number, a list of strings) driven token by token along sampled paths (a row restarts when its document
   ends). Per step: each row's mask filled, unpacked and applied to [batch, V] logits, a token sampled from them,
   each row advanced. The sampling is timed apart (every decoder pays it). llguidance (what langgraph-art uses),
   xgrammar (vLLM's default backend) and outlines-core (a regex DFA); the peers from ``pip install -e ".[bench]"``.
2. The engine: ``HFEngine`` sampling ``--batch`` rows of 64 tokens with and without a grammar (a JSON string that
   cannot end before then, so both decode the same 64 steps): the wall time per step, median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from langgraph_art.models.grammar import Grammars, unpack
from langgraph_art.models.loading import load_tokenizer, resolve_model
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
from langgraph_art.serve.engines.hf.engine import HFEngine
from langgraph_art.serve.structured import JSON_STYLE

SCHEMA = {
    "type": "object",
    "properties": {
        "destination": {"enum": ["weather", "math", "search", "chat"]},
        "reason": {"type": "string"},
        "confidence": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["destination", "reason", "confidence", "tags"],
    "additionalProperties": False,
}


class LLGuidance:
    """Each library behind the same four calls: ``fill`` writes the packed masks [B, W] int32, ``advance`` feeds
    one token per row, ``done``/``reset`` restart a row whose document ended."""

    def __init__(self, tokenizer: Any, vocab: int, batch: int) -> None:
        self.grammars = Grammars(tokenizer, vocab_size=vocab)
        self.grammar = f"start: answer\nanswer: %json {json.dumps({**SCHEMA, 'x-guidance': JSON_STYLE})}\n"
        self.matchers = [self.grammars.matcher(self.grammar) for _ in range(batch)]

    def fill(self, out: torch.Tensor) -> None:
        self.grammars.packed(self.matchers, out)

    def advance(self, tokens: list[int]) -> None:
        for matcher, token in zip(self.matchers, tokens, strict=True):
            matcher.consume_token(token)

    def done(self, row: int) -> bool:
        return bool(self.matchers[row].is_stopped())

    def reset(self, row: int) -> None:
        self.matchers[row] = self.grammars.matcher(self.grammar)


class XGrammar(LLGuidance):
    def __init__(self, tokenizer: Any, vocab: int, batch: int) -> None:
        import xgrammar as xgr

        compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
        compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        self.batched = xgr.BatchGrammarMatcher()

    def fill(self, out: torch.Tensor) -> None:
        self.batched.batch_fill_next_token_bitmask(self.matchers, out)

    def advance(self, tokens: list[int]) -> None:
        for matcher, token in zip(self.matchers, tokens, strict=True):
            matcher.accept_token(token)

    def done(self, row: int) -> bool:
        return bool(self.matchers[row].is_terminated())

    def reset(self, row: int) -> None:
        self.matchers[row].reset()


class OutlinesCore(LLGuidance):
    def __init__(self, tokenizer: Any, vocab: int, batch: int) -> None:
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema

        from langgraph_art.serve.chat import TokenText

        text = TokenText(tokenizer)
        special = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
        pieces: dict[bytes, list[int]] = {}
        for i in range(len(tokenizer)):
            if i not in special:
                pieces.setdefault(bytes(text(i)[1]), []).append(i)
        regex = build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern=" ?")
        index = oc.Index(regex, oc.Vocabulary(int(tokenizer.eos_token_id), pieces))
        self.matchers = [oc.Guide(index) for _ in range(batch)]

    def fill(self, out: torch.Tensor) -> None:
        for row, guide in enumerate(self.matchers):
            guide.write_mask_into(out[row].data_ptr(), out[row].numel(), out.element_size())

    def advance(self, tokens: list[int]) -> None:
        for guide, token in zip(self.matchers, tokens, strict=True):
            if not guide.is_finished():
                guide.advance(token)

    def done(self, row: int) -> bool:
        return bool(self.matchers[row].is_finished())

    def reset(self, row: int) -> None:
        self.matchers[row].reset()


LIBRARIES = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines-core": OutlinesCore}


def drive(driver: LLGuidance, vocab: int, batch: int, steps: int) -> tuple[float, float]:
    """(mask ms per step: fill + unpack + apply + advance, sampling ms per step)."""
    gen = torch.Generator().manual_seed(0)
    packed = torch.full((batch, (vocab + 31) // 32), -1, dtype=torch.int32)
    masked = sampled = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, vocab, generator=gen)
        t0 = time.perf_counter()
        driver.fill(packed)
        logits.masked_fill_(~unpack(packed, vocab), float("-inf"))
        t1 = time.perf_counter()
        tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1).tolist()
        t2 = time.perf_counter()
        driver.advance(tokens)
        for row in range(batch):
            if driver.done(row):
                driver.reset(row)
        masked += (t1 - t0) + (time.perf_counter() - t2)
        sampled += t2 - t1
    return masked / steps * 1e3, sampled / steps * 1e3


async def engine_steps(model: str, batch: int, repeats: int) -> tuple[float, float]:
    """Median wall ms per decode step of ``batch`` rows x 64 tokens: free, and under a grammar."""
    engine = HFEngine(model, max_batch_size=batch)
    await engine.start()
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "route: the weather in paris"}], add_generation_prompt=True, return_dict=False
    )
    long_string = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 4000}},
        "required": ["text"],
    }
    grammar = f"start: answer\nanswer: %json {json.dumps({**long_string, 'x-guidance': JSON_STYLE})}\n"

    async def timed(constrained: bool) -> float:
        params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=not constrained)
        requests = [
            GenerationRequest(list(prompt), params, grammar=grammar if constrained else None) for _ in range(batch)
        ]
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        assert all(len(r.samples[0].token_ids) == 64 for r in results)
        return (time.perf_counter() - started) / 64 * 1e3

    await timed(True), await timed(False)  # warm-up
    free, under = [], []
    for _ in range(repeats):
        free.append(await timed(False))
        under.append(await timed(True))
    await engine.close()
    return statistics.median(free), statistics.median(under)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-5m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    free, under = asyncio.run(engine_steps(args.model, args.batch, args.repeats))
    tokenizer = load_tokenizer(resolve_model(args.model))
    vocab = len(tokenizer)
    print(f"{args.model}, batch {args.batch}: a decode step takes {free:.2f} ms (HFEngine, median of {args.repeats})")
    print(f"\n1. the libraries alone, {args.steps} steps of {args.batch} rows, vocabulary {vocab}")
    print("| library | setup ms | mask + apply + advance ms/step | of a decode step | sampling ms/step |")
    print("|---|---:|---:|---:|---:|")
    for name, make in LIBRARIES.items():
        try:
            started = time.perf_counter()
            driver = make(tokenizer, vocab, args.batch)
            setup = (time.perf_counter() - started) * 1e3
        except ImportError as exc:
            print(f"| {name} | not installed ({exc.name}): pip install -e '.[bench]' | | | |")
            continue
        mask, sampling = drive(driver, vocab, args.batch, args.steps)
        print(f"| {name} | {setup:.0f} | {mask:.3f} | {mask / free:.1%} | {sampling:.3f} |")
    print(f"\n2. HFEngine, {args.batch} rows x 64 tokens, median of {args.repeats}")
    print("| decoding | ms per step | overhead |")
    print("|---|---:|---:|")
    print(f"| free | {free:.2f} | |")
    print(f"| under a grammar (llguidance) | {under:.2f} | {under / free - 1:+.1%} |")


if __name__ == "__main__":
    main()
