"""``PolicyForward``: the trainer's forward pass, logprobs (and entropy) of the sampled tokens of a micro-batch without
ever building its [batch, tokens, vocabulary] logits.

The model runs as its body (the decoder, hidden states) and its LM head apart: the head runs in chunks
(``chunk_size`` tokens), and with ``trained`` only on the positions that are trained (not on padding, prompts in
between or tool results). For 150k vocabularies and 8k-token runs the full logits would be ~5 GB per sequence in
float32. A GRPO group's runs share their prompt: that prefix goes through the body once (``hidden``). Models that
post-process their logits (a soft cap, a logit scale) take the whole forward, sliced with ``logits_to_keep``.
Which adapter is active is the caller's (``GRPOTrainer.adapter()``; the base model for the KL reference).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from langgraph_art.models.loading import cache_argument, cache_of
from langgraph_art.train.batches import MIN_SHARED_PREFIX, shared_prefix
from langgraph_art.train.loss import (
    GrammarMasks,
    chunk_tokens,
    chunked_logprobs_and_entropy,
    token_logprobs_and_entropy,
)


class PolicyForward:
    """The forward of ``model`` (a transformers causal LM) as the RL step and SFT use it."""

    def __init__(self, model: Any, autocast: torch.dtype | None = None) -> None:
        self.model = model
        # the body's matmuls in this dtype (CPU autocast over float32 weights: models/precision.py); the LM head and
        # the logprobs stay in the weights' dtype (a bfloat16 logit of 20 is off by up to 0.06)
        self.autocast = autocast
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        # the LM head run in chunks over the body's hidden states; not for models that post-process their logits
        plain_head = not any(getattr(model.config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
        self.body: Any = model.get_decoder() if plain_head else None
        self.head: Any = model.get_output_embeddings() if plain_head else None
        self.body_cache_kwarg = cache_argument(self.body) if self.body is not None else ""

    def token_logprobs(
        self,
        ids: torch.Tensor,
        first: int,
        targets: torch.Tensor,
        temp: torch.Tensor,
        masks: GrammarMasks | None = None,
        *,
        trained: torch.Tensor | None = None,
        share_prefix: bool = True,
        chunk_size: int | None = None,
        apply_masks: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logprobs (with grad), entropy and log_mass (detached) [B, T-first] of ``targets`` = ``ids[:, first:]``
        (under the grammar's mask where ``masks`` says and ``apply_masks``). The LM head runs only on positions
        ``first-1 .. T-2``, and with ``trained`` [B, T-first] (bool) only on those positions (0 elsewhere).
        ``share_prefix``: run the rows' common prefix once (not under gradient checkpointing, which turns the KV
        cache off)."""
        if self.body is None or self.head is None:  # a model that post-processes its logits: the whole forward
            with self._autocast():
                logits = self.logits(ids, first)  # [B, T-first, V]
            logits = logits.float() if self.autocast is not None else logits
            allowed = masks.dense(0, targets.shape[1], targets.shape[0], logits.shape[-1]) if masks else None
            return token_logprobs_and_entropy(logits, targets, temp, allowed, apply_masks)
        with self._autocast():
            hidden = self.hidden(ids, first, share_prefix)  # [B, T-first, H]: position t predicts token t+1
        hidden = hidden.to(self.head.weight.dtype)
        if trained is None:
            chunk = chunk_tokens(ids.shape[0], self.head.out_features, chunk_size)
            return chunked_logprobs_and_entropy(hidden, self.head, targets, temp, chunk, masks, apply_masks)
        rows, cols = trained.nonzero(as_tuple=True)  # the N trained positions, as one row: [1, N, ...]
        chunk = chunk_tokens(1, self.head.out_features, chunk_size)
        picked = masks.gathered(rows, cols) if masks is not None else None
        out = chunked_logprobs_and_entropy(
            hidden[rows, cols][None], self.head, targets[rows, cols][None], temp[rows][None], chunk, picked, apply_masks
        )
        return tuple(  # type: ignore[return-value]
            torch.zeros(targets.shape, dtype=part.dtype, device=part.device).index_put((rows, cols), part[0])
            for part in out
        )

    def _autocast(self) -> Any:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.model.device.type, dtype=self.autocast)

    def hidden(self, ids: torch.Tensor, first: int, share_prefix: bool = True) -> torch.Tensor:
        """The final hidden states [B, T-first, H] of positions ``first-1 .. T-2`` (those predicting tokens
        ``first .. T-1``). No attention mask: see ``batches.batch_tensors``.

        A GRPO group's runs all start with the same prompt. The tokens every row starts with (before the first
        trained one) go through the model once; each row's KV cache is a copy of that one's, and the rest of the
        rows runs on top of it. Gradients flow back through the copies into the shared forward, so the result is
        the full forward's (tested), at a fraction of the cost when the prompt is long."""
        assert self.body is not None
        rows, width = ids.shape
        shared = shared_prefix(ids, first - 1) if share_prefix and rows > 1 else 0
        if shared < MIN_SHARED_PREFIX:
            return self.body(input_ids=ids, use_cache=False).last_hidden_state[:, first - 1 : -1]
        prefix = self.body(input_ids=ids[:1, :shared], use_cache=True)
        cache = cache_of(prefix)
        cache.batch_repeat_interleave(rows)  # [1, ...] -> [B, ...] per layer, differentiable
        positions = torch.arange(shared, width, device=ids.device).expand(rows, -1)
        out = self.body(input_ids=ids[:, shared:], position_ids=positions, **{self.body_cache_kwarg: cache})
        return out.last_hidden_state[:, first - 1 - shared : -1]

    def logits(self, ids: torch.Tensor, first: int) -> torch.Tensor:
        """Logits [B, T-first, V] of positions ``first-1 .. T-2`` through the whole model (``logits_to_keep``)."""
        if not self.keeps_logits:
            return self.model(input_ids=ids).logits[:, first - 1 : -1]
        return self.model(input_ids=ids, logits_to_keep=ids.shape[1] - first + 1).logits[:, :-1]
