"""On-policy distillation: the reverse-KL advantage and its metrics by hand, the teacher's logprobs in the trainer
(a teacher shown the same prompt as the sampler agrees with it; a privileged prompt moves the advantage exactly as
the formula says), uniform groups that learn only from the teacher, and ``Trainer(teacher=...)`` end to end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import langgraph_art as art  # noqa: E402
from langgraph_art.config import GRPOConfig  # noqa: E402
from langgraph_art.errors import ConfigError  # noqa: E402
from langgraph_art.train.advantages import group_advantages  # noqa: E402
from langgraph_art.train.distillation import (  # noqa: E402
    reverse_kl_advantages,
    reward_agreement,
    teacher_metrics,
)
from langgraph_art.train.tokenize import build_sequences  # noqa: E402
from langgraph_art.types import Trajectory, TrajectoryGroup  # noqa: E402

L = math.log


def test_the_reverse_kl_advantage_by_hand() -> None:
    sampler, teacher = [L(0.5), L(0.25), L(0.9)], [L(0.25), L(0.25), L(0.3)]
    got = reverse_kl_advantages(0.5, sampler, teacher, coef=2.0)
    assert got == pytest.approx([0.5 + 2 * L(0.5), 0.5, 0.5 + 2 * L(1 / 3)])  # 2 * log(teacher / sampler)
    assert reverse_kl_advantages(-1.0, sampler, sampler, coef=3.0) == [-1.0] * 3  # a teacher that agrees adds 0
    with pytest.raises(ValueError, match="scored 2 tokens of a turn of 3"):
        reverse_kl_advantages(0.0, sampler, teacher[:2], coef=1.0)


def test_the_teacher_metrics_by_hand() -> None:
    sampler, teacher = [L(0.5), L(0.25)], [L(0.25), L(0.25)]
    metrics = teacher_metrics(sampler, teacher, reward_advantages=[1.0, 1.0], coef=1.0, seconds=0.5)
    assert metrics["train/teacher/kl"] == pytest.approx(L(2) / 2)  # mean of sampler - teacher: (ln 2 + 0) / 2
    assert metrics["train/teacher/advantage_share"] == pytest.approx(L(2) / (L(2) + 2.0))
    assert metrics["train/teacher/tokens"] == 2 and metrics["train/teacher/seconds"] == 0.5


def test_the_reward_agreement_by_hand() -> None:
    # (reward advantage, teacher term) per run; the teacher term is centred within its group: [2, 0, 1] -> [1, -1, 0]
    three = [(1.0, 2.0), (0.0, 0.0), (-1.0, 1.0)]
    assert reward_agreement([three]) == pytest.approx(0.5)  # cov 1 / sqrt(2 * 2)
    agrees, disagrees = [(1.0, 3.0), (-1.0, 1.0)], [(1.0, -1.0), (-1.0, 1.0)]
    uniform = [(0.0, 9.0), (0.0, -9.0)]  # the reward ranks nothing here: left out
    assert reward_agreement([agrees, uniform]) == pytest.approx(1.0)
    assert reward_agreement([disagrees]) == pytest.approx(-1.0)
    assert reward_agreement([agrees, disagrees]) == pytest.approx(0.0)
    assert reward_agreement([uniform]) is None and reward_agreement([[(1.0, 0.0), (-1.0, 0.0)]]) is None  # no variance
    assert "train/teacher/reward_agreement" not in teacher_metrics([0.0], [0.0], [0.0], coef=1.0, seconds=0.0)


def test_a_uniform_group_is_kept_at_zero_advantage_for_a_teacher() -> None:
    runs = [Trajectory(id=f"r{i}", status="ok", reward=1.0) for i in range(3)]
    group = TrajectoryGroup(id="g", trajectories=runs)
    skipped = group_advantages([group])
    assert skipped.by_trajectory == {} and skipped.skipped == {"group with all-equal rewards": 3}
    kept = group_advantages([group], keep_uniform=True)
    assert kept.by_trajectory == {"r0": 0.0, "r1": 0.0, "r2": 0.0} and kept.skipped == {}


def test_the_config_and_the_teacher_check_their_values() -> None:
    with pytest.raises(ConfigError, match=r"teacher_kl_coef=-1\.0"):
        GRPOConfig(teacher_kl_coef=-1.0)
    with pytest.raises(ConfigError, match="teacher_model="):
        GRPOConfig(teacher_model=7)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Teacher\(model=None\): use 'base'"):
        art.Teacher(model=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Teacher\(prompt=...\) must be a function"):
        art.Teacher(prompt="be smart")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Teacher\(model='policy'\) without a prompt .* teaches nothing"):
        art.Teacher(model="policy")


# -- in the trainer ---------------------------------------------------------------------------------------------


def trainer_with(tiny_path: Path, tmp_path: Path, **config: Any) -> Any:
    from langgraph_art.train.trainer import GRPOTrainer

    return GRPOTrainer(str(tiny_path), GRPOConfig(learning_rate=1e-2, **config), checkpoint_dir=tmp_path / "t")


def test_a_base_teacher_on_the_samplers_prompt_agrees_and_a_privileged_one_does_not(
    tiny_path: Path, tmp_path: Path
) -> None:
    """The turns are sampled by the untrained policy (the LoRA's B is 0: the base model), so the base model shown
    the same prompt gives the sampler's logprobs: KL 0, no share of the advantage. Shown another prompt it scores
    the same tokens otherwise, and each token's advantage moves by exactly (teacher - sampler)."""
    from tests.test_trainer import make_group

    trainer = trainer_with(tiny_path, tmp_path, teacher_model="base", teacher_kl_coef=1.0)
    group = make_group(trainer, [1.0, 0.0, 0.5, 0.25])
    runs = group.trajectories
    advantages = group_advantages([group], keep_uniform=True)
    same, stats = trainer._teach([group], advantages)
    for run in runs:
        turn = run.spans[0].turns[0]
        assert same[turn.id] == pytest.approx(turn.logprobs, abs=1e-5)
    assert abs(stats["train/teacher/kl"]) < 1e-6 and stats["train/teacher/advantage_share"] < 1e-5
    assert stats["train/teacher/tokens"] == 32
    for run in runs:  # a privileged prompt: the answer in a system message
        turn = run.spans[0].turns[0]
        turn.messages = [{"role": "user", "content": "question"}]
        turn.teacher_messages = [{"role": "system", "content": "The answer is 42."}, *turn.messages]
    shown, stats = trainer._teach([group], advantages)
    assert stats["train/teacher/advantage_share"] > 0.01
    turns = [r.spans[0].turns[0] for r in runs]
    terms = [sum(t - s for t, s in zip(shown[u.id], u.logprobs, strict=True)) for u in turns]
    by_hand = reward_agreement([[(advantages.by_trajectory[r.id], t) for r, t in zip(runs, terms, strict=True)]])
    assert by_hand is not None and stats["train/teacher/reward_agreement"] == pytest.approx(by_hand, abs=1e-4)
    turn = runs[0].spans[0].turns[0]
    assert max(abs(a - b) for a, b in zip(shown[turn.id], turn.logprobs, strict=True)) > 1e-3
    sequences = build_sequences(runs, advantages, trainer.tokenizer, teacher=shown, teacher_kl_coef=0.5)
    first = next(s for s in sequences if s.trajectory_id == runs[0].id)
    trained = [a for a, m in zip(first.advantages, first.mask, strict=True) if m]
    base = advantages.by_trajectory[runs[0].id]
    expected = [base + 0.5 * (t - s) for s, t in zip(turn.logprobs, shown[turn.id], strict=True)]
    assert trained == pytest.approx(expected)


def test_a_group_whose_runs_all_scored_the_same_learns_only_from_a_teacher(tiny_path: Path, tmp_path: Path) -> None:
    from tests.test_trainer import make_group

    alone = trainer_with(tiny_path, tmp_path / "alone")
    assert not alone.step([make_group(alone, [1.0, 1.0, 1.0, 1.0])]).updated  # GRPO: nothing to learn
    weightless = trainer_with(tiny_path, tmp_path / "weightless", teacher_model="base", teacher_kl_coef=0.0)
    assert not weightless.step([make_group(weightless, [1.0, 1.0, 1.0, 1.0])]).updated  # a teacher weighing 0
    taught = trainer_with(tiny_path, tmp_path / "taught", teacher_model="policy")
    group = make_group(taught, [1.0, 1.0, 1.0, 1.0])
    for run in group.trajectories:
        turn = run.spans[0].turns[0]
        turn.messages = [{"role": "user", "content": "question"}]
        turn.teacher_messages = [{"role": "system", "content": "Answer in digits."}, *turn.messages]
    before = {n: p.detach().clone() for n, p in taught.named_lora_parameters().items()}
    result = taught.step([group])
    assert result.updated and result.metrics["train/teacher/advantage_share"] == pytest.approx(1.0)
    assert result.metrics["train/teacher/kl"] != 0 and result.metrics["train/teacher/seconds"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in taught.named_lora_parameters().items())


# -- Trainer(teacher=...) end to end -----------------------------------------------------------------------------


def test_the_trainer_shows_its_teacher_a_privileged_prompt_and_keeps_it_with_the_runs(tmp_path: Path) -> None:
    from langgraph_art.testing import digit_share, one_agent_graph

    seen: list[tuple[dict, list]] = []

    def with_hint(scenario: dict, messages: list[dict]) -> list[dict]:
        seen.append((scenario, messages))
        return [{"role": "system", "content": f"Write the digits {scenario['digits']}."}, *messages]

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="taught", project="distill").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)  # type: ignore[call-arg,arg-type]
        teacher = art.Teacher(model="policy", prompt=with_hint, kl_coef=0.5)
        trainer = art.Trainer(
            one_agent_graph(llm), model, rewards=[art.reward(digit_share, name="digits")], num_generations=4,
            config=GRPOConfig(learning_rate=1e-3), teacher=teacher,
        )  # fmt: skip
        assert trainer.config.teacher_model == "policy" and trainer.config.teacher_kl_coef == 0.5
        scenarios = [{"id": "n", "digits": "123", "input": {"messages": [("user", "Write some numbers.")]}}]
        history = trainer.train(scenarios, steps=2, progress=False)
        assert all(m["train/updated"] for m in history)  # uniform groups too: the teacher still teaches
        assert all("train/teacher/kl" in m and m["train/teacher/tokens"] > 0 for m in history)
        assert len(seen) == 8 and seen[0][0]["digits"] == "123" and seen[0][1][-1]["role"] == "user"
        stored = [turn for run in trainer.store.trajectories() for turn in run.turns()]
        assert len(stored) == 8 and all("123" in (t.teacher_messages or [{}])[0]["content"] for t in stored)
        with pytest.raises(ConfigError, match="teacher_model='base'\\) and Teacher\\(model='policy'\\) differ"):
            art.Trainer(one_agent_graph(llm), model, rewards=[art.reward(digit_share, name="digits")],
                        config=GRPOConfig(teacher_model="base"), teacher=teacher)  # fmt: skip


def test_a_privileged_prompt_that_returns_no_messages_says_so(tmp_path: Path) -> None:
    from langgraph_art.teacher import show_teacher
    from langgraph_art.types import NodeSpan, Turn

    turn = Turn(id="t", messages=[{"role": "user", "content": "hi"}], token_ids=[1], logprobs=[-0.1])
    run = Trajectory(id="r", status="ok", spans=[NodeSpan(id="s", name="agent", turns=[turn])])
    group = TrajectoryGroup(id="g", trajectories=[run], scenario={"answer": 4})
    with pytest.raises(ConfigError, match=r"must return a list of messages.*'the answer is 4'"):
        show_teacher([group], lambda scenario, messages: f"the answer is {scenario['answer']}")  # type: ignore[arg-type,return-value]
    show_teacher([group], lambda scenario, messages: [{"role": "system", "content": "4"}, *messages])
    assert turn.teacher_messages == [{"role": "system", "content": "4"}, {"role": "user", "content": "hi"}]
