"""The shared head (cascade attention) of the HF engine's batch cache: rows that begin with the same long prompt (a
GRPO group's runs and the turns of their agent loops) read that beginning's KV from one copy, once a decode step, and
compute what they computed with the whole row in their own columns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from langgraph_art.serve.engines.hf import kv_cache, steps  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from langgraph_art.serve.engines.hf.fast import (  # noqa: E402
    _attend,
    _attend_lse,
    _attend_lse_math,
    _attend_with_head,
    _attention_mask,
)
from langgraph_art.serve.engines.hf.kv_cache import FastCache  # noqa: E402
from langgraph_art.serve.engines.hf.steps import _row_columns  # noqa: E402
from tests.helpers import WEATHER_TOOL, async_wait_until  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 3])
def test_attention_over_a_shared_head_equals_attention_over_the_whole_row(dtype: torch.dtype, width: int) -> None:
    """3 rows, 6 query heads on 2 key heads; rows 0 and 2 read a 5-token head before their own 4 + ``width`` columns,
    row 1 does not; row 1's first two columns are padding, and with 3 tokens a step row 2 feeds 2 (a padding query)."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    rows, own = 3, 4 + width
    q = rand(rows, 6, width, 8)  # [B, heads, T, hd]
    head_keys, head_values = rand(2, 5, 8), rand(2, 5, 8)  # [kv, P, hd]
    keys, values = rand(rows, 2, own, 8), rand(rows, 2, own, 8)  # [B, kv, S, hd]
    valid = torch.ones(rows, own, dtype=torch.bool)
    valid[1, :2] = False
    if width > 1:
        valid[2, 4] = False
    mask = _attention_mask(valid, 4, width)  # [B, 1, T, S] or None
    shares = torch.tensor([True, False, True])
    got = _attend_with_head(q, keys, values, mask, head_keys, head_values, shares)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    for b in range(rows):
        row_mask = None if mask is None else mask[b : b + 1]
        if shares[b]:  # the same attention with the head's columns in front of the row's own
            row_keys = torch.cat([head_keys, keys[b]], 1)[None]
            row_values = torch.cat([head_values, values[b]], 1)[None]
            if row_mask is not None:
                row_mask = torch.cat([torch.ones(1, 1, width, 5, dtype=torch.bool), row_mask], -1)
        else:
            row_keys, row_values = keys[b : b + 1], values[b : b + 1]
        want = _attend(q[b : b + 1], row_keys, row_values, row_mask, False)
        real = valid[b, 4:] if width > 1 else torch.ones(1, dtype=torch.bool)  # a padding query's output is unused
        assert (got[b : b + 1] - want)[:, :, real].abs().max() <= tolerance, b


def test_the_written_out_attention_matches_the_cpu_kernel() -> None:
    """Off the CPU the two parts come from ``_attend_lse_math``: the same output and log-sum-exp as the kernel's."""
    generator = torch.Generator().manual_seed(1)
    q, keys, values = (torch.randn(2, 3, 4, 8, generator=generator) for _ in range(3))
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
    for m in (None, mask):
        out, lse = _attend_lse(q, keys, values, m)
        out_math, lse_math = _attend_lse_math(q, keys, values, m)
        scores = (q @ keys.transpose(-1, -2)) / 8**0.5
        if m is not None:
            scores = scores.masked_fill(~m, float("-inf"))
        assert torch.allclose(lse, scores.logsumexp(-1), atol=1e-5)  # by hand
        assert torch.allclose(out, out_math, atol=1e-5) and torch.allclose(lse, lse_math, atol=1e-5)


def cache_of_tokens(lengths: list[int], capacity: int) -> FastCache:
    """Rows right-aligned at the longest; the KV of the token at position p is p + 1 (the same in every row, as the
    KV of the same tokens is)."""
    length = max(lengths)
    keys = torch.zeros((1, len(lengths), 1, capacity, 2))
    valid = torch.zeros((len(lengths), capacity), dtype=torch.bool)
    for row, n in enumerate(lengths):
        keys[0, row, 0, length - n : length] = torch.arange(1.0, n + 1)[:, None]
        valid[row, length - n : length] = True
    return FastCache(keys=keys, values=-keys, valid=valid, length=length)


