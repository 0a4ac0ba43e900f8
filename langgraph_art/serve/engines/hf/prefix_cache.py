"""``PrefixCache``: the KV of earlier prompts (and of what was sampled after them), reused by later prompts that start
the same way, as vLLM's automatic prefix caching does: the runs of a GRPO group (one prompt, eight requests), the
turns of an agent loop (turn k+1's prompt is turn k's plus the model's call and the tool's result), and the next
step's rollouts, whose prompts begin with the same system prompt and tool list.

Blocks of ``block_size`` tokens form one trie per policy: a block is found under its parent by its tokens, so a hit
is exact (no hashes that could collide), and each block's KV [layers, kv_heads, block_size, head_dim] is held once
however many prompts share it. The policy key names the weights the KV was computed with: the base model and each
loaded adapter have their own (a new checkpoint under an old name gets a new key), so KV is never reused across
weights; the engine drops the tries of policies that are gone.

Bounded by ``budget_bytes``: past it, the least recently used blocks go first, and a block never before its
descendants (a lookup or insert touches the whole path, and a child sorts before its parent on a tie), so what stays
is always a prefix tree. Evicting changes how much is recomputed, never a result beyond float rounding: the KV of a
prefix is what the prompt's own prefill would compute (positions from 0 either way).

Worker thread only (the engine's). Counters: ``stats()``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

BLOCK_SIZE = 16  # tokens per block, as vLLM's default


@dataclass(eq=False)
class _Block:
    tokens: tuple[int, ...]
    keys: torch.Tensor | None  # [L, kv_heads, block_size, head_dim]; None for a trie's root
    values: torch.Tensor | None
    parent: _Block | None
    depth: int
    used: int = 0  # tick of the last lookup or insert through this block
    children: dict[tuple[int, ...], _Block] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


@dataclass
class PrefixHit:
    """The longest cached prefix of a prompt: ``length`` tokens, whose KV is ``blocks`` in order (keys and values
    [L, kv_heads, block_size, head_dim] each; the last may hold more than the hit uses)."""

    length: int
    blocks: list[tuple[torch.Tensor, torch.Tensor]]


# the KV of a sequence's tokens start..stop-1: keys and values [L, kv_heads, stop - start, head_dim]
ColumnsKV = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    FIELDS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_evictions", "prefix_cache_blocks",
              "prefix_cache_bytes")  # fmt: skip

    def __init__(self, budget_bytes: int, block_size: int = BLOCK_SIZE) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache's budget must be >= 0 bytes, got {budget_bytes}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.budget_bytes, self.block_size = budget_bytes, block_size
        self._roots: dict[Hashable, _Block] = {}
        self._ticks = itertools.count(1)
        self.bytes = 0
        self.blocks = 0
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens whose KV came from the cache
        self.evictions = 0  # blocks evicted for room

    def lookup(self, policy: Hashable, prompt: Sequence[int], limit: int | None = None) -> PrefixHit:
        """The longest cached prefix of ``prompt`` under ``policy``, at most ``limit`` tokens (the caller keeps at
        least the prompt's last token to compute: its logits are the first token's distribution). A whole block
        is cut to ``limit`` where the limit falls inside it."""
        limit = len(prompt) if limit is None else min(limit, len(prompt))
        self.queries += len(prompt)
        node = self._roots.get(policy)
        path: list[_Block] = []
        tick = next(self._ticks)
        size = self.block_size
        while node is not None and len(path) * size < limit:
            start = len(path) * size
            child = node.children.get(tuple(prompt[start : start + size]))
            if child is None:
                break
            child.used = tick
            path.append(child)
            node = child
        length = min(len(path) * size, limit)
        self.hits += length
        blocks = [(b.keys, b.values) for b in path if b.keys is not None and b.values is not None]
        return PrefixHit(length, blocks)

    def cached(self, policy: Hashable, prompt: Sequence[int]) -> bool:
        """Whether the cache holds at least the first block of ``prompt`` (nothing counted, nothing touched)."""
        root = self._roots.get(policy)
        return root is not None and len(prompt) > self.block_size and tuple(prompt[: self.block_size]) in root.children

    def record_miss(self, tokens: int) -> None:
        """A prompt of ``tokens`` computed without looking (nothing of it was cached): counted as asked."""
        self.queries += tokens

    def insert(self, policy: Hashable, tokens: Sequence[int], kv: ColumnsKV) -> None:
        """Keep the KV of ``tokens`` (positions from 0; ``kv(start, stop)`` gives that of tokens start..stop-1, asked
        only for blocks not held yet) in whole blocks; the blocks already held are only touched. Evicts down to the
        budget afterwards."""
        if self.budget_bytes == 0:
            return
        size = self.block_size
        whole = len(tokens) // size
        if whole == 0:
            return
        tick = next(self._ticks)
        node = self._roots.get(policy)
        if node is None:
            node = self._roots[policy] = _Block((), None, None, None, 0)
        for i in range(whole):
            block = tuple(tokens[i * size : (i + 1) * size])
            child = node.children.get(block)
            if child is None:
                keys, values = kv(i * size, (i + 1) * size)
                # its own storage: the batch's cache is written over and dropped
                child = _Block(block, keys.clone(), values.clone(), node, node.depth + 1)
                node.children[block] = child
                self.bytes += child.nbytes
                self.blocks += 1
            child.used = tick
            node = child
        self._evict()

    def retain(self, policies: set[Hashable]) -> None:
        """Drop every policy's blocks but those of ``policies`` (the engine calls it when adapters come and go)."""
        for policy in [p for p in self._roots if p not in policies]:
            self._drop(self._roots.pop(policy))

    def clear(self) -> None:
        self.retain(set())

    def stats(self) -> dict[str, int]:
        values = (self.queries, self.hits, self.evictions, self.blocks, self.bytes)
        return dict(zip(self.FIELDS, values, strict=True))

    def _drop(self, root: _Block) -> None:
        stack = list(root.children.values())
        while stack:
            block = stack.pop()
            stack.extend(block.children.values())
            self.bytes -= block.nbytes
            self.blocks -= 1

    def _evict(self) -> None:
        if self.bytes <= self.budget_bytes:
            return
        blocks: list[_Block] = []
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            block = stack.pop()
            blocks.append(block)
            stack.extend(block.children.values())
        blocks.sort(key=lambda b: (b.used, -b.depth))  # least recently used first; a child before its parent
        for block in blocks:
            if self.bytes <= self.budget_bytes:
                break
            assert not block.children and block.parent is not None, "eviction order keeps the tree whole"
            del block.parent.children[block.tokens]
            self.bytes -= block.nbytes
            self.blocks -= 1
            self.evictions += 1
        for policy in [p for p, root in self._roots.items() if not root.children]:
            del self._roots[policy]
