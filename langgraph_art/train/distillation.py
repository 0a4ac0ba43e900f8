"""On-policy distillation: a teacher's logprobs of the student's own sampled tokens as a per-token advantage
(pure functions, hand-checkable).

The student samples; the teacher scores each sampled token ``o_t`` in its own context (the same prompt, or a
privileged one that shows what the student is not shown). The per-token reverse KL to the teacher,
``log pi_student(o_t) - log pi_teacher(o_t)``, estimated on the student's samples, is a cost: each token's advantage
gets ``coef * (log pi_teacher(o_t) - log pi_student(o_t))`` added to the reward's group advantage (the Tinker
cookbook's and verl's on-policy distillation recipe, with a discount of 0). ``log pi_student`` is the sampler's
logprob (the one returned with the token); both are at the turn's sampling temperature. The policy loss then masks
the tokens it always masks (prompt, tool results, other nodes' turns, tokens a grammar forced, padding), so the
teacher's term reaches exactly the tokens the reward's does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from langgraph_art.types import Turn


def reverse_kl_advantages(
    advantage: float, sampler: Sequence[float], teacher: Sequence[float], coef: float
) -> list[float]:
    """Each sampled token's advantage [n]: the run's (or node's) ``advantage`` plus ``coef * (teacher - sampler)``.

    sampler: [n], the sampler's logprobs of the turn's tokens; teacher: [n], the teacher's of the same tokens.
    """
    if len(sampler) != len(teacher):
        raise ValueError(f"the teacher scored {len(teacher)} tokens of a turn of {len(sampler)}")
    return [advantage + coef * (t - s) for s, t in zip(sampler, teacher, strict=True)]


def teacher_metrics(
    sampler: Sequence[float],
    teacher: Sequence[float],
    reward_advantages: Sequence[float],
    coef: float,
    seconds: float,
    agreement: float | None = None,
) -> dict[str, float]:
    """The step's ``train/teacher/*`` metrics over its trained tokens [n]: the reverse KL to the teacher per token
    (``sampler - teacher``, its mean: a k1 estimate on the student's samples), the teacher's share of the advantage
    (sum of ``|coef * (teacher - sampler)|`` over that plus the sum of ``|reward advantage|``), the teacher's
    seconds, and ``reward_agreement`` when there is one."""
    tokens = max(len(sampler), 1)
    kl = sum(s - t for s, t in zip(sampler, teacher, strict=True)) / tokens
    from_teacher = sum(abs(coef * (t - s)) for s, t in zip(sampler, teacher, strict=True))
    from_reward = sum(abs(a) for a in reward_advantages)
    total = from_teacher + from_reward
    return {
        "train/teacher/kl": kl,
        "train/teacher/advantage_share": from_teacher / total if total else 0.0,
        "train/teacher/tokens": float(len(sampler)),
        "train/teacher/seconds": seconds,
        **({"train/teacher/reward_agreement": agreement} if agreement is not None else {}),
    }


def reward_agreement(groups: Sequence[Sequence[tuple[float, float]]]) -> float | None:
    """Whether the teacher and the reward prefer the same runs: the Pearson correlation, over the runs of groups
    whose rewards differ, between a run's reward advantage and its teacher term (``coef * (teacher - sampler)``
    summed over its trained tokens), the teacher term centred within its group as the reward's is. None when there
    are fewer than 2 such runs or either side does not vary.

    groups: per group [runs], each run ``(reward advantage, teacher term)``. Near 1: the teacher ranks a scenario's
    runs as the reward does, and its dense signal adds detail to the same direction; near 0 or below: it teaches
    something the reward does not measure (a format, a value the reward also accepts), and pulls against it.
    """
    pairs: list[tuple[float, float]] = []
    for runs in groups:
        if len(runs) < 2 or max(a for a, _ in runs) - min(a for a, _ in runs) < 1e-9:
            continue  # a uniform group: no ranking by the reward to agree with
        mean = statistics.fmean(t for _, t in runs)
        pairs += [(a, t - mean) for a, t in runs]
    try:
        return statistics.correlation([a for a, _ in pairs], [t for _, t in pairs])
    except statistics.StatisticsError:  # fewer than 2 runs, or one side constant
        return None


def served_logprobs(turn: Turn, teacher: str | None) -> list[float]:
    """A served teacher's logprobs [n] of the turn's n sampled tokens, as the service wrote them on the turn before
    the step (``Turn.teacher_logprobs``); ValueError naming the turn when they are missing or of another length."""
    logprobs = turn.teacher_logprobs
    if logprobs is None:
        raise ValueError(
            f"turn {turn.id} carries no logprobs of the served teacher {teacher!r}: the service that trains scores "
            "each turn before the step (PolicyRegistry(score_teacher=...), as build_service makes it); a trainer "
            "used on its own holds only teacher_model='base' or 'policy'"
        )
    if len(logprobs) != len(turn.token_ids):
        raise ValueError(
            f"turn {turn.id}: the served teacher {teacher!r} scored {len(logprobs)} tokens of {len(turn.token_ids)}"
        )
    return list(logprobs)
