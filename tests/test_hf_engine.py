"""HFEngine's own behaviour: shared prefills, dynamic batching, batches by adapter. What every engine must do
(logprobs, seeds, stops, adapters, streaming, limits) is in test_engine_conformance.py, run against HFEngine too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.serve.engines.base import (  # noqa: E402
    GenerationRequest,
    SamplingParams,
)
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from tests.helpers import WEATHER_CALL, WEATHER_PROMPTS, WEATHER_TOOL  # noqa: E402
from tests.test_continuous_batching import first_tokens  # noqa: E402


@pytest.fixture(scope="module")
async def engine(tiny_path: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(str(tiny_path), served_name="tiny", max_batch_size=32)
    await eng.start()
    yield eng
    await eng.close()


def prompt(engine: HFEngine, text: str = "hello there", tools: list | None = None) -> list[int]:
    return list(
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tools=tools, add_generation_prompt=True, return_dict=False
        )
    )


@pytest.fixture(scope="module")
def base_model(tiny_path: Path) -> Any:
    """The model as loaded, apart from the engine's (which merges adapters into its weights)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def reference_logprobs(model: Any, prompt_ids: list[int], ids: list[int], temperature: float) -> list[float]:
    """A fresh forward pass over prompt + completion: log_softmax(logits / T) at each sampled token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()


async def test_shared_prompts_are_prefilled_once_and_sample_as_if_alone(engine: HFEngine, base_model: Any) -> None:
    """A GRPO group's identical prompts share one prefill (their rows copy its KV cache); each sample must be
    what it would have been alone: same seeded tokens, logprobs of the same distribution."""
    a, b = prompt(engine, "tell me about the weather"), prompt(engine, "a much longer question about the sea, please")
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=5)
    shared = engine.prefills_shared
    together = await asyncio.gather(*(engine.generate(GenerationRequest(p, params)) for p in (a, b, a)))
    for ids, result in zip((a, b, a), together, strict=True):
        for i, sample in enumerate(result.samples):
            one = SamplingParams(temperature=1.0, max_tokens=12, n=1, seed=5 + i)
            (alone,) = (await engine.generate(GenerationRequest(ids, one))).samples
            assert sample.token_ids == alone.token_ids
            assert max(abs(x - y) for x, y in zip(sample.logprobs, alone.logprobs, strict=True)) < 1e-4
            ref = reference_logprobs(base_model, ids, sample.token_ids, 1.0)
            assert max(abs(x - y) for x, y in zip(ref, sample.logprobs, strict=True)) < 1e-4
    assert engine.prefills_shared - shared >= 6  # 9 rows of 2 prompts: at most 3 prefills (one batch: 2)


async def test_requests_arriving_during_a_batch_join_the_next_one(engine: HFEngine) -> None:
    ids = prompt(engine)
    before = engine.batches_run
    long_one, _ = await first_tokens(engine, GenerationRequest(ids, SamplingParams(max_tokens=200)), 1)  # running
    short = [engine.generate(GenerationRequest(ids, SamplingParams(max_tokens=8))) for _ in range(12)]
    results = await asyncio.gather(long_one, *short)
    assert all(len(r.samples[0].token_ids) == 8 for r in results[1:])
    assert engine.batches_run - before <= 3  # 13 requests, at most a few batches, not 13


async def test_batches_group_by_adapter(engine: HFEngine, tool_adapter: Path) -> None:
    await engine.load_adapter("weather@1", str(tool_adapter))
    ids = prompt(engine, WEATHER_PROMPTS[0], [WEATHER_TOOL])
    greedy = SamplingParams(temperature=0, max_tokens=40)
    mixed = [GenerationRequest(ids, greedy, adapter="weather@1" if i % 2 else None) for i in range(8)]
    results = await asyncio.gather(*(engine.generate(r) for r in mixed))
    for i, result in enumerate(results):
        assert (result.samples[0].text == WEATHER_CALL) == bool(i % 2)
