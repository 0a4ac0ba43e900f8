"""The engine's fast forward (FastLM) and merged adapters: same numbers as transformers + peft, weights intact."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.errors import AdapterError  # noqa: E402
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from langgraph_art.serve.engines.hf.fast import FastLM, unsupported  # noqa: E402
from langgraph_art.serve.engines.hf.prefill import build_prefill  # noqa: E402
from tests.helpers import WEATHER_PROMPTS, WEATHER_TOOL, assert_same_samples  # noqa: E402


def small_llama(attention_bias: bool) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=attention_bias,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def qwen_tiny(tiny_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "llama+bias"])
def test_fast_forward_matches_transformers(arch: str, tiny_path: Path) -> None:
    """Left-padded prefill of prompts of different lengths, shared rows expanded, two decode steps, a row dropped:
    the next-token logits equal a plain transformers forward over each row's whole sequence."""
    model = qwen_tiny(tiny_path) if arch == "qwen2" else small_llama(attention_bias=arch.endswith("bias"))
    reference = copy.deepcopy(model)
    fast = FastLM.build(model)
    assert fast is not None
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [5, 6, 7, 8, 9, 10], [20]]
    batch = build_prefill(prompts, 0, "cpu")
    cache = fast.new_cache(len(batch.input_ids), batch.input_ids.shape[1])  # full after the prefill: it must grow
    logits = fast.forward(batch.input_ids, batch.positions, batch.mask.bool(), cache)
    index = torch.tensor(batch.source)
    cache.select(index)
    logits, positions = logits[index], batch.positions[index][:, -1:] + 1
    sequences = [list(p) for p in prompts]

    def check(logits: Any) -> None:
        with torch.no_grad():
            for row, seq in enumerate(sequences):
                expected = reference(input_ids=torch.tensor([seq])).logits[0, -1]
                assert torch.allclose(logits[row], expected, atol=1e-4), (arch, row)

    check(logits)
    for step in range(2):
        tokens = torch.tensor([[30 + step + row] for row in range(len(sequences))])
        for seq, token in zip(sequences, tokens[:, 0].tolist(), strict=True):
            seq.append(token)
        logits = fast.forward(tokens, positions, torch.ones_like(tokens, dtype=torch.bool), cache)
        positions = positions + 1
        check(logits)
        if step == 0:  # row 1 finishes: it leaves the cache
            keep = torch.tensor([0, 2, 3])
            cache.select(keep)
            logits, positions = logits[keep], positions[keep]
            sequences = [sequences[i] for i in (0, 2, 3)]
            check(logits)


def test_unsupported_configurations_fall_back_with_a_reason(tiny_path: Path) -> None:
    model = qwen_tiny(tiny_path)
    assert unsupported(model) is None
    model.config.hidden_act = "gelu"
    assert "activation" in (unsupported(model) or "")
    assert FastLM.build(model) is None
    model.config.hidden_act = "silu"
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "rope type" in (unsupported(model) or "")


# -- the engine ------------------------------------------------------------------------------------------------
def save_adapter(tiny_path: Path, folder: Path, seed: int, targets: Any = "all-linear", **lora: Any) -> Path:
    """A LoRA with non-zero B (so it changes the outputs), saved by peft."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(qwen_tiny(tiny_path), LoraConfig(r=4, lora_alpha=8, target_modules=targets, **lora))
    for name, param in model.named_parameters():
        if "lora_B" in name or "lora_magnitude" in name:
            torch.nn.init.normal_(param, mean=1.0 if "magnitude" in name else 0.0, std=0.05)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def adapters(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fast-adapters")
    return {
        "a": save_adapter(tiny_path, root / "a", seed=1),
        "b": save_adapter(tiny_path, root / "b", seed=2),
        "dora": save_adapter(tiny_path, root / "dora", seed=3, use_dora=True),
        "head": lora_only(save_adapter(tiny_path, root / "head", seed=4, targets=["q_proj", "lm_head"])),
    }


def lora_only(folder: Path) -> Path:
    """Keep only the LoRA factors (peft also saves a tied lm_head's base weight unless told not to)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "adapter_model.safetensors")
    save_file({k: v for k, v in tensors.items() if ".lora_" in k}, folder / "adapter_model.safetensors")
    return folder


@pytest.fixture
async def engines(tiny_path: Path, adapters: dict[str, Path]) -> AsyncIterator[tuple[HFEngine, HFEngine]]:
    """The default engine (fast forward, merged adapters) and one that runs transformers + peft unmerged."""
    fast = HFEngine(str(tiny_path), max_batch_size=16)
    plain = HFEngine(str(tiny_path), max_batch_size=16, fast_decode=False, merge_adapters=False)
    for engine in (fast, plain):
        await engine.start()
        for name, folder in adapters.items():
            await engine.load_adapter(f"{name}@1", str(folder))
    assert fast._fast is not None and plain._fast is None
    yield fast, plain
    for engine in (fast, plain):
        await engine.close()


def prompts(engine: HFEngine) -> list[list[int]]:
    texts = [WEATHER_PROMPTS[0], "hi", "a much longer question about the sea and the weather, please"]
    return [
        list(
            engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], tools=[WEATHER_TOOL], add_generation_prompt=True, return_dict=False
            )
        )
        for t in texts
    ]