def test_a_shared_head_is_held_once_and_rows_keep_what_follows() -> None:
    running = cache_of_tokens([6, 8], capacity=12)
    running.share_head([0, 1], 4)
    assert running.head_length == 4 and running.shares is not None and running.shares.tolist() == [True, True]
    assert running.head_keys is not None and running.head_keys[0, 0, :, 0].tolist() == [1, 2, 3, 4]
    assert running.valid[:, :8].tolist() == [[False] * 6 + [True] * 2, [False] * 4 + [True] * 4]
    assert running.first_used(8) == 4  # attention no longer reads the head's columns in the rows
    assert [running.tokens_held(b) for b in range(2)] == [6, 8]
    keys, values = _row_columns(running, 1)(2, 7)  # tokens 2..6: three from the head, two from the row's own
    assert keys[0, 0, :, 0].tolist() == [3, 4, 5, 6, 7] and values[0, 0, :, 0].tolist() == [-3, -4, -5, -6, -7]

    storage = running.keys.untyped_storage().data_ptr()
    running.select(torch.tensor([1]))  # row 0 leaves; its room stays
    assert running.shares is not None and running.shares.tolist() == [True]
    joiners = cache_of_tokens([7, 3], capacity=8)  # the first begins with the head, the second does not
    assert running.head_keys is not None and running.head_values is not None
    joiners.adopt_head([0], running.head_keys, running.head_values)
    running.extend(joiners)
    assert running.keys.untyped_storage().data_ptr() != storage  # two rows joining where one left: new buffers
    assert running.shares is not None and running.shares.tolist() == [True, True, False]
    assert [running.tokens_held(b) for b in range(3)] == [8, 7, 3]
    end = running.length
    assert int(running.valid[:, :end].sum()) == 4 + 3 + 3  # only what follows the head was copied for the first joiner
    assert running.keys[0, 1, 0, end - 3 : end, 0].tolist() == [5, 6, 7]
    assert _row_columns(running, 1)(0, 7)[0][0, 0, :, 0].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert _row_columns(running, 2)(0, 3)[0][0, 0, :, 0].tolist() == [1, 2, 3]  # not sharing: all its own

    running.select(torch.tensor([1, 1, 2]))  # repeats: copied, the shares with them
    assert running.shares is not None and running.shares.tolist() == [True, True, False]
    assert running.copy().shares is not None and running.copy().head_keys is running.head_keys


def test_rows_whose_prompt_is_all_head_repeat_nothing() -> None:
    """One prompt sampled n times: the head is the whole prompt, so the n rows hold no columns of their own yet."""
    cache = cache_of_tokens([5], capacity=9)
    cache.share_head([0], 5)
    cache.select(torch.tensor([0, 0, 0]))
    assert cache.length == 0 and cache.valid.shape[0] == 3 and [cache.tokens_held(b) for b in range(3)] == [5] * 3


async def run_agent_group(path: Path, head: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list, int, int]:
    """A group of 4 runs of one long prompt decoding while the next turn of one of them (the prompt, a call, a tool
    result) and an unrelated request join; the samples, how many rows shared a head (the group's, and the joiner
    prefilled after it), how many requests joined."""
    monkeypatch.setattr(steps, "MIN_SHARED_HEAD", head)
    shared = []
    share, after = kv_cache.FastCache.share_head, steps.FastSteps._after_head

    def counting(cache: FastCache, rows: list[int], length: int) -> None:
        shared.append(len(rows))
        share(cache, rows, length)

    def counting_after(fast_steps: steps.FastSteps, prompts: list[tuple[int, ...]]) -> list[int]:
        skips = after(fast_steps, prompts)
        shared.append(sum(skip > 0 for skip in skips))
        return skips

    monkeypatch.setattr(kv_cache.FastCache, "share_head", counting)
    monkeypatch.setattr(steps.FastSteps, "_after_head", counting_after)
    engine = HFEngine(str(path), max_batch_size=16)
    await engine.start()
    try:
        template = engine.tokenizer.apply_chat_template
        chat = [{"role": "user", "content": "the weather in Paris, Rome, Oslo and the sea " * 4}]
        prompt = list(template(chat, tools=[WEATHER_TOOL], add_generation_prompt=True, return_dict=False))
        other = list(template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False))
        next_turn = [*prompt, *range(100, 140)]  # what a call and its result add

        def req(ids: list[int], tokens: int, seed: int, n: int = 1) -> GenerationRequest:
            params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=seed, ignore_eos=True, n=n)
            return GenerationRequest(ids, params)

        group = asyncio.create_task(engine.generate(req(prompt, 160, seed=1, n=4)))
        await async_wait_until(lambda: engine.batches_run > 0, "the group's batch to start")
        joined = await asyncio.gather(engine.generate(req(next_turn, 12, seed=2)), engine.generate(req(other, 8, 3)))
        assert not group.done()  # the two joined the group's batch
        results = [await group, *joined]
        return [(s.token_ids, s.logprobs) for r in results for s in r.samples], sum(shared), engine.requests_joined
    finally:
        await engine.close()


async def test_runs_sharing_a_head_sample_what_they_sample_without_it(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_head, rows_shared, joined = await run_agent_group(tiny_path, 8, monkeypatch)
    without, none_shared, _ = await run_agent_group(tiny_path, 10**9, monkeypatch)
    assert rows_shared >= 2 and none_shared == 0 and joined == 2  # the group's row, then the next turn after it
    assert len(with_head) == len(without) == 6
    for (ids, logprobs), (ids_ref, logprobs_ref) in zip(with_head, without, strict=True):
        assert ids == ids_ref
        assert max(abs(a - b) for a, b in zip(logprobs, logprobs_ref, strict=True)) < 1e-4
