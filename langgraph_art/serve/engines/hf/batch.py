"""The HF engine's running batch: requests join it at any decode step and leave it the step they finish.

Continuous batching. Each ``step`` samples one token for every row from the logits of the last forward, records
(and streams) it, lets the finished rows go (their KV cache rows with them), and runs one decode forward for the
rest. Between steps the engine hands over the requests that arrived meanwhile (``admit``): they are prefilled
on their own (each distinct prompt once, ``prefill.py``) and appended to the running rows, their KV cache
right-aligned with the running one (``Steps.join``), so their first token is sampled at the next step with
everyone else's. A request therefore waits for at most one decode step and one prefill, not for a whole batch:
agent loops, whose calls arrive staggered, keep the batch full.

Rows of a request with a ``grammar`` carry an llguidance matcher: before sampling, their logits outside the
grammar's next-token mask are set to -inf (so the token and its logprob come from the masked distribution), and
the sampled token advances the matcher. Other rows pay nothing.

Jump-forward: where the grammar then forces text (a tool call's markers, its name, the JSON keys and punctuation:
~80% of the tokens of a BFCL call), the row takes those tokens at once, as the text's canonical tokenization
(llguidance's ``compute_ff_tokens``), each with logprob 0 and never trained on (the trainer finds them the same way,
``Grammars.replay``), and the next forward feeds them together: one decode step where there were a dozen. Rows of
one step feed different numbers of tokens; the shorter are padded on the left (cache columns marked invalid).
Engines whose steps feed one token per row (``Steps.can_jump`` False) sample every token.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from langgraph_art.serve.engines.base import GenerationRequest, Sample, StreamEvent, TokenEvent
from langgraph_art.serve.engines.hf import sampling
from langgraph_art.serve.engines.hf.prefill import EngineCounts, build_prefill
from langgraph_art.serve.engines.hf.steps import Steps

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request in the engine: its sampled choices fill ``samples``; events go to the awaiting coroutine."""

    request: GenerationRequest
    max_new: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[StreamEvent | BaseException]
    streaming: bool
    cancelled: bool = False
    samples: list[Sample | None] = field(default_factory=list)

    def post(self, item: StreamEvent | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    @property
    def finished(self) -> bool:
        return bool(self.samples) and all(s is not None for s in self.samples)


@dataclass
class Row:
    """One choice of a job being sampled."""

    job: Job
    index: int
    generator: random.Random | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    matcher: Any = None  # llguidance's, for a request with a grammar


class RunningBatch:
    """The rows decoded together. ``finish(row)`` records a row's sample when it is done and says whether it is."""

    def __init__(
        self,
        steps: Steps,
        finish: Callable[[Row], bool],
        rng: torch.Generator,
        pad: int,
        grammars: Callable[[], Any] | None = None,
        counts: EngineCounts | None = None,
    ) -> None:
        """``grammars``: returns the engine's ``models.grammar.Grammars`` (built on first use), for rows with one.
        ``counts``: the engine's counters (the steps count what they prefill; the batch, its prefill and decode
        seconds)."""
        self.steps, self.finish, self.rng, self.pad, self.grammars = steps, finish, rng, pad, grammars
        self.counts = counts if counts is not None else EngineCounts()
        self.rows: list[Row] = []
        self.jobs: list[Job] = []  # every job admitted, to fail the unfinished ones if a forward raises
        self.logits = self.temps = self.top_ps = torch.empty(0)  # [B, V], [B], [B] for ``rows``
        self.prefills_shared = 0  # rows that reused another row's prefill (identical prompts)
        self.joined = 0  # jobs admitted after the batch started decoding

    @property
    def size(self) -> int:
        return len(self.rows)

    def admit(self, jobs: list[Job]) -> None:
        """Prefill ``jobs`` and add their rows; their first tokens are sampled at the next ``step``."""
        self.jobs += jobs  # first: if their prefill fails, they must hear of it
        rows: list[Row] = []
        for job in jobs:
            self.counts.prompt_tokens += len(job.request.prompt_token_ids)
            params = job.request.params
            job.samples = [None] * params.n
            grammar = job.request.grammar
            for i in range(params.n):
                gen = random.Random(params.seed + i) if params.seed is not None else None
                matcher = self.grammars().matcher(grammar) if grammar and self.grammars else None
                rows.append(Row(job=job, index=i, generator=gen, matcher=matcher))
        device = self.steps.device
        batch = build_prefill([r.job.request.prompt_token_ids for r in rows], self.pad, device)
        temps = torch.tensor([r.job.request.params.temperature for r in rows], device=device)  # [B']
        top_ps = torch.tensor([r.job.request.params.top_p for r in rows], device=device)  # [B']
        running = bool(self.rows)
        started = time.perf_counter()
        logits = self.steps.join(batch) if running else self.steps.prefill(batch)  # [B', V]
        self.counts.prefill_seconds += time.perf_counter() - started
        self.prefills_shared += batch.shared
        self.joined += len(jobs) if running else 0
        self.rows += rows
        if running:
            logits, temps = torch.cat([self.logits, logits]), torch.cat([self.temps, temps])
            top_ps = torch.cat([self.top_ps, top_ps])
        self.logits, self.temps, self.top_ps = logits, temps, top_ps

    def step(self) -> None:
        """Sample one token per row, let finished rows go, and run the decode forward of the others."""
        started = time.perf_counter()
        try:
            self._step()
        finally:
            self.counts.decode_seconds += time.perf_counter() - started

    def _step(self) -> None:
        rows = self.rows
        constrained = [b for b, row in enumerate(rows) if row.matcher is not None]
        allowed = self._allowed(constrained) if constrained else None  # [B, V] bool
        logprobs = sampling.process_logits(self.logits, self.temps, self.top_ps, allowed)  # [B, V]
        tokens = sampling.sample_tokens(logprobs, self.temps <= 0, [r.generator for r in rows], self.rng)  # [B]
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()  # [B]
        want_top = max(r.job.request.params.top_logprobs for r in rows)
        top_values, top_ids = sampling.top_logprobs(logprobs, want_top)  # [B, k] each
        token_list = tokens.tolist()
        forced: dict[int, list[int]] = {}  # row -> the tokens its grammar forces after the sampled one
        for b in constrained:
            matcher, row = rows[b].matcher, rows[b]
            matcher.consume_token(token_list[b])
            room = row.job.max_new - len(row.token_ids) - 1
            if self.steps.can_jump and room > 0 and not (matcher.is_stopped() or matcher.is_error()):
                run = matcher.compute_ff_tokens()[:room]
                if run and matcher.consume_tokens(run):
                    forced[b] = run
        keep: list[int] = []
        for b, row in enumerate(rows):
            k = row.job.request.params.top_logprobs
            top = sampling.finite_top(top_ids[b, :k].tolist(), top_values[b, :k].tolist()) if k else []
            self._record(row, token_list[b], chosen[b], top)
            for token in forced.get(b, ()):  # no choice was made: probability 1 under the grammar's mask
                self._record(row, token, 0.0, [(token, 0.0)] if k else [])
            if not self.finish(row):
                keep.append(b)
            else:  # its KV, for prompts that continue it (an agent's next turn)
                self.steps.keep(b, [*row.job.request.prompt_token_ids, *row.token_ids])
        if not keep:
            self.rows = []
            return
        if len(keep) < len(rows):  # finished rows leave the batch and the KV cache
            index = torch.tensor(keep, device=tokens.device)
            self.steps.select(index)
            tokens, self.temps, self.top_ps = tokens[index], self.temps[index], self.top_ps[index]
            self.rows = [rows[b] for b in keep]
        if any(b in forced for b in keep):
            self.logits = self.steps.decode_many([[token_list[b], *forced.get(b, ())] for b in keep])
        else:
            self.logits = self.steps.decode(tokens)

    @staticmethod
    def _record(row: Row, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        row.top.append(top)
        if row.job.streaming:
            row.job.post(TokenEvent(row.index, token, logprob, top))

    def _allowed(self, constrained: list[int]) -> torch.Tensor:
        """Which tokens each row may sample next [B, V]: everything, except in the rows ``constrained``, whose grammar
        decides. A matcher that allows nothing (an error it cannot leave) is logged and may only end its row."""
        grammars = self.grammars() if self.grammars else None
        assert grammars is not None, "rows with a grammar need the engine's grammars"
        rows = [self.rows[b] for b in constrained]
        masks = grammars.allowed([row.matcher for row in rows]).to(self.logits.device)  # [C, V]
        if not bool(masks.any(-1).all()):
            for c in (~masks.any(-1)).nonzero().flatten().tolist():
                log.error("grammar matcher stuck, ending the row: %s", rows[c].matcher.get_error())
                masks[c, grammars.eos] = True
        if len(constrained) == len(self.rows):
            return masks
        allowed = torch.ones(self.logits.shape, dtype=torch.bool, device=self.logits.device)
        allowed[torch.tensor(constrained, device=allowed.device)] = masks
        return allowed

    def fail(self, error: BaseException) -> None:
        """Hand ``error`` to every admitted job that has not finished."""
        for job in self.jobs:
            if not job.finished:
                job.post(error)