async def test_fast_merged_engine_samples_what_transformers_and_peft_sample(
    engines: tuple[HFEngine, HFEngine],
) -> None:
    """Mixed prompt lengths in one batch (left padding), n > 1 (shared prefill), the base model, two merged
    adapters, a DoRA adapter and a LoRA on the tied lm_head (both served by peft): same seeded tokens, logprobs
    within 1e-4."""
    fast, plain = engines
    requests = [
        GenerationRequest(ids, SamplingParams(temperature=1.0, max_tokens=12, n=2, seed=7 + i), adapter=adapter)
        for adapter in (None, "a@1", "b@1", "dora@1", "head@1", "a@1")
        for i, ids in enumerate(prompts(fast))
    ]
    got = await asyncio.gather(*(fast.generate(copy.deepcopy(r)) for r in requests))
    want = await asyncio.gather(*(plain.generate(copy.deepcopy(r)) for r in requests))
    texts_by_adapter: dict[str | None, set[str]] = {}
    for request, result, expected in zip(requests, got, want, strict=True):
        for sample, reference in zip(result.samples, expected.samples, strict=True):
            assert sample.token_ids == reference.token_ids, request.adapter
            assert max(abs(a - b) for a, b in zip(sample.logprobs, reference.logprobs, strict=True)) < 1e-4
            texts_by_adapter.setdefault(request.adapter, set()).add(sample.text)
    assert texts_by_adapter[None] != texts_by_adapter["a@1"] != texts_by_adapter["b@1"]  # adapters matter
    assert fast._adapters.folders().keys() == plain._adapters.folders().keys()
    served_by_peft = {name for name, adapter in fast._adapters._names.items() if adapter.peft_key is not None}
    assert served_by_peft == {"dora@1", "head@1"}


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["no-prefix-cache", "prefix-cache"])
async def test_prompts_prefilled_apart_with_their_common_beginning_once_sample_the_same(
    engines: tuple[HFEngine, HFEngine], monkeypatch: pytest.MonkeyPatch, prefix_cache: bool
) -> None:
    """Large batches of distinct prompts are prefilled prompt by prompt, their common beginning (here the system
    turn with the tool list) once: seeded samples as the transformers path gives, logprobs within 1e-4, also for
    rows that join a running batch and with a merged adapter. Without a prefix cache the batch's common beginning
    is computed first; with one, the first prompt whole and the others from the last block it shares with them."""
    from langgraph_art.serve.engines.hf import steps

    monkeypatch.setattr(steps, "APART_PREFILL_WORK", 0)  # the tiny model's batches are below the real threshold
    calls: list[int] = []
    forward = steps.FastSteps._forward_from
    monkeypatch.setattr(
        steps.FastSteps, "_forward_from", lambda self, t, *a: calls.append(len(t)) or forward(self, t, *a)
    )
    fast, plain = engines
    if not prefix_cache:
        monkeypatch.setattr(fast, "prefix_cache", None)  # as HFEngine(enable_prefix_caching=False) has it
    ids = prompts(fast)
    common = steps.common_prefix([tuple(p) for p in ids], min(map(len, ids)) - 1)
    assert common >= steps.MIN_SHARED_PROMPT
    requests = [
        GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=10, n=2, seed=11 + i), adapter=adapter)
        for adapter in (None, "a@1")
        for i, p in enumerate(ids)
    ]
    got = await asyncio.gather(*(fast.generate(copy.deepcopy(r)) for r in requests))
    want = await asyncio.gather(*(plain.generate(copy.deepcopy(r)) for r in requests))
    assert_same_samples(got, want)
    if not prefix_cache:
        assert common in calls and {len(p) - common for p in ids} <= set(calls)  # the beginning once, then each rest
    else:
        block = fast.prefix_cache.block_size
        assert len(ids[0]) in calls  # the first prompt whole, the others from the blocks it left in the cache
        assert {len(p) - common // block * block for p in ids[1:]} <= set(calls)


async def test_switching_adapters_leaves_the_base_weights_bit_identical(
    engines: tuple[HFEngine, HFEngine], tiny_path: Path
) -> None:
    fast, _ = engines
    loaded = qwen_tiny(tiny_path).state_dict()
    ids = prompts(fast)[1]
    merges = fast._adapters.merges
    for adapter in ["a@1", "a@1", "b@1", None, "dora@1", "head@1", "a@1", None]:
        await fast.generate(GenerationRequest(ids, SamplingParams(max_tokens=3, seed=1), adapter=adapter))
    assert fast._adapters.merges - merges == 3  # a, b, a: a repeated batch does not merge again
    current = {k.replace("base_layer.", ""): v for k, v in fast._lm.state_dict().items() if "lora" not in k}
    for key, value in loaded.items():
        assert torch.equal(current[key], value), key


async def test_a_replaced_parameter_is_picked_up_by_the_fast_forward(engines: tuple[HFEngine, HFEngine]) -> None:
    """If something swaps a projection's parameter (not an in-place write), the fused buffers are rebuilt."""
    fast, plain = engines
    ids = prompts(fast)[0]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
    before = await fast.generate(GenerationRequest(ids, params))
    torch.manual_seed(5)
    replacement = torch.randn_like(fast._lm.model.layers[0].mlp.up_proj.get_base_layer().weight)
    for engine in (fast, plain):
        linear = engine._lm.model.layers[0].mlp.up_proj.get_base_layer()  # peft wrapped it for the DoRA adapter
        linear.weight = torch.nn.Parameter(replacement.clone(), requires_grad=False)
    got = await fast.generate(GenerationRequest(ids, params))
    want = await plain.generate(GenerationRequest(ids, params))
    assert got.samples[0].logprobs != before.samples[0].logprobs  # the new weights matter
    assert got.samples[0].token_ids == want.samples[0].token_ids
    assert max(abs(a - b) for a, b in zip(got.samples[0].logprobs, want.samples[0].logprobs, strict=True)) < 1e-4


async def test_an_adapter_for_another_model_is_refused(tiny_path: Path, tmp_path: Path) -> None:
    folder = save_adapter(tiny_path, tmp_path / "a", seed=1)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "adapter_model.safetensors")
    key = next(k for k in tensors if k.endswith("q_proj.lora_A.weight"))
    tensors[key] = torch.zeros(4, tensors[key].shape[1] * 2)  # as if trained on a model twice as wide
    save_file(tensors, folder / "adapter_model.safetensors")
    engine = HFEngine(str(tiny_path))
    await engine.start()
    try:
        with pytest.raises(AdapterError, match="trained on another base model"):
            await engine.load_adapter("x@1", str(folder))
        assert engine.adapters() == {}
    finally:
        await engine.close()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"


