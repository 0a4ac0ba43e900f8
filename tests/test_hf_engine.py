"""HFEngine: exact logprobs, seeds, stops, dynamic batching, adapters by name, context limits."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.errors import AdapterError, ContextLengthError, ModelNotFoundError  # noqa: E402
from langgraph_art.serve.engines.base import (  # noqa: E402
    FinishedEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from langgraph_art.serve.engines.hf import HFEngine  # noqa: E402
from tests.helpers import WEATHER_CALL, WEATHER_PROMPTS, WEATHER_TOOL  # noqa: E402


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


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
async def test_logprobs_match_a_fresh_forward_pass(engine: HFEngine, base_model: Any, temperature: float) -> None:
    ids = prompt(engine)
    params = SamplingParams(temperature=temperature, max_tokens=24, n=4, seed=3)
    result = await engine.generate(GenerationRequest(ids, params))
    assert len(result.samples) == 4
    for sample in result.samples:
        assert len(sample.token_ids) == len(sample.logprobs) > 0
        ref = reference_logprobs(base_model, ids, sample.token_ids, temperature)
        assert max(abs(a - b) for a, b in zip(ref, sample.logprobs, strict=True)) < 1e-4


async def test_seeded_requests_reproduce_and_choices_differ(engine: HFEngine) -> None:
    ids = prompt(engine, "tell me about the weather")
    params = SamplingParams(temperature=1.5, max_tokens=16, n=3, seed=11)
    first, second = await asyncio.gather(*(engine.generate(GenerationRequest(ids, params)) for _ in range(2)))
    assert [s.token_ids for s in first.samples] == [s.token_ids for s in second.samples]
    assert len({tuple(s.token_ids) for s in first.samples}) > 1  # seed + i per choice, as vLLM does


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


async def test_max_tokens_gives_length_and_eos_gives_stop(engine: HFEngine, tool_adapter: Path) -> None:
    ids = prompt(engine)
    result = await engine.generate(GenerationRequest(ids, SamplingParams(max_tokens=5)))
    assert result.samples[0].finish_reason == "length" and len(result.samples[0].token_ids) == 5
    await engine.load_adapter("weather@1", str(tool_adapter))
    tool_prompt = prompt(engine, WEATHER_PROMPTS[0], [WEATHER_TOOL])
    done = await engine.generate(
        GenerationRequest(tool_prompt, SamplingParams(temperature=0, max_tokens=64), adapter="weather@1")
    )
    sample = done.samples[0]
    assert sample.finish_reason == "stop"
    assert sample.token_ids[-1] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")  # EOS is kept in ids
    assert sample.text == WEATHER_CALL  # and left out of the text
    assert engine.tokenizer.decode(sample.token_ids, skip_special_tokens=True) == sample.text


async def test_stop_string_cuts_text_but_keeps_sampled_ids(engine: HFEngine) -> None:
    ids = prompt(engine, WEATHER_PROMPTS[0], [WEATHER_TOOL])
    params = SamplingParams(temperature=0, max_tokens=64, stop=('"arguments"',))
    result = await engine.generate(GenerationRequest(ids, params, adapter="weather@1"))
    sample = result.samples[0]
    assert sample.finish_reason == "stop"
    assert sample.text == '<tool_call>{"name": "get_weather", '
    assert engine.tokenizer.decode(sample.token_ids).startswith(sample.text + '"arguments"')


async def test_adapter_changes_outputs_and_unloads(engine: HFEngine, base_model: Any, tool_adapter: Path) -> None:
    from peft import PeftModel

    ids = prompt(engine, WEATHER_PROMPTS[1], [WEATHER_TOOL])
    await engine.load_adapter("weather@1", str(tool_adapter))
    greedy = SamplingParams(temperature=0, max_tokens=40)
    base = await engine.generate(GenerationRequest(ids, greedy))
    tuned = await engine.generate(GenerationRequest(ids, greedy, adapter="weather@1"))
    assert base.samples[0].text != tuned.samples[0].text
    assert tuned.samples[0].text == WEATHER_CALL
    # each matches its own model: the base model's weights are untouched by the adapter merged for `tuned`
    ref = reference_logprobs(base_model, ids, base.samples[0].token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, base.samples[0].logprobs, strict=True)) < 1e-4
    tuned_model = PeftModel.from_pretrained(copy.deepcopy(base_model), str(tool_adapter)).eval()
    ref = reference_logprobs(tuned_model, ids, tuned.samples[0].token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, tuned.samples[0].logprobs, strict=True)) < 1e-4
    ref = reference_logprobs(tuned_model, ids, base.samples[0].token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, base.samples[0].logprobs, strict=True)) > 1e-3
    await engine.load_adapter("weather@2", str(tool_adapter))
    assert set(engine.adapters()) >= {"weather@1", "weather@2"}
    await engine.unload_adapter("weather@2")
    assert "weather@2" not in engine.adapters()
    with pytest.raises(ModelNotFoundError, match="weather@2"):
        await engine.generate(GenerationRequest(ids, greedy, adapter="weather@2"))


async def test_bad_adapter_folders_are_refused(engine: HFEngine, tmp_path: Path, tool_adapter: Path) -> None:
    with pytest.raises(AdapterError, match=r"no adapter_config\.json"):
        await engine.load_adapter("x@1", str(tmp_path))
    with pytest.raises(AdapterError, match="step number"):
        await engine.load_adapter("x@latest", str(tool_adapter))
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "target_modules": ["nope"], "r": 4}')
    with pytest.raises(AdapterError, match="could not load"):
        await engine.load_adapter("x@1", str(tmp_path))
    assert "x@1" not in engine.adapters()
    result = await engine.generate(GenerationRequest(prompt(engine), SamplingParams(max_tokens=3)))
    assert len(result.samples[0].token_ids) == 3  # still serving


async def test_requests_arriving_during_a_batch_join_the_next_one(engine: HFEngine) -> None:
    ids = prompt(engine)
    before = engine.batches_run
    long_one = asyncio.create_task(engine.generate(GenerationRequest(ids, SamplingParams(max_tokens=200))))
    await asyncio.sleep(0.05)  # the long request is running now
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


async def test_streaming_yields_each_token_then_the_result(engine: HFEngine) -> None:
    events = [e async for e in engine.stream(GenerationRequest(prompt(engine), SamplingParams(max_tokens=6, n=2)))]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], FinishedEvent) and len(tokens) == 12
    for sample in events[-1].result.samples:
        assert [t.token_id for t in tokens if t.index == sample.index] == sample.token_ids


async def test_context_length_is_enforced(engine: HFEngine) -> None:
    with pytest.raises(ContextLengthError, match="context length is 2048"):
        await engine.generate(GenerationRequest(list(range(10, 2100))))
    with pytest.raises(ContextLengthError, match="ask for at most"):
        await engine.generate(GenerationRequest(list(range(10, 2000)), SamplingParams(max_tokens=100)))
    result = await engine.generate(GenerationRequest(list(range(10, 2040))))  # 2030 tokens: 18 left
    assert len(result.samples[0].token_ids) == 18 and result.samples[0].finish_reason == "length"
