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
from dataclasses import dataclass
from typing import Any

import torch

from langgraph_art.errors import RequestError

# what ``closing_path`` tries where a JSON value is due: the shortest whole values first, then what opens one
VALUES = (' ""', '""', " 0", "0", " []", "[]", " {}", "{}", " null", "null", " false", "false", " true", "true")
OPENERS = (' "', '"', " [", "[", " {", "{")
MAX_BACKTRACK = 128  # tokens ``close`` may give back to fit a closing into the budget
MAX_CLOSING = 128  # tokens a closing may take (both bound ``close``'s work: at most ~16k masks, well under a second)
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class Replay:
    """A sample replayed over its grammar: the mask before each token (``packed`` [n, W]) and whether the grammar
    forced the token (``forced`` [n]: fed by jump-forward, no choice made; context, never trained on)."""

    packed: torch.Tensor
    forced: list[bool]


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
        self._prefer = _closing_tokens(self.tokenizer)

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

    def compiled(self, grammar: str) -> bool:
        """True when ``grammar`` is compiled already (a ``matcher`` of it is then cheap: no thread needed)."""
        with self._lock:
            return grammar in self._compiled

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

    def replay(self, grammar: str, token_ids: Sequence[int]) -> Replay | None:
        """The packed mask before each of ``token_ids`` [n, W], as the sampler had it, and which tokens the grammar
        forced (jump-forward, ``serve/engines/hf/batch.py``): after each sampled token, the text the grammar then forces
        as llguidance tokenizes it, where the ids go on with it. None when a token is not allowed where it stands
        (the turn was not sampled under this grammar, or with another tokenizer)."""
        matcher = self.matcher(grammar)
        out = torch.empty((len(token_ids), self.words), dtype=torch.int32)
        forced = [False] * len(token_ids)
        for i, token in enumerate(token_ids):
            matcher.unsafe_compute_mask_ptr(out[i].data_ptr(), self.words * 4)
            if token >= self.vocab_size or not (int(out[i, token // 32]) >> (token % 32)) & 1:
                return None
            if not matcher.consume_token(token):
                return None
            if not forced[i] and not matcher.is_stopped():  # a sampled token: the engine jumped forward after it
                run = matcher.compute_ff_tokens()
                same = 0
                while same < len(run) and i + 1 + same < len(token_ids) and token_ids[i + 1 + same] == run[same]:
                    same += 1
                if run and (same == len(run) or i + 1 + same == len(token_ids)):  # all of it, or cut by the budget
                    forced[i + 1 : i + 1 + same] = [True] * same
        return Replay(out, forced)

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
            limit = min(budget - keep, MAX_CLOSING)
            path = self.closing_path(matcher, limit, self.tokenizer.decode_str(list(token_ids[:keep])))
            if path is not None:
                return keep, path
        return None

    def closing_path(self, matcher: Any, limit: int, text: str = "") -> list[int] | None:
        """Tokens that take ``matcher`` (left as it is; ``text`` is what it has read so far) to the end of its
        grammar, EOS last, in at most ``limit`` tokens, or None. Greedy, JSON-aware: EOS as soon as the grammar
        accepts, forced tokens as they come; else, of the tokens the grammar allows, the one that does most where the
        text stands (``json_context``): inside a string the quote that ends it (with as many closing brackets as one
        token holds), where a value is due the shortest whole value, after a value the longest run of closing
        brackets; else the lowest allowed token."""
        probe = matcher.deep_copy()
        path: list[int] = []
        mask = torch.empty((1, self.words), dtype=torch.int32)
        while len(path) < limit:
            if probe.is_accepting():
                return [*path, self.eos]
            forced = probe.compute_ff_tokens()
            if not forced:
                allowed = unpack(self.packed([probe], mask), self.vocab_size)[0]
                wanted = self._prefer.get(json_context(text), [])
                choice = next((t for t in wanted if allowed[t]), None)
                if choice is None:
                    choice = next((t for t in allowed.nonzero().flatten().tolist() if t != self.eos), None)
                forced = [choice] if choice is not None else []
            if not forced or len(path) + len(forced) > limit or not probe.consume_tokens(forced):
                return None
            path += forced
            text += self.tokenizer.decode_str(forced)
        return None


def json_context(text: str) -> str:
    """Where JSON cut at the end of ``text`` stands: ``"string"`` (inside one), ``"value"`` (a value is due),
    ``"key"`` (an object's next key, or its end), ``"after"`` (a value just ended, or one is under way: a separator
    or a closing bracket is due) or ``"text"`` (before the first bracket)."""
    depth: list[str] = []
    in_string = escaped = False
    state = "text"
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string, state = False, "after"
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth.append(ch)
            state = "key" if ch == "{" else "value"
        elif ch in "}]":
            depth = depth[:-1]
            state = "after"
        elif ch == ":":
            state = "value"
        elif ch == ",":
            state = "key" if depth and depth[-1] == "{" else "value"
        elif depth and not ch.isspace():  # a number or a literal under way
            state = "after"
    return "string" if in_string else state


def _closing_tokens(tokenizer: Any) -> dict[str, list[int]]:
    """The single tokens ``closing_path`` prefers in each ``json_context``, best first."""

    def single(texts: Sequence[str]) -> list[int]:
        found = (tokenizer.tokenize_str(text) for text in texts)
        return [ids[0] for ids in found if len(ids) == 1]

    pieces = {i: tokenizer.decode_str([i]) for i in range(tokenizer.vocab_size) if not tokenizer.is_special_token(i)}
    brackets = sorted((t for t, s in pieces.items() if s and set(s) <= set("}]")), key=lambda t: -len(pieces[t]))
    quotes = [t for t, s in pieces.items() if s.startswith('"') and set(s[1:]) <= set("}]")]
    return {
        "string": sorted(quotes, key=lambda t: -len(pieces[t])),
        "value": single(VALUES + OPENERS),
        "key": [*single(("}", " }")), *single(OPENERS[:2])],
        "after": brackets,
    }


def unpack(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed masks [..., W] int32 -> bool [..., vocab_size]."""
    bits = (packed.unsqueeze(-1) >> _BITS.to(packed.device)) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()
