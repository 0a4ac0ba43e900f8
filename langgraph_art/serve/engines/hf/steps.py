"""The two ways the HF engine runs a batch's forwards, behind one small interface.

``prefill`` feeds the batch's prompts (each distinct prompt once, see ``prefill.py``) and returns next-token
logits for every row; ``decode`` feeds one sampled token per row; ``select`` keeps the rows still generating;
``join`` prefills more prompts while others are decoding and appends their rows (continuous batching, see
``batch.py``): the new rows' KV cache is right-aligned with the running one, padded on the left, which the
attention mask hides, and each row keeps its own positions, so the running rows compute what they did before.
``HFSteps`` calls the transformers model (any architecture, and adapters peft serves unmerged); ``FastSteps``
calls ``FastLM`` (Llama-family models with the base weights, a merged adapter or an unmerged ``FastLora``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

import torch
from transformers.cache_utils import DynamicLayer

from langgraph_art.models.loading import cache_of
from langgraph_art.serve.engines.hf.fast import FastLM, FastLora
from langgraph_art.serve.engines.hf.kv_cache import FastCache
from langgraph_art.serve.engines.hf.prefill import EngineCounts, Prefill
from langgraph_art.serve.engines.hf.prefix_cache import ColumnsKV, PrefixCache

# FastSteps.prefill: a batch of distinct prompts whose padded forward would be at least this large (rows x width x
# hidden) is prefilled prompt by prompt instead (``_prefill_apart``); below, the one padded forward costs less than the
# calls. SmolLM2-135M, 16 BFCL prompts of 225-376 tokens: 19.5 s apart against 30.8 s padded, one thread.
APART_PREFILL_WORK = 2**20
MIN_SHARED_PROMPT = 16  # tokens: a shorter common beginning is prefilled with each prompt
# tokens: rows of a batch that begin with at least this many of the same tokens read them from one shared head
# (``kv_cache.py``, cascade attention); a shorter beginning stays in each row's own columns
MIN_SHARED_HEAD = 256


class Steps(Protocol):
    device: torch.device
    can_join: bool  # False: no rows can be appended while decoding (then batch after batch)
    can_jump: bool  # True: ``decode_many`` feeds several tokens per row (grammar-forced runs, ``batch.py``)

    def prefill(self, batch: Prefill) -> torch.Tensor: ...  # [B, V]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...  # [B] -> [B, V]

    def decode_many(self, tokens: list[list[int]]) -> torch.Tensor: ...  # one or more tokens per row -> [B, V]

    def select(self, index: torch.Tensor) -> None: ...  # keep rows ``index`` [B']

    def join(self, batch: Prefill) -> torch.Tensor: ...  # prefill more rows, appended after the running ones

    def keep(self, row: int, tokens: list[int]) -> None: ...  # row ``row`` finishes: keep its KV for later prompts


class HFSteps:
    can_jump = False

    def __init__(self, model: Any, cache_kwarg: str, counts: EngineCounts | None = None) -> None:
        self.model, self.cache_kwarg = model, cache_kwarg
        self.counts = counts if counts is not None else EngineCounts()
        self.device = model.device
        self.cache: Any = None
        self.mask = self.next_pos = torch.empty(0)
        self.padded = False
        self.can_join = False  # set by prefill: only caches of plain growing layers can be padded and concatenated

    def prefill(self, batch: Prefill) -> torch.Tensor:
        self.padded = batch.padded
        out = self.model(
            input_ids=batch.input_ids,
            attention_mask=batch.mask if self.padded else None,
            position_ids=batch.positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self.counts.prefill_tokens += int(batch.mask.sum())
        self.cache = cache_of(out)
        layers = getattr(self.cache, "layers", None) or []
        self.can_join = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)  # not sliding-window
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

    def decode_many(self, tokens: list[list[int]]) -> torch.Tensor:
        raise NotImplementedError("HFSteps feeds one token per row (can_jump is False)")

    def keep(self, row: int, tokens: list[int]) -> None:
        """No prefix cache on this path (transformers' own cache classes, any architecture)."""

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def join(self, batch: Prefill) -> torch.Tensor:
        new = HFSteps(self.model, self.cache_kwarg, self.counts)
        logits = new.prefill(batch)  # [B', V]
        width = max(self.mask.shape[1], new.mask.shape[1])
        for layer, other in zip(self.cache.layers, new.cache.layers, strict=True):  # [B, heads, S, hd] each
            layer.keys = torch.cat([_left_pad(layer.keys, width, 2), _left_pad(other.keys, width, 2)])
            layer.values = torch.cat([_left_pad(layer.values, width, 2), _left_pad(other.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(new.mask, width, 1)])  # [B + B', S]
        self.next_pos = torch.cat([self.next_pos, new.next_pos])
        self.padded = True
        return logits


class FastSteps:
    can_join = True
    can_jump = True

    def __init__(
        self,
        fast: FastLM,
        max_new: int,
        lora: FastLora | None = None,
        *,
        prefix: PrefixCache | None = None,
        policy: Hashable = None,
        counts: EngineCounts | None = None,
    ) -> None:
        """``prefix``: the engine's prefix cache, for prompts computed with ``policy``'s weights (its key there)."""
        self.fast, self.max_new, self.lora = fast, max_new, lora
        self.prefix, self.policy = prefix, policy
        self.counts = counts if counts is not None else EngineCounts()
        self.device = fast.embed.device
        self.cache: FastCache | None = None
        self.next_pos = torch.empty(0)
        self.prompts: list[tuple[int, ...]] = []  # each row's prompt
        self.head: tuple[int, ...] = ()  # the tokens of the cache's shared head
        # for rows joining a batch: its shared head (tokens, keys, values), which prompts that begin with it are
        # prefilled after (with the prefix cache on: without it, a joiner computes its whole prompt)
        self.after: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None

    def prefill(self, batch: Prefill) -> torch.Tensor:
        return self._prefill(batch, share=True)

    def _prefill(self, batch: Prefill, share: bool) -> torch.Tensor:
        """``prefill``; ``share``: the rows' common beginning becomes the cache's shared head where long enough."""
        rows, width = batch.input_ids.shape
        room = min(self.max_new, 256)  # the cache grows past it if needed
        small = rows == 1 or rows * width * self.fast.embed.shape[1] < APART_PREFILL_WORK
        if small and not self._any_cached(batch) and self._after_head(batch.prompts) == [0] * rows:
            cache = self.fast.new_cache(rows, width + room)
            logits = self.fast.forward(batch.input_ids, batch.positions, batch.mask.bool(), cache, self.lora)
            self.counts.prefill_tokens += int(batch.mask.sum())
            if self.prefix is not None:
                for u, prompt in enumerate(batch.prompts):
                    self.prefix.record_miss(len(prompt))
                    self.prefix.insert(self.policy, prompt, _row_columns(cache, u))
        else:
            logits, cache = self._prefill_apart(batch, room)
        self.cache = cache
        self.next_pos = batch.positions[:, -1:] + 1  # [U, 1]
        self.prompts = [batch.prompts[u] for u in batch.source]
        if share and len(self.prompts) > 1:  # before the rows are repeated: they repeat only what follows it
            self._share_head(batch.prompts, list(range(len(batch.prompts))))
        if batch.shared:
            index = torch.tensor(batch.source, device=logits.device)
            cache.select(index)
            logits, self.next_pos = logits[index], self.next_pos[index]
        return logits

    def _after_head(self, prompts: list[tuple[int, ...]]) -> list[int]:
        """For each prompt, the tokens of the batch's shared head it begins with and is prefilled after (0: none)."""
        if self.after is None or self.prefix is None:
            return [0] * len(prompts)
        head = self.after[0]
        return [len(head) if len(prompt) > len(head) and prompt[: len(head)] == head else 0 for prompt in prompts]

    def _any_cached(self, batch: Prefill) -> bool:
        if self.prefix is None:
            return False
        return any(self.prefix.cached(self.policy, prompt) for prompt in batch.prompts)

    def _prefill_apart(self, batch: Prefill, room: int) -> tuple[torch.Tensor, FastCache]:
        """Each distinct prompt through its own forward (no padding: nothing computed for it, no attention mask to
        build), from the longest beginning whose KV is known: with a prefix cache, what the cache holds (earlier
        requests, and the prompts before it in this batch, each kept as it is computed); without one, the
        beginning the batch's prompts have in common (the system prompt, the tool list: BFCL's prompts share ~60
        tokens), computed once and copied into each. Logits [U, V] and the prompts' caches, right-aligned as one
        batch."""
        prompts = batch.prompts  # ids of each distinct prompt
        skips = self._after_head(prompts)  # the tokens the batch's shared head holds for it
        lengths = [len(prompt) - skip for prompt, skip in zip(prompts, skips, strict=True)]
        common, head = 0, None
        if self.prefix is None:
            common = common_prefix(prompts, min(lengths) - 1)  # each prompt keeps a token of its own: its logits
            if common >= MIN_SHARED_PROMPT:
                head = self.fast.new_cache(1, common + 1)
                self._forward_from(prompts[0][:common], 0, head)
                self.counts.prefill_tokens += common
            else:
                common = 0
        # one cache for the batch, each prompt right-aligned at the longest and prefilled straight into its row
        # (SmolLM2 with 4-5k-token prompts: a row's KV is ~230 MB, and a copy per row was ~5% of an agent loop)
        width = max(lengths)
        batch_cache = self.fast.new_cache(len(prompts), width + room)
        if any(skips) and self.after is not None:  # the rows prefilled after the running batch's head share it
            batch_cache.adopt_head([], self.after[1], self.after[2])
            batch_cache.shares = torch.tensor([skip > 0 for skip in skips], device=self.device)
        logits = []
        for row, (prompt, skip) in enumerate(zip(prompts, skips, strict=True)):
            cache = batch_cache.row_view(row, width - lengths[row])  # the columns on its left: zeros, masked
            start = common
            if head is not None:  # the batch's common beginning, computed once
                cache.write([(head.keys[:, 0], head.values[:, 0])], common)
            if skip:  # the rest after the running batch's head, which it reads from there
                assert batch_cache.shares is not None
                cache.head_keys, cache.head_values = batch_cache.head_keys, batch_cache.head_values
                cache.shares = batch_cache.shares[row : row + 1]
            if self.prefix is not None:
                hit = self.prefix.lookup(self.policy, prompt, limit=len(prompt) - 1)
                if hit.length > skip:
                    cache.write(hit.blocks, hit.length, skip)
                start = max(hit.length, skip)
            logits.append(self._forward_from(prompt[start:], start, cache))  # [1, V]
            assert cache.keys.data_ptr() == batch_cache.keys[:, row, :, width - lengths[row] :].data_ptr(), "it grew"
            self.counts.prefill_tokens += len(prompt) - start
            if self.prefix is not None:
                self.prefix.insert(self.policy, prompt, _row_columns(cache, 0))
        batch_cache.length = width
        return torch.cat(logits), batch_cache

    def _forward_from(self, ids: tuple[int, ...], start: int, cache: FastCache) -> torch.Tensor:
        """One row's token ``ids`` at positions ``start..``, after the ``start`` columns ``cache`` holds."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)  # [T]
        positions = torch.arange(start, start + len(tokens), device=tokens.device)[None]
        valid = torch.ones((1, len(tokens)), dtype=torch.bool, device=tokens.device)
        return self.fast.forward(tokens[None], positions, valid, cache, self.lora)  # [1, V]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None, "prefill first"
        valid = torch.ones_like(tokens, dtype=torch.bool).unsqueeze(-1)
        logits = self.fast.forward(tokens.unsqueeze(-1), self.next_pos, valid, self.cache, self.lora)
        self.next_pos = self.next_pos + 1
        return logits

    def decode_many(self, tokens: list[list[int]]) -> torch.Tensor:
        """Feed each row its tokens (one or more) in one forward: [B, W] with the shorter rows padded on the left (the
        columns marked invalid in the cache, never attended to). Logits after each row's last token [B, V]."""
        assert self.cache is not None, "prefill first"
        rows, width = len(tokens), max(len(row) for row in tokens)
        ids = torch.zeros((rows, width), dtype=torch.long)
        valid = torch.zeros((rows, width), dtype=torch.bool)
        count = torch.tensor([len(row) for row in tokens])  # [B]
        for b, row in enumerate(tokens):
            ids[b, width - len(row) :] = torch.tensor(row)
            valid[b, width - len(row) :] = True
        ids, valid, count = ids.to(self.device), valid.to(self.device), count.to(self.device)
        offsets = torch.arange(width, device=self.device) - (width - count[:, None])  # [B, W]: 0.. on real tokens
        positions = self.next_pos + offsets.clamp(min=0)  # padding: the row's next position (masked anyway)
        logits = self.fast.forward(ids, positions, valid, self.cache, self.lora)
        self.next_pos = self.next_pos + count[:, None]
        return logits

    def select(self, index: torch.Tensor) -> None:
        assert self.cache is not None, "prefill first"
        self.cache.select(index)
        self.next_pos = self.next_pos[index]
        self.prompts = [self.prompts[b] for b in index.tolist()]

    def keep(self, row: int, tokens: list[int]) -> None:
        """A row is finishing: keep the KV of its prompt and what it fed since (``tokens``, the prompt then the
        sampled ids, of which the cache holds a prefix) in the prefix cache."""
        if self.prefix is None or self.cache is None:
            return
        fed = self.cache.tokens_held(row)
        self.prefix.insert(self.policy, tokens[:fed], _row_columns(self.cache, row))

    def join(self, batch: Prefill) -> torch.Tensor:
        assert self.cache is not None, "prefill first"
        new = FastSteps(self.fast, self.max_new, self.lora, prefix=self.prefix, policy=self.policy, counts=self.counts)
        head = self.cache.shares_head()
        if head:
            assert self.cache.head_keys is not None and self.cache.head_values is not None
            new.after = (self.head, self.cache.head_keys, self.cache.head_values)
        logits = new._prefill(batch, share=False)  # [B', V]
        assert new.cache is not None
        if not head:  # the first rows to share one, or the rows sharing it have all left
            self._share_head([*self.prompts, *new.prompts], list(range(len(self.prompts))))
        if self.cache.head_keys is not None and self.cache.head_values is not None and self.head:
            width = len(self.head)
            rows = [r for r, p in enumerate(new.prompts) if p[:width] == self.head and not new.cache.row_shares(r)]
            if rows:  # prefilled whole (no head yet, or no prefix cache): their first tokens go
                new.cache.adopt_head(rows, self.cache.head_keys, self.cache.head_values)
        self.cache.extend(new.cache)
        self.next_pos = torch.cat([self.next_pos, new.next_pos])
        self.prompts += new.prompts
        return logits

    def _share_head(self, prompts: list[tuple[int, ...]], rows: list[int]) -> None:
        """Where ``prompts`` (those of the rows after this change) begin with ``MIN_SHARED_HEAD`` or more of the same
        tokens, make them the cache's shared head for ``rows`` (the rows it holds now, all of which begin so)."""
        assert self.cache is not None
        self.head = ()
        width = common_prefix(prompts, min(len(prompt) for prompt in prompts))
        if width >= MIN_SHARED_HEAD:
            self.cache.share_head(rows, width)
            self.head = prompts[0][:width]


def _row_columns(cache: FastCache, row: int) -> ColumnsKV:
    """Row ``row``'s KV by token: ``kv(start, stop)`` is that of its tokens start..stop-1, [L, kv_heads, stop - start,
    head_dim] each: the shared head's for the tokens it holds (a row that shares it), then the row's valid columns in
    order (padding on the left of a joined row, or between the tokens of a jump-forward step, skipped)."""
    head = cache.head_length if cache.row_shares(row) else 0
    valid = cache.valid[row, : cache.length]  # [S]
    offset = int((~valid).long().cumprod(0).sum())  # the padding before its first own token
    columns = None if bool(valid[offset:].all()) else valid.nonzero().flatten()  # [n]

    def own(start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:  # positions from the row's first own token
        index: slice | torch.Tensor = slice(offset + start, offset + stop) if columns is None else columns[start:stop]
        return cache.keys[:, row][:, :, index], cache.values[:, row][:, :, index]  # [L, kv, S, hd] -> columns

    def kv(start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start >= head:
            return own(start - head, stop - head)
        assert cache.head_keys is not None and cache.head_values is not None
        keys, values = cache.head_keys[:, :, start : min(stop, head)], cache.head_values[:, :, start : min(stop, head)]
        if stop <= head:
            return keys, values
        more_keys, more_values = own(0, stop - head)
        return torch.cat([keys, more_keys], 2), torch.cat([values, more_values], 2)

    return kv


def common_prefix(prompts: list[tuple[int, ...]], limit: int) -> int:
    """How many leading tokens (at most ``limit``) every prompt starts with."""
    count = 0
    for column in zip(*(prompt[: max(limit, 0)] for prompt in prompts), strict=False):
        if any(token != column[0] for token in column):
            break
        count += 1
    return count


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``x`` padded with zeros on the left of ``dim`` to ``width`` (masked columns: never attended to)."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)
