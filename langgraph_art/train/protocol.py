"""A policy's trainer as every caller sees it: ``PolicyTrainer``, what makes one (``TrainerFactory``), and what it is
made from (``TrainerInit``, the same in this process, a child process or on every rank).

``GRPOTrainer`` (in this process), ``ProcessTrainer`` (in child processes, one per data-parallel rank) and
``LeadingTrainer`` (rank 0 of a group that torchrun started) all satisfy ``PolicyTrainer``, and so does a test's
fake; ``PolicyRegistry`` and the backends type against it, never against a class. Which class a service builds is
decided in one place, ``train/factory.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypedDict

from langgraph_art.config import GRPOConfig
from langgraph_art.types import StepResult, Trajectory, TrajectoryGroup

Conversation = Mapping[str, object]  # {"messages": [OpenAI message dicts], "tools": [OpenAI tools]}: learn its replies
SFTExample = Trajectory | Conversation  # a stored run is learned from its exact sampled ids


class PolicyTrainer(Protocol):
    """One policy's LoRA trainer: GRPO steps, SFT warm-ups and atomic checkpoints under its checkpoint folder."""

    @property
    def step_count(self) -> int:
        """The step of the latest update (the checkpoint it resumed from, before any)."""
        ...

    def step(self, groups: Sequence[TrajectoryGroup]) -> StepResult:
        """One GRPO step (``num_iterations`` updates) on scored groups; ``result.updated`` says if weights changed."""
        ...

    def sft(self, examples: Sequence[SFTExample], *, steps: int, learning_rate: float | None = None) -> list[float]:
        """Supervised warm-up of the same LoRA; the loss of each step."""
        ...

    def save_checkpoint(self) -> Path:
        """Write checkpoint ``step_count`` atomically; its folder."""
        ...

    def update_config(self, config: GRPOConfig) -> None:
        """New hyper-parameters for the next steps (ConfigError for a change of the LoRA's shape)."""
        ...

    def close(self) -> None:
        """Release what the trainer holds (its adapter on shared weights, its processes)."""
        ...


class TrainerFactory(Protocol):
    """Makes a policy's trainer, which resumes from the latest checkpoint under ``checkpoint_dir``. ``GRPOTrainer``
    and ``ProcessTrainer`` are factories themselves; ``train.factory.trainer_factory`` picks one."""

    def __call__(
        self,
        base_model: str,
        config: GRPOConfig | None,
        *,
        checkpoint_dir: Path,
        device: str | None,
        chat_template: str | None = None,
    ) -> PolicyTrainer: ...


class TeacherScoring(Protocol):
    """Writes a served teacher's logprobs on each trainable turn of ``groups`` (``Turn.teacher_logprobs``) when
    ``config.teacher_is_served``: the teacher is a model the trainer does not hold, so the service that trains scores
    the turns before the step (``backends.teacher_scoring.ServedTeacher``, as ``build_service`` makes it)."""

    def __call__(self, groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> None: ...


class TrainerInit(TypedDict):
    """What a trainer in another process is built from (pickled to a child process, broadcast to the ranks)."""

    base_model: str
    config: GRPOConfig
    checkpoint_dir: str
    device: str | None
    chat_template: str | None
