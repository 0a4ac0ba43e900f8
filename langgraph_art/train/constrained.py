"""Turns sampled under a grammar (structured output, forced tool calls): the masks they were sampled under, rebuilt.

A turn carries its grammar, not its masks (a packed mask is V/8 bytes per token: 19 KB on a 150k vocabulary). The
trainer replays the grammar over the turn's own token ids with llguidance (``Grammars.replay``), which gives, token
by token, the mask the sampler had, the same in both engines. A token its replayed mask does not allow means the turn
was sampled under something else (another tokenizer, an engine that ignored the grammar): that turn is trained
without a mask, counted in ``train/grammar/mismatched_turns`` and logged once per step.

Why masks in the loss at all: the sampler drew from the policy renormalised over the allowed tokens, ``pi(a) / Z``
with ``Z`` the mass the policy puts inside the mask, and reported that logprob. Against the unmasked policy the
importance ratio starts at ``Z`` instead of 1 (clipped whenever ``Z < 1 - epsilon``), and a forced token, whose
sampling involved no choice, gets a gradient pushing the format up after good runs and down after bad ones.
``GRPOConfig(constrained_logprobs="unmasked")`` trains that way anyway, for comparison
(docs/guides/structured-output.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from langgraph_art.train.loss import GrammarMasks
from langgraph_art.train.tokenize import TrainSequence

log = logging.getLogger(__name__)


def replay_grammars(sequences: Sequence[TrainSequence], grammars: Any) -> tuple[int, int]:
    """Fill each sequence's ``allowed`` with the masks of its constrained turns and take the tokens their grammar
    forced (jump-forward: no choice, logprob 0) out of the loss mask. Returns how many turns did not replay
    (trained unmasked) and how many forced tokens were taken out."""
    mismatched = forced = 0
    for sequence in sequences:
        sequence.allowed = []
        for start, length, grammar in sequence.grammars:
            ids = sequence.input_ids[start : start + length]  # fewer when max_length cut the sequence there
            replay = grammars.replay(grammar, ids) if ids else None
            if replay is None:
                mismatched += bool(ids)
                continue
            sequence.allowed.append((start, replay.packed))
            for offset in (i for i, yes in enumerate(replay.forced) if yes):
                forced += sequence.mask[start + offset]
                sequence.mask[start + offset] = 0
    if mismatched:
        log.warning("%d constrained turn(s) do not follow their grammar here: trained without the mask", mismatched)
    return mismatched, forced


def batch_grammar_masks(batch: Sequence[TrainSequence], first: int, device: Any) -> GrammarMasks | None:
    """The micro-batch's replayed masks in target coordinates (column ``p - first`` for sequence position ``p``), or
    None when none of its sequences has a constrained turn."""
    rows, cols, packs = [], [], []
    for row, sequence in enumerate(batch):
        for start, packed in sequence.allowed:
            positions = torch.arange(start, start + packed.shape[0])
            keep = (positions >= first) & (positions < len(sequence))  # cut by max_length, or before any training
            rows.append(torch.full((int(keep.sum()),), row, dtype=torch.long))
            cols.append(positions[keep] - first)
            packs.append(packed[keep])
    if not rows:
        return None
    return GrammarMasks(torch.cat(rows).to(device), torch.cat(cols).to(device), torch.cat(packs).to(device))


def grammar_mass(masks: GrammarMasks, mask: torch.Tensor, log_mass: torch.Tensor) -> tuple[float, float]:
    """How many trained tokens [B, T] ``mask`` has under a grammar, and the sum over them of the probability the
    policy put inside the grammar's mask (``exp(log_mass)``, [B, T]): for ``train/grammar/mass``."""
    under = torch.zeros_like(mask, dtype=torch.bool)
    under[masks.rows, masks.cols] = True
    under &= mask.bool()
    return float(under.sum()), float(log_mass[under].exp().sum())