@pytest.mark.parametrize("width", [1, 5])
@pytest.mark.parametrize("padded", [False, True])
def test_grouped_query_attention_equals_sdpa_with_the_keys_repeated(width: int, padded: bool) -> None:
    """``_attend``'s three ways (a decode step's query heads on the query axis, the causal kernel for a whole prompt
    from column 0, the mask otherwise) against the textbook: every key head repeated for its query heads."""
    import torch.nn.functional as F

    from langgraph_art.serve.engines.hf.fast import _attend, _attention_mask

    gen = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, head_dim, columns = 3, 6, 2, 8, 9
    q = torch.randn(rows, heads, width, head_dim, generator=gen)
    keys, values = (torch.randn(rows, kv_heads, columns, head_dim, generator=gen) for _ in range(2))
    valid = torch.ones(rows, columns, dtype=torch.bool)
    if padded:
        valid[0, :3] = False  # a row padded on the left
    start = columns - width
    mask = _attention_mask(valid, start, width)
    expected = F.scaled_dot_product_attention(
        q, keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1), attn_mask=mask
    )
    torch.testing.assert_close(_attend(q, keys, values, mask, causal=False), expected)
    if width == columns or (not padded and width > 1):  # the causal kernel, for a prompt fed whole from column 0
        whole = torch.randn(rows, heads, columns, head_dim, generator=gen)
        causal_mask = _attention_mask(torch.ones(rows, columns, dtype=torch.bool), 0, columns)
        reference = F.scaled_dot_product_attention(
            whole, keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1), attn_mask=causal_mask
        )
        torch.testing.assert_close(_attend(whole, keys, values, None, causal=True), reference)
