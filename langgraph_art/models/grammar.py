"""Token masks from grammars (llguidance): what the HF engine samples under, what the server closes a structure cut
short by ``max_tokens`` with, and what the trainer recomputes a constrained turn's logprobs under.

Shapes: B rows, V the model's vocabulary (its logits), W = ceil(V / 32) int32 words of a packed mask (bit ``t % 32``
of word ``t // 32`` is 1 when token t is allowed), n the tokens of one sample.

llguidance, not xgrammar or outlines-core: one Lark grammar holds the chat template's tool-call markers (as tokens),
literal text and inline JSON schemas, vLLM's ``guidance`` backend takes the same text (so both engines sample under
the same masks and the trainer can replay them), and it rolls a matcher back, which closing needs. Measured at
batch 16 on tiny-5m (``benchmarks/constrained_decoding.py``): well under a tenth of a decode step.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

import torch

from langgraph_art.errors import RequestError

# what ``closing_path`` tries first, when the grammar allows it: one-character closers (a '"' opens a string where a
# value is due and closes it next), then the shortest values. Not '"}' and the like: where a value is due they open a
# string with text in it instead of closing anything.
CLOSERS = ('"', "}", "]", "0", "null", "false", "true")
MAX_BACKTRACK = 512  # tokens ``close`` may give back to fit a closing into the budget
_BITS = torch.arange(32, dtype=torch.int32)


class Grammars:
    """llguidance over one tokenizer: grammars compiled once (cached by text), a fresh matcher per sampled row."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None, cache_size: int = 64) -> None:
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        # the tokenizer's own EOS only (as vLLM's guidance backend builds it): both engines allow the same end token
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.vocab_size = int(self.tokenizer.vocab_size)
        self.words = (self.vocab_size + 31) // 32
        self.eos = int(self.tokenizer.eos_token)
        self._compiled: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()
        single = ((text, self.tokenizer.tokenize_str(text)) for text in CLOSERS)
        self._closers = [ids[0] for text, ids in single if len(ids) == 1]

    # -- compiling ---------------------------------------------------------------------------------------------
    def check(self, grammar: str, schemas: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        """Raise ``RequestError`` naming the request field whose JSON schema llguidance cannot enforce, or the grammar's
        own problem; compile and cache the grammar otherwise."""
        llg = self._llg.LLMatcher
        for where, schema in schemas:
            problem = llg.validate_grammar(llg.grammar_from_json_schema(schema), self.tokenizer)
            if problem:
                raise RequestError(f"{where} is not a JSON schema that can be enforced: {problem}", where)
        self.matcher(grammar)

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher at the start of ``grammar``. Raises ``RequestError`` if it does not compile."""
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled.deep_copy()
        compiled = self._llg.LLMatcher(self.tokenizer, self._llg.LLMatcher.grammar_from_lark(grammar), log_level=0)
        if compiled.is_error():
            raise RequestError(f"the structured-output grammar does not compile: {compiled.get_error()}")
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self._size:
                self._compiled.popitem(last=False)
        return compiled.deep_copy()

    # -- masks -------------------------------------------------------------------------------------------------
    def packed(self, matchers: Sequence[Any], out: torch.Tensor | None = None) -> torch.Tensor:
        """Each matcher's next-token mask, packed: [len(matchers), W] int32 (CPU)."""
        out = out if out is not None else torch.empty((len(matchers), self.words), dtype=torch.int32)
        for row, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(out[row].data_ptr(), self.words * 4)
        return out

    def allowed(self, matchers: Sequence[Any]) -> torch.Tensor:
        """Each matcher's next-token mask: [len(matchers), V] bool."""
        return unpack(self.packed(matchers), self.vocab_size)

    def replay(self, grammar: str, token_ids: Sequence[int]) -> torch.Tensor | None:
        """The packed mask before each of ``token_ids`` [n, W], as the sampler had it; None when a token is not
        allowed where it stands (the turn was not sampled under this grammar, or with another tokenizer)."""
        matcher = self.matcher(grammar)
        out = torch.empty((len(token_ids), self.words), dtype=torch.int32)
        for i, token in enumerate(token_ids):
            matcher.unsafe_compute_mask_ptr(out[i].data_ptr(), self.words * 4)
            if token >= self.vocab_size or not (int(out[i, token // 32]) >> (token % 32)) & 1:
                return None
            if not matcher.consume_token(token):
                return None
        return out

    # -- closing a structure the budget cut short --------------------------------------------------------------
    def close(self, grammar: str, token_ids: Sequence[int], budget: int) -> tuple[int, list[int]] | None:
        """A complete sample in ``budget`` tokens from one cut short: keep the first ``keep`` sampled tokens and append
        ``tail`` (ending with EOS), the shortest closing ``closing_path`` finds, giving back as few sampled tokens as
        possible. ``(len(token_ids), [])`` when the sample is already complete; None when nothing fits."""
        matcher = self.matcher(grammar)
        kept = matcher.try_consume_tokens(list(token_ids))  # all of them, unless the sample broke the grammar
        if kept == len(token_ids) and (matcher.is_accepting() or matcher.is_stopped()):
            return kept, []
        for keep in range(kept, max(-1, kept - MAX_BACKTRACK - 1), -1):
            if keep < kept and not matcher.rollback(1):
                return None
            path = self.closing_path(matcher, budget - keep)
            if path is not None:
                return keep, path
        return None

    def closing_path(self, matcher: Any, limit: int) -> list[int] | None:
        """Tokens that take ``matcher`` (left as it is) to the end of its grammar, EOS last, in at most ``limit``
        tokens, or None. Greedy: EOS as soon as the grammar accepts, forced tokens as they come, else an allowed
        closer after which the grammar accepts, else the first allowed of ``CLOSERS`` (a '}' where an object may end
        but a '"' inside a string, where '}' is text), else the lowest allowed token."""
        probe = matcher.deep_copy()
        path: list[int] = []
        mask = torch.empty((1, self.words), dtype=torch.int32)
        while len(path) < limit:
            if probe.is_accepting():
                return [*path, self.eos]
            forced = probe.compute_ff_tokens()
            if forced:
                if len(path) + len(forced) > limit or not probe.consume_tokens(forced):
                    return None
                path += forced
                continue
            allowed = unpack(self.packed([probe], mask), self.vocab_size)[0]
            closers = [t for t in self._closers if allowed[t]]
            choice = next((t for t in closers if _accepts_after(probe, t)), closers[0] if closers else None)
            if choice is None:
                candidates = allowed.nonzero().flatten().tolist()
                choice = next((t for t in candidates if t != self.eos), None)
            if choice is None or not probe.consume_token(choice):
                return None
            path.append(choice)
        return None


def _accepts_after(matcher: Any, token: int) -> bool:
    probe = matcher.deep_copy()
    return bool(probe.consume_token(token)) and bool(probe.is_accepting())


def unpack(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed masks [..., W] int32 -> bool [..., vocab_size]."""
    bits = (packed.unsqueeze(-1) >> _BITS.to(packed.device)) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()
