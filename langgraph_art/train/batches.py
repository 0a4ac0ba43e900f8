"""The RL step's batch plumbing, pure functions of the tokenized sequences: micro-batches, their padded tensors,
loss weights for gradient accumulation and the shared prompt prefix."""

from __future__ import annotations

from typing import Any

import torch

from langgraph_art.train.tokenize import TrainSequence


def micro_batches(sequences: list[TrainSequence], size: int) -> list[list[TrainSequence]]:
    """Micro-batches of at most ``size`` sequences. Sequences with the same prompt (everything before their first
    trained token: a GRPO group's) go together, so that the trainer runs that prompt once per micro-batch
    (``PolicyForward.hidden``); what is left over of each prompt's sequences, by length (little padding)."""
    by_prompt: dict[tuple[int, ...], list[TrainSequence]] = {}
    for sequence in sorted(sequences, key=len):
        by_prompt.setdefault(tuple(sequence.input_ids[: first_trained_position([sequence])]), []).append(sequence)
    batches: list[list[TrainSequence]] = []
    rest: list[TrainSequence] = []
    for same in by_prompt.values():
        whole = len(same) - len(same) % size
        batches += [same[i : i + size] for i in range(0, whole, size)]
        rest += same[whole:]
    rest.sort(key=len)
    return batches + [rest[i : i + size] for i in range(0, len(rest), size)]


def batch_weight(
    loss_type: str, batch: list[TrainSequence], sequences: list[TrainSequence], tokens: int, total_tokens: int
) -> float:
    """Scale a micro-batch's loss so the accumulated gradient equals the loss over the whole step."""
    if loss_type in ("grpo", "gspo", "dr_grpo"):
        return len(batch) / len(sequences)
    return tokens / max(total_tokens, 1)


MIN_SHARED_PREFIX = 16  # below this a second forward call can cost more than the tokens it saves (2-layer tiny)


def shared_prefix(ids: torch.Tensor, limit: int) -> int:
    """How many leading columns (at most ``limit``) hold the same token in every row of ``ids`` [B, T]."""
    same = (ids[:, :limit] == ids[:1, :limit]).all(0)  # [limit]
    return int(same.long().cumprod(0).sum())


def first_trained_position(batch: list[TrainSequence]) -> int:
    """The earliest position any sequence of the micro-batch trains on (>= 1: token 0 has no prediction)."""
    return max(1, min(seq.mask.index(1) for seq in batch))


def batch_tensors(batch: list[TrainSequence], pad: int, device: Any) -> tuple[torch.Tensor, ...]:
    """Right-padded [B, T] tensors: ids (pad id in padding), loss mask, sampler logprobs, advantages; and the
    sampling temperature per sequence [B].

    No attention mask: with right padding under causal attention, a real token only attends to the real tokens
    before it, never to the padding after it, so the model runs the plain causal path (no [B, T, T] mask).
    Positions are 0..T-1 for every row, which is also right. What the padding computes is masked out of the loss.
    """
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width))
    old = torch.zeros((len(batch), width))
    adv = torch.zeros((len(batch), width))
    for row, seq in enumerate(batch):
        n = len(seq)
        ids[row, :n] = torch.tensor(seq.input_ids)
        mask[row, :n] = torch.tensor(seq.mask, dtype=torch.float)
        old[row, :n] = torch.tensor(seq.old_logprobs)
        adv[row, :n] = torch.tensor(seq.advantages)
    temp = torch.tensor([s.temperature for s in batch])
    return tuple(t.to(device) for t in (ids, mask, old, adv, temp))
