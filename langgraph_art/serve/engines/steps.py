"""The two ways the HF engine runs a batch's forwards, behind one small interface.

``prefill`` feeds the batch's prompts (each distinct prompt once, see ``prefill.py``) and returns next-token
logits for every row; ``decode`` feeds one sampled token per row; ``select`` keeps the rows still generating.
``HFSteps`` calls the transformers model (any architecture, and adapters peft serves unmerged); ``FastSteps``
calls ``FastLM`` (Llama-family models with the base weights, a merged adapter or an unmerged ``FastLora``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from langgraph_art.models.loading import cache_of
from langgraph_art.serve.engines.fast import FastCache, FastLM, FastLora
from langgraph_art.serve.engines.prefill import Prefill


class Steps(Protocol):
    def prefill(self, batch: Prefill) -> torch.Tensor: ...  # [B, V]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...  # [B] -> [B, V]

    def select(self, index: torch.Tensor) -> None: ...  # keep rows ``index`` [B']


class HFSteps:
    def __init__(self, model: Any, cache_kwarg: str) -> None:
        self.model, self.cache_kwarg = model, cache_kwarg
        self.cache: Any = None
        self.mask = self.next_pos = torch.empty(0)
        self.padded = False

    def prefill(self, batch: Prefill) -> torch.Tensor:
        self.padded = batch.padded
        out = self.model(
            input_ids=batch.input_ids,
            attention_mask=batch.mask if self.padded else None,
            position_ids=batch.positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = cache_of(out)
        logits, self.mask, positions = out.logits[:, -1, :], batch.mask, batch.positions  # [U, V], [U, W], [U, W]
        if batch.shared:  # one cache row (and logits row) per sample, copied from its prompt's
            index = torch.tensor(batch.source, device=logits.device)
            self.cache.batch_select_indices(index)
            logits, self.mask, positions = logits[index], self.mask[index], positions[index]
        self.next_pos = positions[:, -1:] + 1  # [B, 1]
        return logits

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        out = self.model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.mask if self.padded else None,
            position_ids=self.next_pos,
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.cache, self.next_pos = cache_of(out), self.next_pos + 1
        return out.logits[:, -1, :]

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]


class FastSteps:
    def __init__(self, fast: FastLM, max_new: int, lora: FastLora | None = None) -> None:
        self.fast, self.max_new, self.lora = fast, max_new, lora
        self.cache: FastCache | None = None
        self.next_pos = torch.empty(0)

    def prefill(self, batch: Prefill) -> torch.Tensor:
        rows, width = batch.input_ids.shape
        self.cache = cache = self.fast.new_cache(rows, width + min(self.max_new, 256))  # grows if needed
        logits = self.fast.forward(batch.input_ids, batch.positions, batch.mask.bool(), cache, self.lora)  # [U, V]
        self.next_pos = batch.positions[:, -1:] + 1  # [U, 1]
        if batch.shared:
            index = torch.tensor(batch.source, device=logits.device)
            cache.select(index)
            logits, self.next_pos = logits[index], self.next_pos[index]
        return logits

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None, "prefill first"
        valid = torch.ones_like(tokens, dtype=torch.bool).unsqueeze(-1)
        logits = self.fast.forward(tokens.unsqueeze(-1), self.next_pos, valid, self.cache, self.lora)
        self.next_pos = self.next_pos + 1
        return logits

    def select(self, index: torch.Tensor) -> None:
        assert self.cache is not None, "prefill first"
        self.cache.select(index)
        self.next_pos = self.next_pos[index]
