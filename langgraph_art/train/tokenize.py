"""Trajectories -> token sequences for training, from the exact sampled ids (generated text is never re-tokenized).

For each trainable turn the sequence is the prompt ids the server rendered (``prompt_token_ids``; rendered
here with the chat template only for turns that lack them) followed by the sampled ``token_ids``. The loss mask
is 1 exactly on sampled tokens of trainable turns. When a turn's prompt starts with the previous turn's whole
sequence (an agent loop: the next call sees the previous answer plus tool results), the two become one sequence,
so a multi-turn conversation trains as one; a turn that does not continue a sequence starts its own (several
agents give one sequence each). Sequences longer than ``max_length`` are cut at ``max_length``, with a warning
and a count: the cut tokens are not trained on.

A turn sampled under a grammar (structured output, a forced tool call) is noted in ``TrainSequence.grammars`` with
where its tokens start, so the trainer can rebuild the masks it was sampled under; the tokens the server appended to
close a structure (``Turn.closing_tokens``) stay in the sequence as context but are not trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph_art.train.advantages import Advantages
from langgraph_art.train.distillation import reverse_kl_advantages
from langgraph_art.types import Trajectory, Turn

log = logging.getLogger(__name__)


@dataclass
class TrainSequence:
    """Aligned per position: ``input_ids``, ``mask`` (1 = sampled token trained on), the sampler's logprob and the
    advantage of each trained token (0 elsewhere)."""

    input_ids: list[int]
    mask: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    temperature: float
    trajectory_id: str
    turns: int = 1
    grammars: list[tuple[int, int, str]] = field(default_factory=list)  # a constrained turn: (start, tokens, grammar)
    allowed: list[tuple[int, Any]] = field(default_factory=list)  # the trainer's replay: (index, packed masks [n, W])

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class TokenizeReport:
    skipped: dict[str, int] = field(default_factory=dict)
    truncated_tokens: int = 0

    def skip(self, reason: str, count: int = 1) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + count


def _sampling_temperature(turn: Turn) -> float:
    value = turn.params.get("temperature")
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0  # greedy: raw logprobs


def _rendered(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tokenizer: Any) -> list[int]:
    """``messages`` (and ``tools``) as the chat template renders a prompt, ready for the answer."""
    ids = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


def _prompt_ids(turn: Turn, tokenizer: Any) -> list[int]:
    return list(turn.prompt_token_ids) if turn.prompt_token_ids else _rendered(turn.messages, turn.tools, tokenizer)


def build_sequences(
    trajectories: Iterable[Trajectory],
    advantages: Advantages,
    tokenizer: Any,
    *,
    nodes: Iterable[str] | None = None,
    max_length: int = 4096,
    report: TokenizeReport | None = None,
    teacher: Mapping[str, list[float]] | None = None,
    teacher_kl_coef: float = 0.0,
) -> list[TrainSequence]:
    """Sequences of every trajectory that has an advantage; ``nodes`` limits training to those nodes' turns.
    ``teacher``: a teacher's logprobs of each turn's sampled tokens, by turn id; a token's advantage then adds
    ``teacher_kl_coef * (teacher - sampler)`` logprob (``train/distillation.py``)."""
    report = report if report is not None else TokenizeReport()
    wanted = list(nodes) if nodes is not None else None
    sequences: list[TrainSequence] = []
    for trajectory in trajectories:
        of_turn = advantages.of_turns(trajectory)
        all_turns = trajectory.turns(wanted)
        usable = trajectory.trainable_turns(wanted)
        report.skip("turn without token ids (not sampled by ChatART): context only", len(all_turns) - len(usable))
        open_sequences: list[TrainSequence] = []
        for turn in usable:
            advantage = of_turn.get(turn.id)
            if advantage is None:
                continue
            prompt = _prompt_ids(turn, tokenizer)
            temperature = _sampling_temperature(turn)
            target = next(
                (
                    s
                    for s in reversed(open_sequences)
                    if s.temperature == temperature and prompt[: len(s)] == s.input_ids
                ),
                None,
            )
            if target is None:
                target = TrainSequence([], [], [], [], temperature, trajectory.id, turns=0)
                open_sequences.append(target)
            context = prompt[len(target) :]
            if turn.grammar is not None:
                target.grammars.append((len(target) + len(context), len(turn.token_ids), turn.grammar))
            sampled = len(turn.token_ids) - min(turn.closing_tokens, len(turn.token_ids))
            target.input_ids += context + turn.token_ids
            target.mask += [0] * len(context) + [1] * sampled + [0] * (len(turn.token_ids) - sampled)
            target.old_logprobs += [0.0] * len(context) + list(turn.logprobs)
            scored = teacher.get(turn.id) if teacher is not None else None
            per_token = (
                reverse_kl_advantages(advantage, turn.logprobs, scored, teacher_kl_coef)
                if scored is not None
                else [advantage] * len(turn.token_ids)
            )
            target.advantages += [0.0] * len(context) + per_token
            target.turns += 1
        for sequence in open_sequences:
            if len(sequence) > max_length:
                cut = sum(sequence.mask[max_length:])
                report.truncated_tokens += cut
                log.warning(
                    "a sequence of %d tokens was cut to max_length=%d (%d sampled tokens not trained on)",
                    len(sequence),
                    max_length,
                    cut,
                )
                for name in ("input_ids", "mask", "old_logprobs", "advantages"):
                    setattr(sequence, name, getattr(sequence, name)[:max_length])
            if sum(sequence.mask) > 0:
                sequences.append(sequence)
    return sequences


def teacher_sequences(
    trajectories: Iterable[Trajectory], tokenizer: Any, *, nodes: Iterable[str] | None = None
) -> list[tuple[Turn, TrainSequence]]:
    """What a teacher scores: each trainable turn's sampled tokens after the teacher's prompt (the turn's
    ``teacher_messages`` rendered with the chat template and the turn's tools, else the turn's own prompt ids),
    one sequence per turn, its sampled tokens masked in; a turn sampled under a grammar keeps it, so the teacher's
    logprobs are taken under the same mask as the student's."""
    wanted = list(nodes) if nodes is not None else None
    out = []
    for trajectory in trajectories:
        for turn in trajectory.trainable_turns(wanted):
            if turn.teacher_messages is not None:
                prompt = _rendered(turn.teacher_messages, turn.tools, tokenizer)
            else:
                prompt = _prompt_ids(turn, tokenizer)
            n = len(turn.token_ids)
            sequence = TrainSequence(
                prompt + list(turn.token_ids), [0] * len(prompt) + [1] * n, [0.0] * (len(prompt) + n),
                [0.0] * (len(prompt) + n), _sampling_temperature(turn), trajectory.id,
            )  # fmt: skip
            if turn.grammar is not None:
                sequence.grammars.append((len(prompt), n, turn.grammar))
            out.append((turn, sequence))
    return out
