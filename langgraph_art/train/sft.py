"""Supervised warm-up on the same LoRA as RL (the SFT-then-RL flow): from chat conversations or stored
trajectories, with the loss on assistant tokens only.

Conversations (``{"messages": [...], "tools": [...]}``) are rendered with the model's chat template; each
assistant message's tokens are found by rendering the conversation up to it with and without it, so only what
the assistant said (and its end-of-turn token) is trained on. Trajectories train on their exact sampled ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from langgraph_art.errors import TrainingAborted
from langgraph_art.train.advantages import Advantages
from langgraph_art.train.batches import batch_tensors, first_trained_position
from langgraph_art.train.loss import masked_mean
from langgraph_art.train.protocol import SFTExample
from langgraph_art.train.tokenize import TrainSequence, build_sequences
from langgraph_art.types import Trajectory


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=prompt, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


def conversation_sequence(tokenizer: Any, conversation: dict[str, Any], max_length: int) -> TrainSequence:
    messages, tools = conversation["messages"], conversation.get("tools")
    full = _render(tokenizer, messages, tools, prompt=False)
    mask = [0] * len(full)
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:index], tools, prompt=True)
        through = _render(tokenizer, messages[: index + 1], tools, prompt=False)
        if full[: len(through)] != through or through[: len(before)] != before:
            raise ValueError(
                f"the chat template does not render message {index} as a continuation; "
                "SFT needs a template whose renderings extend each other (ChatML does)"
            )
        for position in range(len(before), len(through)):
            mask[position] = 1
    full, mask = full[:max_length], mask[:max_length]
    return TrainSequence(full, mask, [0.0] * len(full), [0.0] * len(full), 1.0, "sft")


def sft_sequences(
    tokenizer: Any, examples: Iterable[SFTExample], *, nodes: Sequence[str] | None, max_length: int
) -> list[TrainSequence]:
    sequences: list[TrainSequence] = []
    trajectories: list[Trajectory] = []
    for example in examples:
        if isinstance(example, Trajectory):
            trajectories.append(example)
        elif isinstance(example, dict) and isinstance(example.get("messages"), list):
            sequences.append(conversation_sequence(tokenizer, example, max_length))
        else:
            raise ValueError(
                f"SFT examples are {{'messages': [...], 'tools': [...]}} dicts or Trajectory objects, "
                f"got {example!r:.120}"
            )
    everyone = Advantages(by_trajectory={t.id: 1.0 for t in trajectories})
    sequences += build_sequences(trajectories, everyone, tokenizer, nodes=nodes, max_length=max_length)
    for sequence in sequences:
        sequence.temperature = 1.0  # SFT fits the untempered distribution
    return [s for s in sequences if sum(s.mask)]


def sft_loss(trainer: Any, batch: list[TrainSequence]) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood of the masked tokens of one micro-batch, and how many there were. Through the
    RL step's own logprob path (``PolicyForward``, under the trainer's config): the LM head only on the trained
    positions, in chunks, so no [batch, tokens, vocabulary] tensor is built."""
    ids, mask, _, _, temp = batch_tensors(batch, trainer.tokenizer.pad_token_id, trainer.device)  # [B, T] each
    first = first_trained_position(batch)
    mask = mask[:, first:]  # [B, T-first]
    logprobs = trainer._token_logprobs(ids, first, ids[:, first:], temp, trained=mask.bool())[0]  # [B, T-first]
    return -masked_mean(logprobs, mask), int(mask.sum())


def sft_steps(trainer: Any, sequences: list[TrainSequence], steps: int, learning_rate: float) -> list[float]:
    """``steps`` updates of ``trainer``'s LoRA (a ``GRPOTrainer`` in training mode), each on the next
    ``per_device_train_batch_size`` sequences (cycling), with its own AdamW so the RL optimizer's moments are not
    disturbed; the loss of each step (mean NLL over the step's trained tokens). Over several training ranks each
    runs a share of the step's sequences and their gradients are summed (``train/ranks.py``): the same update."""
    optimizer = torch.optim.AdamW(trainer.trainable_parameters(), lr=learning_rate)
    size, losses = trainer.config.per_device_train_batch_size, []
    for index in range(steps):
        start = (index * size) % len(sequences)
        batch = (sequences + sequences)[start : start + size]
        tokens = sum(sum(s.mask[first_trained_position([s]) :]) for s in batch)  # the step's, on every rank
        optimizer.zero_grad(set_to_none=True)
        summed = 0.0
        for part in trainer.ranks.share([batch]):  # one rank: the whole batch
            loss, _ = sft_loss(trainer, part)
            part_tokens = sum(sum(s.mask[first_trained_position([s]) :]) for s in part)
            (loss * (part_tokens / tokens)).backward()  # this share of the step's mean
            summed += loss.item() * part_tokens
        (total,) = trainer.ranks.sum_gradients(trainer.trainable_parameters(), [summed])
        if not math.isfinite(total):
            optimizer.zero_grad(set_to_none=True)
            raise TrainingAborted(f"SFT step {index + 1}: non-finite loss; lower the learning rate")
        torch.nn.utils.clip_grad_norm_(trainer.trainable_parameters(), trainer.config.max_grad_norm)
        optimizer.step()
        losses.append(total / tokens)
    return losses
