"""Pure sampling math for the HF engine (torch). Shapes: B = rows in the batch, V = vocabulary size.

The logprob reported for a token is taken under the distribution it was sampled from: logits outside a row's
grammar mask at -inf, divided by the row's temperature, top-p mask applied (masked tokens at -inf), then
``log_softmax``. For greedy rows (temperature 0) it is the raw (grammar-masked) ``log_softmax(logits)``, as vLLM
reports it.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def process_logits(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities of the sampling distribution of each row.

    logits: [B, V] float; temperature: [B] (0 = greedy); top_p: [B] in (0, 1]; allowed: [B, V] bool, the tokens a
    grammar lets each row sample (None: all), the others at -inf before anything else. Returns [B, V] float32.
    """
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)  # [B, 1]
    scaled = logits.float() / scale  # [B, V], a new tensor
    if allowed is not None:
        scaled.masked_fill_(~allowed, float("-inf"))
    logprobs = torch.log_softmax(scaled, dim=-1)  # [B, V]
    needs_top_p = (top_p < 1.0) & ~greedy
    if bool(needs_top_p.any()):
        logprobs = _apply_top_p(logprobs, top_p, needs_top_p)
    return logprobs


def _apply_top_p(logprobs: torch.Tensor, top_p: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise. [B, V] -> [B, V]."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)  # [B, V]
    probs = sorted_lp.exp()
    mass_before = probs.cumsum(dim=-1) - probs  # [B, V] mass strictly above each token
    drop_sorted = (mass_before >= top_p.unsqueeze(-1)) & rows.unsqueeze(-1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    masked = logprobs.masked_fill(drop, float("-inf"))
    return torch.log_softmax(masked, dim=-1)


def sample_tokens(
    logprobs: torch.Tensor,
    greedy: torch.Tensor,
    generators: list[random.Random | None],
    default_generator: torch.Generator,
) -> torch.Tensor:
    """One token per row by inverse-CDF sampling. logprobs: [B, V]; greedy: [B] bool; generators: B entries.

    Each row needs one uniform number per step. Rows with their own ``random.Random`` (a request ``seed``) take it
    from there, so they reproduce whatever else shares the batch; the others share one batched draw from
    ``default_generator``. Then a single batched ``searchsorted`` on the cumulative probabilities picks the token
    (u is in (0, total], so a token of probability zero is never picked).
    """
    probs = logprobs.exp()  # [B, V]
    cdf = probs.cumsum(dim=-1)  # [B, V]
    uniform = 1.0 - torch.rand(probs.shape[0], generator=default_generator, device=probs.device)  # [B] in (0, 1]
    if any(gen is not None for gen in generators):  # one tensor built from the rows' own draws, not B writes
        seeded = torch.tensor([gen is not None for gen in generators], device=probs.device)
        own = torch.tensor([1.0 - gen.random() if gen is not None else 1.0 for gen in generators])
        uniform = torch.where(seeded, own.to(uniform), uniform)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    tokens = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=probs.shape[-1] - 1)  # [B]
    if not bool(greedy.any()):
        return tokens
    return torch.where(greedy, logprobs.argmax(dim=-1), tokens)


def finite_top(ids: list[int], values: list[float]) -> list[tuple[int, float]]:
    """One row's top-k as (id, logprob) pairs without the tokens the sampler could not pick (-inf: outside top-p or
    the grammar), which JSON cannot carry anyway."""
    return [(i, v) for i, v in zip(ids, values, strict=True) if v != float("-inf")]


def top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[Any, Any]:
    """The k most likely tokens per row: (values [B, k], ids [B, k]); empty when k == 0."""
    k = max(0, min(k, logprobs.shape[-1]))
    values, ids = logprobs.topk(k, dim=-1)
    return values, ids
