"""The sampler/trainer mismatch: how far the trainer's logprobs of the sampled tokens are from the sampler's, and
the importance-sampling correction for it (pure functions, hand-checkable).

The sampler's logprobs come from the engine that drew the tokens (the HF engine's kernels, vLLM's, bf16 on a GPU)
and from the policy it served then (``max_steps_off_policy >= 1``: one or more updates ago). The trainer's, before
the step's update, are its own. Their per-token log-ratio ``delta = trainer - sampler`` [B, T] measures both. With
a correction (``importance_sampling_correction``, TRL's ``vllm_importance_sampling_mode`` values) the PPO ratio is
taken against the trainer's own logprobs, and each token's loss is weighted by ``w = exp(delta)``, the importance
weight of the sampler's draw under the trainer's policy (decoupled PPO: the behaviour policy is the sampler's, the
proximal policy the trainer's), bounded:

- ``token_truncate``: ``min(w_t, cap)`` per token (truncated importance sampling, TIS).
- ``token_mask``: ``w_t`` where ``1/cap <= w_t <= cap``, else 0: the token teaches nothing (masked IS, MIS).
- ``sequence_truncate`` / ``sequence_mask``: the same with one weight per trained sequence, the product of its
  tokens' ratios (``exp`` of the sum of ``delta`` over the row's trained tokens).
- ``none``: no weight; the PPO ratio is against the sampler's logprobs, so the clip absorbs the mismatch as if it
  were policy change.

A masked token stays in the loss's normaliser (as TRL does): masking lowers the step's gradient, it does not
re-weight the tokens left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from langgraph_art.train.loss import kl_k3

ImportanceSamplingCorrection = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


MISMATCH_SUMS = ("tokens", "log_ratio", "abs_log_ratio", "kl", "beyond", "weight", "masked")  # Mismatch's sums


@dataclass(frozen=True)
class Mismatch:
    """Sums over the trained tokens of a micro-batch (sums, so micro-batches and ranks add up; ``abs_max`` is a
    maximum). ``beyond``: tokens whose ratio ``exp(delta)`` is outside ``[1/cap, cap]``; ``weight``: the sum of
    the importance weights the loss used (``tokens`` without a correction); ``masked``: tokens weighted 0."""

    tokens: float
    log_ratio: float
    abs_log_ratio: float
    abs_max: float
    kl: float
    beyond: float
    weight: float
    masked: float


def importance_weights(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: ImportanceSamplingCorrection,
    cap: float,
) -> tuple[torch.Tensor | None, Mismatch]:
    """The weight of each token's loss [B, T] (detached; None for ``mode="none"``) and the mismatch's statistics.

    trainer_logprobs: [B, T], the trainer's logprobs of the sampled tokens before the step's update (no grad
    needed); sampler_logprobs: [B, T], the sampler's; mask: [B, T], 1 on trained tokens; cap > 1.
    """
    with torch.no_grad():
        mask = mask.to(torch.float32)
        delta = (trainer_logprobs.float() - sampler_logprobs.float()) * mask  # [B, T]; 0 off the mask
        log_cap = math.log(cap)
        trained = mask.bool()
        weights = None
        if mode != "none":
            log_w = delta.sum(-1, keepdim=True).expand_as(delta) if mode.startswith("sequence") else delta  # [B, T]
            if mode.endswith("truncate"):
                weights = torch.exp(log_w.clamp(max=log_cap))  # [B, T]
            elif mode.endswith("mask"):
                inside = log_w.abs() <= log_cap
                weights = torch.where(inside, torch.exp(log_w.clamp(-log_cap, log_cap)), torch.zeros_like(log_w))
            else:
                raise ValueError(
                    f"unknown importance_sampling_correction {mode!r}; use none, token_truncate, token_mask, "
                    "sequence_truncate or sequence_mask"
                )
            weights = weights * mask
        stats = Mismatch(
            tokens=float(mask.sum()),
            log_ratio=float(delta.sum()),
            abs_log_ratio=float(delta.abs().sum()),
            abs_max=float(delta.abs().max()) if delta.numel() else 0.0,
            # KL(sampler || trainer); in float64, where exp(d) - d - 1 of a float32 d ~1e-6 rounds below 0
            kl=float((kl_k3(sampler_logprobs.double(), trainer_logprobs.double()) * mask).sum()),
            beyond=float(((delta.abs() > log_cap) & trained).sum()),
            weight=float(weights.sum()) if weights is not None else float(mask.sum()),
            masked=float(((weights == 0) & trained).sum()) if weights is not None else 0.0,
        )
    return weights, stats


def mismatch_metrics(sums: dict[str, float], abs_max: float, corrected: bool) -> dict[str, float]:
    """The step's ``train/mismatch/*`` metrics (and ``train/sampler_logprob_gap``, the mean absolute gap) from its
    micro-batches' ``Mismatch`` sums (``MISMATCH_SUMS``) and largest ``abs_max``; the weights' own with a correction
    (``corrected``)."""
    tokens = max(sums["tokens"], 1.0)
    metrics = {
        "train/sampler_logprob_gap": sums["abs_log_ratio"] / tokens,  # mean |trainer - sampler| logprob
        "train/mismatch/log_ratio": sums["log_ratio"] / tokens,  # mean trainer - sampler logprob (signed)
        "train/mismatch/abs_max": abs_max,
        "train/mismatch/kl": sums["kl"] / tokens,  # KL(sampler || trainer) per token, k3 estimate
        "train/mismatch/beyond_cap": sums["beyond"] / tokens,  # share of tokens whose ratio is outside [1/cap, cap]
    }
    if corrected:
        metrics["train/mismatch/is_weight"] = sums["weight"] / tokens  # mean importance weight the loss used
        metrics["train/mismatch/masked"] = sums["masked"] / tokens  # share of tokens the correction weighted 0
    return metrics
