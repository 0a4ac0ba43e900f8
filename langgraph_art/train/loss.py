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

The importance ratio is against ``old_logprobs``: the sampler's (the ones returned with each token), whose drift
from the trainer the clip then absorbs as if it were policy change; or, under a mismatch correction
(``train/mismatch.py``), the trainer's own before the step's update, with each token's term weighted by its
bounded importance weight (``weights``).

Tokens sampled under a grammar (structured output, forced tool calls) were drawn from the policy renormalised over
the tokens the grammar allowed. ``GrammarMasks`` says where and what; with it the logprobs are taken under the same
masked distribution (``mask_logprobs=True``), so the ratio starts at 1 and a forced token (one allowed) has logprob
0 and no gradient. Either way ``log_mass`` reports the log of the probability the policy put inside the mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.utils.checkpoint

from langgraph_art.models.grammar import unpack

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
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss to minimise for one micro-batch.

    logprobs: [B, T] under the current policy (with grad); old_logprobs: [B, T], the policy the ratio is taken
    against (the sampler's, or the trainer's own before the step's update under a mismatch correction);
    advantages: [B, T] (per token, so different nodes of one run can carry different credit) or [B]; mask: [B, T]
    float; weights: [B, T] detached importance weights of each token's policy term (``train/mismatch.py``), or None.
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
    if weights is not None:  # the sampler's draw re-weighted to the trainer's policy; the KL term is not
        per_token = per_token * weights
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


@dataclass(frozen=True)
class GrammarMasks:
    """The micro-batch's tokens sampled under a grammar: target ``rows`` and ``cols`` [N] (column t is ``targets[:,
    t]``) and the tokens the grammar allowed there, ``packed`` [N, W] int32 (``models.grammar``'s layout)."""

    rows: torch.Tensor
    cols: torch.Tensor
    packed: torch.Tensor

    def dense(self, start: int, end: int, batch: int, vocab: int) -> torch.Tensor | None:
        """Allowed tokens of target columns ``start .. end-1``: [B, end-start, V] bool, all True where no grammar
        applies; None when none applies in that range."""
        inside = (self.cols >= start) & (self.cols < end)
        if not bool(inside.any()):
            return None
        allowed = torch.ones((batch, end - start, vocab), dtype=torch.bool, device=self.packed.device)
        allowed[self.rows[inside], self.cols[inside] - start] = unpack(self.packed[inside], vocab)
        return allowed

    def gathered(self, rows: torch.Tensor, cols: torch.Tensor) -> GrammarMasks | None:
        """These masks for the positions ``(rows[i], cols[i])`` [N] laid out as one row (column i): what the
        trainer gives the LM head when it runs on the trained positions only. Masks elsewhere are dropped; None when
        none is left."""
        width = int(torch.maximum(self.cols.max(), cols.max())) + 1 if len(cols) else 0
        where = torch.full((int(max(self.rows.max(), rows.max())) + 1, width), -1, dtype=torch.long)
        where = where.to(self.rows.device)
        where[rows, cols] = torch.arange(len(rows), device=rows.device)
        column = where[self.rows, self.cols]  # [M]: each mask's column among the gathered positions, -1 if none
        kept = column >= 0
        if not bool(kept.any()):
            return None
        return GrammarMasks(torch.zeros_like(column[kept]), column[kept], self.packed[kept])


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log p(target) under ``log_softmax(logits / T)`` — the distribution the sampler drew from.

    logits: [B, T, V] (position t predicts targets[:, t]); targets: [B, T]; temperature: [B] or [B, T] -> [B, T].
    """
    return token_logprobs_and_entropy(logits, targets, temperature)[0]


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    allowed: torch.Tensor | None = None,
    mask_logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logprobs of the targets [B, T] (with grad), the entropy [B, T] (detached) and ``log_mass`` [B, T] (detached).

    allowed: [B, T, V] bool, the tokens a grammar allowed at each position (None: no grammar anywhere). With
    ``mask_logprobs`` the logprobs and entropy are of ``log_softmax`` over the allowed tokens only (what the sampler
    drew from); without, of the whole vocabulary. ``log_mass``: log of the probability the policy puts on the allowed
    tokens (0 where everything is allowed), ``full - masked`` logprob of the target.
    """
    temperature = temperature.clamp(min=1e-6)  # [B], or [B, T] for a temperature per position
    scaled = logits.float() / (temperature.view(-1, 1, 1) if temperature.dim() == 1 else temperature.unsqueeze(-1))
    logp = torch.log_softmax(scaled, dim=-1)  # [B, T, V]
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if allowed is None:
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)
        return chosen, ent, torch.zeros_like(chosen.detach())
    masked_logp = torch.log_softmax(scaled.masked_fill(~allowed, float("-inf")), dim=-1)  # [B, T, V]
    masked_chosen = masked_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        log_mass = chosen - masked_chosen
        if mask_logprobs:  # 0 * -inf is nan: the tokens outside the mask add nothing
            ent = -torch.where(allowed, masked_logp.exp() * masked_logp, 0.0).sum(-1)
        else:
            ent = -(logp.exp() * logp).sum(-1)
    return (masked_chosen if mask_logprobs else chosen), ent, log_mass


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
    masks: GrammarMasks | None = None,
    mask_logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``token_logprobs_and_entropy(head(hidden), ...)`` without ever building the whole [B, T, V] logits.

    hidden: [B, T, H] final hidden states (position t predicts targets[:, t]); head: hidden -> logits (the LM
    head); targets: [B, T]; temperature: [B] or [B, T]; masks: where a grammar constrained the targets -> logprobs
    [B, T] (with grad), entropy [B, T] and log_mass [B, T] (detached).

    The tokens go through the head ``chunk`` at a time; under autograd each chunk is checkpointed, so its logits are
    freed after the forward and recomputed in backward: peak memory is one chunk's logits, not the sequence's.
    With one chunk (short sequences) it is the plain computation, no recompute.
    """
    rows, width = targets.shape

    def one(h: torch.Tensor, t: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = head(h)  # [B, c, V]
        allowed = masks.dense(start, start + t.shape[1], rows, logits.shape[-1]) if masks is not None else None
        temp = temperature if temperature.dim() == 1 else temperature[:, start : start + t.shape[1]]
        return token_logprobs_and_entropy(logits, t, temp, allowed, mask_logprobs)

    if width <= chunk:
        return one(hidden, targets, 0)
    grad = torch.is_grad_enabled()
    parts = []
    for start in range(0, width, chunk):
        h, t = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        if grad:
            parts.append(torch.utils.checkpoint.checkpoint(one, h, t, start, use_reentrant=False))
        else:
            parts.append(one(h, t, start))
    logprobs, entropies, masses = zip(*parts, strict=True)
    return torch.cat(logprobs, 1), torch.cat(entropies, 1), torch.cat(masses, 1)
