"""The activations a micro-batch keeps for backward, and the step's plan: split to fit, or checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

from langgraph_art.train.activations import bytes_per_token, fit_micro_batches, forwarded_tokens
from langgraph_art.train.tokenize import TrainSequence


def seq(ids: list[int], trained_from: int) -> TrainSequence:
    n = len(ids)
    mask = [0] * trained_from + [1] * (n - trained_from)
    return TrainSequence(ids, mask, [0.0] * n, [0.0] * n, 1.0, "t")


def test_bytes_per_token_is_fitted_to_the_half_billion_shape() -> None:
    qwen = SimpleNamespace(hidden_size=896, intermediate_size=4864, num_hidden_layers=24)
    assert bytes_per_token(qwen, 4) == 24 * (6 * 4864 + 18 * 896) * 4 == 4_349_952  # measured: ~4.4 MB
    assert bytes_per_token(qwen, 2) == 4_349_952 // 2
    no_mlp_size = SimpleNamespace(hidden_size=10, num_hidden_layers=1)
    assert bytes_per_token(no_mlp_size, 4) == (6 * 40 + 18 * 10) * 4


def test_forwarded_tokens_count_padding_and_the_shared_prompt_once() -> None:
    a = seq([1, 2, 3, 4, 5, 6], trained_from=4)  # prompt [1, 2, 3, 4]
    b = seq([1, 2, 3, 4, 7, 8, 9, 9], trained_from=4)
    c = seq([1, 2, 5, 5, 5], trained_from=3)
    assert forwarded_tokens([a]) == 6  # a single row shares nothing
    # positions 0..2 can be shared (up to the first trained position less one, as PolicyForward.hidden does)
    assert forwarded_tokens([a, b]) == 3 + 2 * (8 - 3)
    assert forwarded_tokens([a, b, c]) == 2 + 3 * (8 - 2)  # c differs from position 2 on


def test_fit_splits_what_does_not_fit_and_checkpoints_only_a_sequence_too_long_alone() -> None:
    rows = [seq([1] * 10 + [n] * 10, trained_from=10) for n in range(2, 6)]  # 4 rows, a 10-token shared prompt
    assert forwarded_tokens(rows) == 9 + 4 * 11
    assert fit_micro_batches([rows], per_token=1, budget=53) == ([rows], False)  # fits as it is
    fitted, checkpoint = fit_micro_batches([rows], per_token=1, budget=31)  # 2 rows: 9 + 2 x 11 = 31
    assert not checkpoint and fitted == [rows[:2], rows[2:]]
    fitted, checkpoint = fit_micro_batches([rows[:3], rows[3:]], per_token=2, budget=40)  # one row: 20 tokens
    assert not checkpoint and fitted == [[r] for r in rows]
    assert fit_micro_batches([rows], per_token=2, budget=39) == ([rows], True)  # no single row fits: checkpoint
