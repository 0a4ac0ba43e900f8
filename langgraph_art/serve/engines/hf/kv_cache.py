"""``FastCache``: the KV cache of a batch of rows that ``FastLM`` decodes together.

Left padding, as the engine batches: every row's next token goes in the same column, each row's tokens end at
``length`` (right-aligned), and ``valid`` marks the columns holding real tokens of each row. Rows leave in place
(``select``) and join in place where rows that left made room (``extend``), so an agent loop's runs, which leave the
batch when a call ends and join again with the next turn, copy only their own columns.

A shared head (cascade attention, as FlashInfer and vLLM do it): when the batch's rows begin with the same long
prompt (a GRPO group's runs, the turns of their agent loops: thousands of tokens of documentation and tool list), that
beginning's KV is held once, in ``head_keys``/``head_values``, and a row that ``shares`` it keeps only what follows in
its own columns. A decode step then reads the head once for all rows instead of once per row (SmolLM2, 8 rows of
4.6k tokens that share 3.7k: attention read ~1.7 GB a step, most of it the same KV eight times).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

# Free columns a re-allocated batch cache keeps on the left, so that a joining row longer than the running ones (an
# agent's next turn: its conversation plus a tool result) still fits in place; attention never reads them.
JOIN_MARGIN = 512


@dataclass
class FastCache:
    keys: torch.Tensor  # [L, B, kv_heads, capacity, head_dim]
    values: torch.Tensor  # [L, B, kv_heads, capacity, head_dim]
    valid: torch.Tensor  # [B, capacity] bool: column holds a real token of the row
    length: int = 0  # columns written
    # the buffers (keys, values, valid) whose first B rows these are: rows that left keep their room for rows joining
    rows_room: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    # the shared head: the KV of the first tokens of every row that shares it, positions 0.. ([L, kv_heads, P,
    # head_dim] each), and which rows do ([B] bool); their own columns hold their tokens from position P on
    head_keys: torch.Tensor | None = field(default=None, repr=False)
    head_values: torch.Tensor | None = field(default=None, repr=False)
    shares: torch.Tensor | None = None

    @property
    def head_length(self) -> int:
        """P: the tokens of the shared head (0 without one)."""
        return 0 if self.head_keys is None else self.head_keys.shape[2]

    def shares_head(self) -> bool:
        """Whether some row reads the shared head (attention then runs in two parts, merged)."""
        return self.shares is not None and bool(self.shares.any())

    @torch.inference_mode()
    def share_head(self, rows: list[int], length: int) -> None:
        """Make the first ``length`` tokens of ``rows`` (which must be the same tokens, positions 0..) the shared
        head: copied once from the first of them, then dropped from each row's own columns (marked invalid, so
        attention no longer reads them there). A head nobody shares any more is replaced."""
        assert not self.shares_head(), "the batch has a shared head already"
        columns = self._leading_columns(rows[0], length)
        keys, values = self.keys[:, rows[0], :, columns].clone(), self.values[:, rows[0], :, columns].clone()
        self.head_keys = self.head_values = self.shares = None
        self.adopt_head(rows, keys, values)

    @torch.inference_mode()
    def adopt_head(self, rows: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows ``rows`` begin with the tokens whose KV is ``keys``/``values`` ([L, kv_heads, P, head_dim], another
        cache's shared head): they read it from there and their first P columns are dropped (marked invalid)."""
        assert self.head_keys is None or self.head_keys is keys, "a cache holds one shared head"
        self.head_keys, self.head_values = keys, values
        if self.shares is None:
            self.shares = torch.zeros(self.valid.shape[0], dtype=torch.bool, device=self.valid.device)
        for row in rows:
            self.valid[row, self._leading_columns(row, keys.shape[2])] = False
            self.shares[row] = True

    def _leading_columns(self, row: int, count: int) -> torch.Tensor:
        """The columns of row ``row``'s first ``count`` tokens (its first valid columns) [count]."""
        columns = self.valid[row, : self.length].nonzero().flatten()[:count]
        assert len(columns) == count, f"row {row} holds {len(columns)} tokens, fewer than {count}"
        return columns

    def row_shares(self, row: int) -> bool:
        return self.shares is not None and bool(self.shares[row])

    def tokens_held(self, row: int) -> int:
        """How many tokens of row ``row`` this cache holds the KV of: the shared head's (where the row shares it)
        and its own valid columns."""
        head = self.head_length if self.row_shares(row) else 0
        return head + int(self.valid[row, : self.length].sum())

    def first_used(self, end: int) -> int:
        """The first of the columns before ``end`` that a row holds a token in (``end`` when none): the columns
        before it (rows that left, the margin kept for joins) are never read."""
        used = self.valid[:, :end].any(0)
        return int(used.to(torch.uint8).argmax()) if bool(used.any()) else end

    def select(self, index: torch.Tensor) -> None:
        """Keep (or repeat) the rows ``index`` [B'] in this order. Rows leaving a batch (``index`` increasing) are
        dropped in place: the rows after a gap move up, only their written columns are copied, and the buffers stay
        (a copy of the whole cache, its room included, took ~0.3 s per finished row on SmolLM2 at batch 32), with
        the rows that left as room for rows that join. Otherwise (repeats, another order) the rows are copied, less
        the leading columns no kept row uses."""
        kept = index.tolist()
        if self.shares is not None:
            self.shares = self.shares.index_select(0, index)
        if all(b > a for a, b in itertools.pairwise(kept)):
            self._keep_in_place(kept)
            return
        valid = self.valid.index_select(0, index)
        used = valid[:, : self.length].any(0).nonzero()
        start = int(used[0]) if len(used) else self.length  # none: rows whose tokens are all in the shared head
        self.keys = self.keys[:, :, :, start:].index_select(1, index)
        self.values = self.values[:, :, :, start:].index_select(1, index)
        self.valid = valid[:, start:]
        self.length -= start
        self.rows_room = None

    def row_view(self, row: int, start: int) -> FastCache:
        """Row ``row`` from column ``start`` on as an empty one-row cache whose columns are this one's (views, not
        copies): a prompt prefilled into it lands in place here. Its room is this cache's; it must not grow."""
        keys, values = self.keys[:, row : row + 1, :, start:], self.values[:, row : row + 1, :, start:]
        return FastCache(keys, values, self.valid[row : row + 1, start:])

    @torch.inference_mode()  # the buffers may have been grown inside a forward: inference tensors
    def _keep_in_place(self, kept: list[int]) -> None:
        if self.rows_room is None:
            self.rows_room = (self.keys, self.values, self.valid)
        for target, source in enumerate(kept):
            if target != source:
                self.keys[:, target, :, : self.length] = self.keys[:, source, :, : self.length]
                self.values[:, target, :, : self.length] = self.values[:, source, :, : self.length]
                self.valid[target] = self.valid[source]
        rows = len(kept)
        self.keys, self.values, self.valid = self.keys[:, :rows], self.values[:, :rows], self.valid[:rows]

    def extend(self, other: FastCache) -> None:
        """Append ``other``'s rows after these, right-aligned so that every row's next token goes in the same column
        (marked invalid on their left). Rows of ``other`` that share a head share this cache's (the same tensors).
        In place when ``other``'s columns fit in those written and rows that left this cache have left room for its
        rows (an agent loop's runs leave and join again, turn after turn): only ``other``'s columns are copied.
        Otherwise into new buffers, with ``JOIN_MARGIN`` free columns on the left for the rows that join later (on
        SmolLM2 a copy of 8 rows of 4.6k tokens took 0.58 s, and an agent step of 8 runs x 8 calls joins ~60 times)."""
        if other.shares_head():
            assert other.head_keys is self.head_keys, "rows can only share the head of the batch they join"
        if self.shares is not None or other.shares is not None:
            mine = self.shares if self.shares is not None else self.valid.new_zeros(self.valid.shape[0])
            theirs = other.shares if other.shares is not None else other.valid.new_zeros(other.valid.shape[0])
            self.shares = torch.cat([mine, theirs])
        if self._join_in_place(other):
            return
        both = FastCache.stacked([self, other], margin=JOIN_MARGIN)
        self.keys, self.values, self.valid, self.length = both.keys, both.values, both.valid, both.length
        self.rows_room = None

    @torch.inference_mode()
    def _join_in_place(self, other: FastCache) -> bool:
        first = other.first_used(other.length)  # what other's rows hold: columns first..length-1
        rows, extra, shift = self.valid.shape[0], other.valid.shape[0], self.length - (other.length - first)
        room = self.rows_room
        if room is None or shift < 0 or room[2].shape[0] < rows + extra:
            return False
        keys, values, valid = room
        if keys.data_ptr() != self.keys.data_ptr() or keys.shape[3] != self.keys.shape[3]:
            return False  # these rows are not the first of those buffers any more
        new = slice(rows, rows + extra)
        # the columns on their left stay as they are (padding, masked): zeros or some row's KV, never garbage, since
        # buffers are allocated zeroed (an attention weight of 0 times NaN is NaN)
        keys[:, new, :, shift : self.length] = other.keys[:, :, :, first : other.length]
        values[:, new, :, shift : self.length] = other.values[:, :, :, first : other.length]
        valid[new] = False
        valid[new, shift : self.length] = other.valid[:, first : other.length]
        self.keys, self.values, self.valid = keys[:, : rows + extra], values[:, : rows + extra], valid[: rows + extra]
        return True

    @classmethod
    def stacked(cls, parts: list[FastCache], margin: int = 0) -> FastCache:
        """The rows of ``parts`` one after the other, each part's columns from the first a row of it uses,
        right-aligned at the longest plus ``margin`` (zeros on the left, marked invalid), with the largest room any
        part had left (at least one column). Shared heads are the caller's to keep."""
        firsts = [part.first_used(part.length) for part in parts]
        length = max(part.length - first for part, first in zip(parts, firsts, strict=True)) + margin
        capacity = length + max(1, *(part.valid.shape[1] - part.length for part in parts))
        rows = sum(part.valid.shape[0] for part in parts)
        head = parts[0]
        shape = (head.keys.shape[0], rows, head.keys.shape[2], capacity, head.keys.shape[4])
        keys, values = head.keys.new_zeros(shape), head.values.new_zeros(shape)
        valid = head.valid.new_zeros((rows, capacity))
        row = 0
        for part, first in zip(parts, firsts, strict=True):
            n, shift = part.valid.shape[0], length - (part.length - first)
            keys[:, row : row + n, :, shift:length] = part.keys[:, :, :, first : part.length]
            values[:, row : row + n, :, shift:length] = part.values[:, :, :, first : part.length]
            valid[row : row + n, shift:length] = part.valid[:, first : part.length]
            row += n
        return cls(keys, values, valid, length)

    @torch.inference_mode()
    def write(self, blocks: list[tuple[torch.Tensor, torch.Tensor]], length: int, skip: int = 0) -> None:
        """Fill an empty one-row cache with the KV of a prompt's tokens ``skip..length-1``, given as consecutive
        blocks from token 0 (keys and values [L, kv_heads, block, head_dim] each; from the prefix cache): columns
        0..length-skip-1, valid. ``skip``: the tokens a shared head holds."""
        assert self.length == 0 and self.valid.shape[0] == 1, "write fills an empty one-row cache"
        count = length - skip
        self.reserve(count + 1)
        token = 0  # the first token of the block
        for keys, values in blocks:
            first, stop = max(skip, token), min(token + keys.shape[2], length)
            if stop > first:
                columns = slice(first - skip, stop - skip)
                self.keys[:, 0, :, columns] = keys[:, :, first - token : stop - token]
                self.values[:, 0, :, columns] = values[:, :, first - token : stop - token]
            token += keys.shape[2]
        assert token >= length, f"the blocks hold {token} of the {length} tokens asked for"
        self.valid[0, :count] = True
        self.length = count

    def copy(self) -> FastCache:
        """An independent copy (same capacity); writing into either leaves the other as it was."""
        shares = None if self.shares is None else self.shares.clone()
        copied = FastCache(self.keys.clone(), self.values.clone(), self.valid.clone(), self.length, shares=shares)
        copied.head_keys, copied.head_values = self.head_keys, self.head_values  # never written: shared
        return copied

    def reserve(self, columns: int) -> None:
        """Room for ``columns`` columns. The cache doubles (keeping what is written) when it runs out, so a
        request allowed thousands of tokens does not allocate them all before its first one."""
        capacity = self.valid.shape[1]
        if columns <= capacity:
            return
        size = max(columns, 2 * capacity)
        keys = self.keys.new_zeros((*self.keys.shape[:3], size, self.keys.shape[4]))  # zeros: see _join_in_place
        values = torch.zeros_like(keys)
        valid = self.valid.new_zeros((self.valid.shape[0], size))
        keys[:, :, :, : self.length] = self.keys[:, :, :, : self.length]
        values[:, :, :, : self.length] = self.values[:, :, :, : self.length]
        valid[:, : self.length] = self.valid[:, : self.length]
        self.keys, self.values, self.valid, self.rows_room = keys, values, valid, None
