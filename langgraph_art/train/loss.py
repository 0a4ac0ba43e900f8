"""Policy-gradient losses for GRPO-style training: pure functions, shape comments, detached statistics.

Shapes: B = sequences in the micro-batch, T = tokens per sequence (padded). ``mask`` is 1 on sampled tokens
that are trained on and 0 elsewhere (prompt, tool results, padding, untrainable nodes).

``loss_type``:
- ``"grpo"``: PPO clipped objective, mean over each sequence's tokens, then mean over sequences (DeepSeekMath).
- ``"dr_grpo"``: the same objective summed over tokens and divided by a constant (``B * max_tokens``): no length
  bias (Dr. GRPO, Liu et al. 2025).
- ``"bnpo"``: summed over tokens and divided by the number of trained tokens in the batch.
- ``"cispo"``: REINFORCE with the importance weight clipped from above and detached (MiniMax-M1):
  ``-sg(min(r, 1 + epsilon_high)) * A * logp``, normalised like ``bnpo``.
- ``"gspo"``: one importance ratio per sequence, the geometric mean of its token ratios, clipped (Qwen GSPO).

The importance ratio is against the sampler's logprobs (the ones returned with each token), so drift between the
inference engine and the trainer is corrected as well as policy change within a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.utils.checkpoint

LossType = Literal["grpo", "dr_grpo", "bnpo", "cispo", "gspo"]


@dataclass(frozen=True)
class LossStats:
    """Detached statistics over trained tokens."""

    clip_fraction: float
    ratio_mean: float
    kl: float
    tokens: int


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where nothing is masked in."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate ``exp(ref - logp) - (ref - logp) - 1`` (always >= 0). [B, T]"""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: LossType = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss to minimise for one micro-batch.

    logprobs: [B, T] under the current policy (with grad); old_logprobs: [B, T] from the sampler; advantages:
    [B, T] (per token, so different nodes of one run can carry different credit) or [B]; mask: [B, T] float.
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)  # [B] -> [B, T]
    high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = (logprobs - old_logprobs) * mask  # [B, T]; zero off the mask keeps exp() finite there
    if loss_type == "gspo":
        seq_log_ratio = masked_mean(log_ratio, mask, dim=-1)  # [B]
        # token-level form whose gradient equals the sequence-level one: sg(s) * exp(logp - sg(logp))
        ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach())  # [B, T]
    else:
        ratio = torch.exp(log_ratio)  # [B, T]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high)
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=1 + high).detach() * advantages * logprobs  # [B, T]
    else:
        per_token = -torch.minimum(ratio * advantages, clipped * advantages)  # [B, T]
    kl = kl_k3(logprobs, ref_logprobs) if ref_logprobs is not None else torch.zeros_like(logprobs)
    if beta:
        per_token = per_token + beta * kl

    if loss_type in ("grpo", "gspo"):
        loss = masked_mean(masked_mean(per_token, mask, dim=-1), (mask.sum(-1) > 0).to(mask.dtype))
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (logprobs.shape[0] * (max_tokens or logprobs.shape[1]))
    elif loss_type in ("bnpo", "cispo"):
        loss = masked_mean(per_token, mask)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; use grpo, dr_grpo, bnpo, cispo or gspo")

    with torch.no_grad():
        outside = ((ratio < 1 - epsilon) & (advantages < 0)) | ((ratio > 1 + high) & (advantages > 0))
        stats = LossStats(
            clip_fraction=float(masked_mean(outside.to(mask.dtype), mask)),
            ratio_mean=float(masked_mean(ratio, mask)),
            kl=float(masked_mean(kl, mask)),
            tokens=int(mask.sum()),
        )
    return loss, stats


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log p(target) under ``log_softmax(logits / T)`` — the distribution the sampler drew from.

    logits: [B, T, V] (position t predicts targets[:, t]); targets: [B, T]; temperature: [B] -> [B, T].
    """
    return token_logprobs_and_entropy(logits, targets, temperature)[0]


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both from one ``log_softmax``: logprobs of the targets [B, T] (with grad) and the entropy [B, T] (detached)."""
    scaled = logits.float() / temperature.clamp(min=1e-6).view(-1, 1, 1)
    logp = torch.log_softmax(scaled, dim=-1)  # [B, T, V]
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ent = -(logp.exp() * logp).sum(-1)
    return chosen, ent


def entropy(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the sampling distribution. logits: [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float() / temperature.clamp(min=1e-6).view(-1, 1, 1), dim=-1)
    return -(logp.exp() * logp).sum(-1)


LOGITS_PER_CHUNK = 2**26  # 256 MB of float32 logits: the default budget of one LM-head chunk


def chunk_tokens(rows: int, vocab: int, chunk_size: int | None = None) -> int:
    """Tokens per LM-head chunk: ``chunk_size``, or as many as keep ``rows x tokens x vocab`` <= LOGITS_PER_CHUNK."""
    return chunk_size or max(1, LOGITS_PER_CHUNK // max(1, rows * vocab))


def chunked_logprobs_and_entropy(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    temperature: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs_and_entropy(head(hidden), ...)`` without ever building the whole [B, T, V] logits.

    hidden: [B, T, H] final hidden states (position t predicts targets[:, t]); head: hidden -> logits (the LM
    head); targets: [B, T]; temperature: [B] -> logprobs [B, T] (with grad), entropy [B, T] (detached).

    The tokens go through the head ``chunk`` at a time; under autograd each chunk is checkpointed, so its logits are
    freed after the forward and recomputed in backward: peak memory is one chunk's logits, not the sequence's.
    With one chunk (short sequences) it is the plain computation, no recompute.
    """
    width = hidden.shape[1]
    if width <= chunk:
        return token_logprobs_and_entropy(head(hidden), targets, temperature)

    def one(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs_and_entropy(head(h), t, temperature)

    grad = torch.is_grad_enabled()
    logprobs, entropies = [], []
    for start in range(0, width, chunk):
        h, t = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        if grad:
            lp, ent = torch.utils.checkpoint.checkpoint(one, h, t, use_reentrant=False)
        else:
            lp, ent = one(h, t)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs, 1), torch.cat(entropies, 1)
