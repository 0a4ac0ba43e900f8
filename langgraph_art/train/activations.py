"""How much memory a micro-batch's activations take without gradient checkpointing, and whether they fit.

Gradient checkpointing keeps each layer's input only and runs the forward again in backward: with the base frozen
(LoRA), a backward costs about one forward, so checkpointing makes the update ~1.5x slower, and it rules out the
shared-prompt forward. It is worth that where memory is the limit, which on CPU depends on the step, not the model:
8 runs x 32 tokens of Qwen2.5-0.5B save ~1.5 GB for backward, 8 runs x 800 tokens ~28 GB. So on CPU, with
``gradient_checkpointing=None``, the trainer estimates each micro-batch's activations (``forwarded_tokens`` x
``bytes_per_token``) and trains without checkpointing when they fit in ``ACTIVATION_SHARE`` of the memory available
at the step's start, splitting a micro-batch that does not fit into smaller ones that do (the same update: each
part's loss is weighted as before). Only when a single sequence does not fit does the step checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langgraph_art.train.tokenize import TrainSequence

ACTIVATION_SHARE = 0.5  # of the memory available at the step's start (the rest: allocator slack, the LM head, the OS)


def bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes a decoder layer stack saves for backward per token, estimated from the model's shape as
    ``layers x (6 x intermediate + 18 x hidden) x element_size``: fitted to Qwen2.5-0.5B's shape in float32, which
    measured 4.4 MB a token (24 layers, hidden 896, intermediate 4864: the formula gives 4.35 MB). Attention's [T, T]
    weights are not saved (torch's CPU attention keeps a log-sum-exp per row), so the estimate is linear in tokens."""
    hidden = int(config.hidden_size)
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    return int(config.num_hidden_layers) * (6 * intermediate + 18 * hidden) * element_size


def forwarded_tokens(batch: Sequence[TrainSequence]) -> int:
    """Tokens the micro-batch's forward runs over: its rows padded to the longest, the prompt every row shares (before
    its first trained token) once (``PolicyForward.hidden``)."""
    width, rows = max(len(s) for s in batch), len(batch)
    limit = max(1, min(s.mask.index(1) for s in batch)) - 1
    first = batch[0].input_ids
    shared = next((i for i in range(limit) if any(s.input_ids[i] != first[i] for s in batch[1:])), limit)
    shared = shared if rows > 1 else 0
    return shared + rows * (width - shared)


def available_bytes() -> int | None:
    """The memory the kernel says can be given to a process without swapping (/proc/meminfo's MemAvailable); None
    where that cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fit_micro_batches(
    batches: list[list[TrainSequence]], per_token: int, budget: int
) -> tuple[list[list[TrainSequence]], bool]:
    """``batches`` with each micro-batch whose activations (``forwarded_tokens x per_token``) exceed ``budget`` split
    into consecutive parts that fit, and False; or ``batches`` unchanged and True (checkpoint) when some single
    sequence does not fit alone."""
    if any(forwarded_tokens([s]) * per_token > budget for batch in batches for s in batch):
        return batches, True
    fitted: list[list[TrainSequence]] = []
    for batch in batches:
        part: list[TrainSequence] = []
        for sequence in batch:
            if part and forwarded_tokens([*part, sequence]) * per_token > budget:
                fitted.append(part)
                part = []
            part.append(sequence)
        fitted.append(part)
    return fitted, False
