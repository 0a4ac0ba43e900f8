"""How the prompts of one batch become one prefill: left-padded, and each distinct prompt only once.

A GRPO group's runs all start from the same prompt (and ``n > 1`` repeats one), so a batch often holds few
distinct prompts: those are prefilled, and every row then copies the KV cache (and next-token logits) of its
prompt's row through ``source``. Left padding puts every row's next token in the last column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Prefill:
    input_ids: torch.Tensor  # [U, W]: the U distinct prompts, left-padded to the longest (W)
    mask: torch.Tensor  # [U, W]: 1 on prompt tokens, 0 on padding
    positions: torch.Tensor  # [U, W]: 0.. from each prompt's first token (0 on padding)
    source: list[int]  # for each row of the batch, the index of its prompt among the U
    prompts: list[tuple[int, ...]]  # the U distinct prompts' ids, unpadded

    @property
    def padded(self) -> bool:
        """False when every prompt has the same length: the model then needs no mask (plain causal attention)."""
        return bool((self.mask == 0).any())

    @property
    def shared(self) -> int:
        """How many rows reuse another row's prefill."""
        return len(self.source) - len(self.input_ids)


def build_prefill(prompts: Sequence[Sequence[int]], pad: int, device: Any) -> Prefill:
    """One prefill batch for rows with these prompts (one per row, repeats allowed)."""
    unique: dict[tuple[int, ...], int] = {}
    source = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
    width = max(len(p) for p in unique)
    input_ids = torch.full((len(unique), width), pad, dtype=torch.long)
    mask = torch.zeros((len(unique), width), dtype=torch.long)
    for i, prompt in enumerate(unique):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return Prefill(input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), source, list(unique))


@dataclass
class EngineCounts:
    """The engine's counters: ``prompt_tokens`` sent (each request's prompt once, however many choices it asks for),
    ``prefill_tokens`` actually computed (each distinct prompt of a batch once, less what came from the prefix
    cache), and the worker's seconds in prefill forwards (a batch's first, and requests joining it) and in decode
    steps (sampling included): where a rollout's engine time goes."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
