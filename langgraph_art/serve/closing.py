"""Structured output that ``max_tokens`` cut short is closed, not returned broken.

A sample under a grammar that used its whole token budget before the grammar was complete (a model looping inside
a JSON string: the random-init tiny model does it about half the time) would be invalid JSON and crash the user's
parser. Instead the server gives back as few of its last tokens as it must and appends the shortest completion it
finds (``Grammars.close``), all within the same budget: the response parses, its ``finish_reason`` is ``"stop"``,
and ``closing_tokens`` (on the choice, with ``return_token_ids``) says how many tokens at its end the server chose.
Those carry logprob 0.0 and are never trained on; the kept tokens are the policy's own samples, logprobs unchanged.

Streaming holds back a constrained choice's tokens in the last ``HOLD`` positions of its budget until it ends, so
what was sent never has to be taken back (a closing that would give back more than that is not attempted).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from langgraph_art.serve.engines.base import GenerationResult, Sample

log = logging.getLogger(__name__)
HOLD = 64


def needs_closing(result: GenerationResult, grammar: str | None) -> bool:
    return grammar is not None and any(s.finish_reason == "length" for s in result.samples)


def close_result(
    result: GenerationResult, grammar: str, budget: int, grammars: Any, tokenizer: Any, sent: list[int] | None = None
) -> GenerationResult:
    """``result`` with every sample the budget cut short completed (see the module's docstring). ``sent``: how many
    tokens of each sample were already streamed (those are kept whatever it costs)."""
    samples = [
        close_sample(s, grammar, budget, grammars, tokenizer, sent[s.index] if sent else 0)
        if s.finish_reason == "length"
        else s
        for s in result.samples
    ]
    return dataclasses.replace(result, samples=samples)


def close_sample(sample: Sample, grammar: str, budget: int, grammars: Any, tokenizer: Any, sent: int = 0) -> Sample:
    closed = grammars.close(grammar, sample.token_ids, budget)
    if closed is None or closed[0] < sent:
        log.warning("a %d-token structured sample could not be completed within max_tokens", len(sample.token_ids))
        return sample
    keep, tail = closed
    ids = [*sample.token_ids[:keep], *tail]
    top = [[(t, 0.0)] for t in tail] if any(sample.top_logprobs) else [[] for _ in tail]
    return dataclasses.replace(
        sample,
        token_ids=ids,
        logprobs=[*sample.logprobs[:keep], *[0.0] * len(tail)],
        top_logprobs=[*sample.top_logprobs[:keep], *top],
        text=tokenizer.decode(ids, skip_special_tokens=True),
        finish_reason="stop",
        closing_tokens=len(tail),
    )
