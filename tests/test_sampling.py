"""Sampling math, checked against values computed by hand."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.serve.engines.hf.sampling import process_logits, sample_tokens, top_logprobs  # noqa: E402


def test_temperature_scales_before_log_softmax() -> None:
    logits = torch.tensor([[2.0, 0.0]])
    out = process_logits(logits, torch.tensor([2.0]), torch.tensor([1.0]))
    # logits / 2 = [1, 0] -> log_softmax = [1 - log(e + 1), -log(e + 1)]
    z = math.log(math.e + 1)
    assert out[0].tolist() == pytest.approx([1 - z, -z], abs=1e-6)


def test_greedy_reports_raw_log_softmax() -> None:
    logits = torch.tensor([[1.0, 0.0]])
    out = process_logits(logits, torch.tensor([0.0]), torch.tensor([0.5]))
    z = math.log(math.e + 1)
    assert out[0].tolist() == pytest.approx([1 - z, -z], abs=1e-6)


def test_top_p_keeps_smallest_set_and_renormalises() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = process_logits(probs.log(), torch.tensor([1.0]), torch.tensor([0.8]))
    # 0.5 alone < 0.8, 0.5 + 0.3 reaches 0.8: keep the first two, renormalised to 0.625 / 0.375
    kept = out[0].exp().tolist()
    assert kept == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-6)


def test_top_p_only_on_its_rows() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    out = process_logits(probs.log(), torch.tensor([1.0, 1.0]), torch.tensor([0.45, 1.0]))
    assert out[0].exp().tolist() == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    assert out[1].exp().tolist() == pytest.approx([0.5, 0.3, 0.2], abs=1e-6)


def test_sampling_seeded_rows_reproduce_and_greedy_is_argmax() -> None:
    logprobs = torch.log_softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    greedy = torch.tensor([False, False, True])

    def draw() -> torch.Tensor:
        return sample_tokens(logprobs, greedy, [random.Random(7), None, None], torch.Generator().manual_seed(1))

    first, second = draw(), draw()
    assert first[0] == second[0]
    assert first[2] == logprobs[2].argmax()


def test_sampling_follows_the_distribution() -> None:
    logprobs = torch.tensor([[math.log(0.8), math.log(0.2)]]).repeat(4000, 1)
    tokens = sample_tokens(
        logprobs, torch.zeros(4000, dtype=torch.bool), [None] * 4000, torch.Generator().manual_seed(0)
    )
    assert tokens.float().mean().item() == pytest.approx(0.2, abs=0.03)


def test_sampling_never_picks_a_masked_token() -> None:
    logprobs = process_logits(
        torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(2000, 1),
        torch.ones(2000),
        torch.full((2000,), 0.8),
    )
    tokens = sample_tokens(
        logprobs, torch.zeros(2000, dtype=torch.bool), [None] * 2000, torch.Generator().manual_seed(0)
    )
    assert set(tokens.tolist()) == {0, 1}
    assert (tokens == 1).float().mean().item() == pytest.approx(0.375, abs=0.04)


def test_top_logprobs_sorted() -> None:
    values, ids = top_logprobs(torch.tensor([[0.1, 0.7, 0.2]]).log(), 2)
    assert ids[0].tolist() == [1, 2]
    assert values[0].exp().tolist() == pytest.approx([0.7, 0.2])


def test_prefill_batches_each_distinct_prompt_once_left_padded() -> None:
    from langgraph_art.serve.engines.hf.prefill import build_prefill

    batch = build_prefill([[5, 6, 7], [9], [5, 6, 7], [5, 6, 7]], pad=0, device="cpu")
    assert batch.input_ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert batch.mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch.source == [0, 1, 0, 0] and batch.shared == 2 and batch.padded
    same = build_prefill([[1, 2], [3, 4]], pad=0, device="cpu")
    assert not same.padded and same.shared == 0 and same.source == [0, 1]
