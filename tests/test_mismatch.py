"""The sampler/trainer mismatch and its importance-sampling corrections, against values computed by hand; and in
the trainer: a sampler logprob perturbed by hand is bounded or masked as documented."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.config import GRPOConfig  # noqa: E402
from langgraph_art.errors import ConfigError  # noqa: E402
from langgraph_art.train.loss import policy_loss  # noqa: E402
from langgraph_art.train.mismatch import importance_weights  # noqa: E402
from tests.helpers import recorded_gradients  # noqa: E402

L = math.log


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# row 0: trainer - sampler = [0, ln 4, -ln 3] (ratios 1, 4, 1/3); row 1: [ln 3, ln 3] then a padded column
TRAINER = t([-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0])
SAMPLER = t([-1.0, -1.0 - L(4), -1.0 + L(3)], [-2.0 - L(3), -2.0 - L(3), -5.0])
MASK = t([1, 1, 1], [1, 1, 0])


def weights(mode: str, cap: float = 2.0) -> list[list[float]]:
    w, _ = importance_weights(TRAINER, SAMPLER, MASK, mode, cap)  # type: ignore[arg-type]
    assert w is not None
    return w.tolist()


def test_token_truncate_bounds_each_ratio_from_above() -> None:
    assert weights("token_truncate") == [pytest.approx([1.0, 2.0, 1 / 3]), pytest.approx([2.0, 2.0, 0.0])]


def test_token_mask_zeroes_ratios_outside_the_range() -> None:
    # 4 > 2 and 1/3 < 1/2: masked; 3 > 2 too
    assert weights("token_mask") == [pytest.approx([1.0, 0.0, 0.0]), pytest.approx([0.0, 0.0, 0.0])]
    assert weights("token_mask", cap=5.0) == [pytest.approx([1.0, 4.0, 1 / 3]), pytest.approx([3.0, 3.0, 0.0])]


def test_sequence_modes_use_the_product_of_the_rows_ratios() -> None:
    # row 0: 1 * 4 * 1/3 = 4/3 (inside [1/2, 2]); row 1: 3 * 3 = 9 (the padded column is not part of it)
    assert weights("sequence_truncate") == [pytest.approx([4 / 3] * 3), pytest.approx([2.0, 2.0, 0.0])]
    assert weights("sequence_mask") == [pytest.approx([4 / 3] * 3), pytest.approx([0.0, 0.0, 0.0])]


def test_the_mismatch_statistics_by_hand() -> None:
    none, stats = importance_weights(TRAINER, SAMPLER, MASK, "none", 2.0)
    assert none is None
    deltas = [0.0, L(4), -L(3), L(3), L(3)]
    assert stats.tokens == 5
    assert stats.log_ratio == pytest.approx(sum(deltas))
    assert stats.abs_log_ratio == pytest.approx(sum(abs(d) for d in deltas))
    assert stats.abs_max == pytest.approx(L(4))
    assert stats.kl == pytest.approx(sum(math.exp(d) - d - 1 for d in deltas))  # k3 of KL(sampler || trainer)
    assert stats.beyond == 4  # all but the first: ratios 4, 1/3, 3, 3 are outside [1/2, 2]
    assert stats.weight == 5 and stats.masked == 0
    _, masked = importance_weights(TRAINER, SAMPLER, MASK, "token_mask", 2.0)
    assert masked.weight == pytest.approx(1.0) and masked.masked == 4


def test_equal_logprobs_weigh_one_and_show_no_mismatch() -> None:
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        w, stats = importance_weights(TRAINER, TRAINER.clone(), MASK, mode, 2.0)  # type: ignore[arg-type]
        assert w is not None and w.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
        assert stats.abs_max == stats.kl == stats.beyond == stats.masked == 0


def test_the_loss_weights_each_tokens_policy_term_and_not_the_kl() -> None:
    logp = t([L(0.5), L(0.25)]).requires_grad_()
    w = t([2.0, 0.0])
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, _ = policy_loss(logp, logp.detach().clone(), adv, t([1, 1]), weights=w)
    assert loss.item() == pytest.approx(-(2.0 + 0.0) / 2)  # on-policy ratio 1: -A * w, mean over the row
    loss.backward()
    assert logp.grad is not None and logp.grad[0].tolist() == pytest.approx([-1.0, 0.0])  # -A * w / tokens
    ref = t([L(0.25), L(0.25)])
    with_kl, _ = policy_loss(logp.detach(), logp.detach(), adv, t([1, 1]), weights=w, beta=0.5, ref_logprobs=ref)
    k3 = math.exp(L(0.25) - L(0.5)) - (L(0.25) - L(0.5)) - 1  # the first token's; the second's is 0
    assert with_kl.item() == pytest.approx((-2.0 + 0.5 * k3 + 0.0) / 2)


def test_the_config_names_the_modes_and_checks_the_cap() -> None:
    assert GRPOConfig().importance_sampling_correction == "token_truncate"
    with pytest.raises(ConfigError, match=r"importance_sampling_cap=1\.0: the importance weights' bound must be > 1"):
        GRPOConfig(importance_sampling_cap=1.0)
    with pytest.raises(ConfigError, match="importance_sampling_correction="):
        GRPOConfig(importance_sampling_correction="tis")  # type: ignore[arg-type]


# -- in the trainer: one sampled token's logprob moved by hand ------------------------------------------------------


def perturbed_step(tiny_path: Path, tmp_path: Path, mode: str, shift: float) -> tuple[dict[str, float], list]:
    """One step on the tiny model's own samples (sampler == trainer), with run 0's first sampled token's sampler
    logprob lowered by ``shift`` (its ratio trainer/sampler becomes exp(shift)); the metrics and the gradients."""
    from langgraph_art.train.trainer import GRPOTrainer
    from tests.test_trainer import make_group

    config = GRPOConfig(learning_rate=1e-2, importance_sampling_correction=mode, importance_sampling_cap=2.0)  # type: ignore[arg-type]
    trainer = GRPOTrainer(str(tiny_path), config, checkpoint_dir=tmp_path / f"{mode}-{shift}")
    group = make_group(trainer, [1.0, 0.0, 0.5, 0.25])
    turn = group.trajectories[0].spans[0].turns[0]
    assert turn.logprobs is not None
    turn.logprobs[0] -= shift
    grads = recorded_gradients(trainer)
    result = trainer.step([group])
    assert result.updated
    return result.metrics, grads


def test_a_perturbed_sampler_logprob_is_measured_and_bounded_or_masked(tiny_path: Path, tmp_path: Path) -> None:
    tokens = 32  # 4 runs x 8 sampled tokens
    exact, exact_grads = perturbed_step(tiny_path, tmp_path, "token_truncate", 0.0)
    assert exact["train/mismatch/abs_max"] < 1e-4 and exact["train/mismatch/beyond_cap"] == 0
    assert exact["train/mismatch/is_weight"] == pytest.approx(1.0, abs=1e-4)
    truncated, truncated_grads = perturbed_step(tiny_path, tmp_path, "token_truncate", L(8))
    assert truncated["train/mismatch/abs_max"] == pytest.approx(L(8), abs=1e-4)
    assert truncated["train/mismatch/log_ratio"] == pytest.approx(L(8) / tokens, abs=1e-4)
    assert truncated["train/mismatch/kl"] == pytest.approx((8 - L(8) - 1) / tokens, abs=1e-4)
    assert truncated["train/mismatch/beyond_cap"] == pytest.approx(1 / tokens)
    assert truncated["train/mismatch/is_weight"] == pytest.approx((tokens - 1 + 2) / tokens, abs=1e-4)  # 8 -> 2
    assert truncated["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # to the trainer's own logprobs
    masked, _ = perturbed_step(tiny_path, tmp_path, "token_mask", L(8))
    assert masked["train/mismatch/masked"] == pytest.approx(1 / tokens)
    assert masked["train/mismatch/is_weight"] == pytest.approx((tokens - 1) / tokens, abs=1e-4)
    uncorrected, _ = perturbed_step(tiny_path, tmp_path, "none", L(8))
    assert "train/mismatch/is_weight" not in uncorrected
    assert uncorrected["train/ratio_mean"] == pytest.approx((tokens - 1 + 8) / tokens, abs=1e-3)  # to the sampler's
    # the one weighted token changes the update: its term counts twice, not eight times
    assert any((a - b).abs().max() > 1e-7 for a, b in zip(exact_grads, truncated_grads, strict=True))
