"""``PolicyRegistry``: the one owner of live trainers. ``LocalBackend`` and the service's training routes are thin
callers of it, so both train the same way.

A policy is identified by ``(project, name)``; its checkpoints live under ``<home>/<project>/checkpoints/<name>``
(names follow ``config.check_name``, so no policy reaches outside ``home``). The registry creates a policy's
``GRPOTrainer`` on first use (it resumes from the latest checkpoint) on its ``device``, applies a changed
``GRPOConfig`` to a live trainer before its next step, and keeps at most ``max_trainers`` trainers in memory (each
holds a copy of the model, or only its LoRA on the engine's shared weights): a new one replaces the least recently
used idle one, whose state is already in its latest checkpoint (written after every step and warm-up; an aborted
step leaves the weights as they were); when all are busy,
``ServiceBusyError``. Thread-safe; one step at a time per policy.

A served teacher (``GRPOConfig.teacher_is_served``) scores each step's turns before the trainer sees them, through
the ``score_teacher`` the registry was given (the service's engine, or another server).

Serving a checkpoint is the caller's part: ``step``/``warmup`` return the checkpoint folder to publish as
``name@step`` (``serve.publish.publish``).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from langgraph_art.config import GRPOConfig, check_name
from langgraph_art.errors import ConfigError, ModelNotFoundError, ServiceBusyError
from langgraph_art.train.protocol import PolicyTrainer, SFTExample, TeacherScoring, TrainerFactory
from langgraph_art.types import StepResult, TrajectoryGroup

log = logging.getLogger(__name__)
PolicyKey = tuple[str, str]  # (project, name)


@dataclass
class _Slot:
    trainer: PolicyTrainer | None = None
    config: GRPOConfig | None = None  # the trainer's, as last applied (None: the defaults)
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0  # callers holding or waiting for this slot: it is not dropped while > 0


class PolicyRegistry:
    """Live trainers by (project, name) under ``home``, for one base model."""

    def __init__(
        self,
        base_model: str,
        home: str | Path,
        *,
        device: str | None = None,
        max_trainers: int | None = None,
        trainer_factory: TrainerFactory | None = None,
        chat_template: str | None = None,
        score_teacher: TeacherScoring | None = None,
    ) -> None:
        """``trainer_factory`` builds a policy's trainer (``train.factory.trainer_factory`` picks it for a service;
        default ``GRPOTrainer``); ``chat_template``: the engine's, so that the trainers render as the engine does;
        ``max_trainers=None`` keeps every trainer; ``score_teacher``: how a served teacher scores a step's turns
        (None: only the trainers' own teachers, 'base' and 'policy')."""
        if max_trainers is not None and max_trainers < 1:
            raise ConfigError(f"max_trainers must be >= 1 (or None for no limit), got {max_trainers}")
        self.base_model, self.home, self.device = base_model, Path(home).resolve(), device
        self.max_trainers, self._factory = max_trainers, trainer_factory
        self.chat_template, self._score_teacher = chat_template, score_teacher
        self._slots: OrderedDict[PolicyKey, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def checkpoint_dir(self, project: str, name: str) -> Path:
        """Where the policy's checkpoints live; ValueError naming the field for a name that is not plain."""
        for field_name, value in (("project", project), ("name", name)):
            try:
                check_name(value)
            except ValueError as exc:
                raise ConfigError(f"{field_name} {exc}") from None
        folder = (self.home / project / "checkpoints" / name).resolve()
        if not folder.is_relative_to(self.home):  # a symlink inside home must not lead out either
            raise ConfigError(f"project {project!r} / policy {name!r} leads outside {self.home}")
        return folder

    def pin(self, project: str, name: str, step: int) -> None:
        """Keep checkpoint ``step`` of the policy whatever ``save_total_limit`` says; ``ModelNotFoundError`` when
        it does not exist (any more)."""
        from langgraph_art.train import checkpoint

        try:
            checkpoint.pin(self.checkpoint_dir(project, name), step)
        except FileNotFoundError:
            kept = checkpoint.list_steps(self.checkpoint_dir(project, name))
            raise ModelNotFoundError(f"{project}/{name} has no checkpoint {step} (kept: {kept})", "step") from None

    def current_step(self, project: str, name: str) -> int:
        from langgraph_art.train import checkpoint

        return checkpoint.latest_step(self.checkpoint_dir(project, name)) or 0

    def latest_checkpoint(self, project: str, name: str) -> Path | None:
        """The folder of the policy's latest checkpoint (what replicas load), None before the first."""
        from langgraph_art.train import checkpoint

        root = self.checkpoint_dir(project, name)
        step = checkpoint.latest_step(root)
        return checkpoint.step_dir(root, step) if step is not None else None

    @contextmanager
    def lease(self, project: str, name: str, config: GRPOConfig | None = None) -> Iterator[PolicyTrainer]:
        """The policy's trainer, exclusively for the caller, with ``config`` applied (ConfigError if it would
        change the LoRA's shape)."""
        folder = self.checkpoint_dir(project, name)
        key = (project, name)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                self._make_room(key)
                slot = self._slots[key] = _Slot()
            self._slots.move_to_end(key)
            slot.users += 1
        try:
            with slot.lock:
                if slot.trainer is None:
                    slot.trainer = self._create(config, folder)
                elif config is not None:
                    slot.trainer.update_config(config)
                slot.config = config or slot.config
                yield slot.trainer
        finally:
            with self._lock:
                slot.users -= 1
                if slot.trainer is None and slot.users == 0:  # creation failed: free the slot
                    self._slots.pop(key, None)

    def prepare(self, project: str, name: str, config: GRPOConfig | None = None) -> None:
        """Load (or resume) the policy's trainer now, before the first rollout."""
        with self.lease(project, name, config):
            pass

    def step(
        self, project: str, name: str, groups: Sequence[TrajectoryGroup], config: GRPOConfig | None = None
    ) -> tuple[StepResult, Path | None]:
        """One GRPO step; the checkpoint folder to publish when the weights changed (else None)."""
        with self.lease(project, name, config) as trainer:
            used = self._slots[(project, name)].config or GRPOConfig()
            if used.teacher_is_served:
                if self._score_teacher is None:
                    raise ConfigError(
                        f"teacher_model={used.teacher_model!r} is a served model, and this registry has no engine "
                        "to score with: build it with score_teacher=... (build_service does), or use 'base'/'policy'"
                    )
                self._score_teacher(groups, used)
            result = trainer.step(groups)
            return result, trainer.save_checkpoint() if result.updated else None

    def warmup(
        self,
        project: str,
        name: str,
        examples: Sequence[SFTExample],
        *,
        steps: int,
        learning_rate: float | None = None,
        config: GRPOConfig | None = None,
    ) -> tuple[list[float], int, Path]:
        """SFT warm-up; the losses, the step it is saved as, and the checkpoint folder to publish."""
        with self.lease(project, name, config) as trainer:
            losses = trainer.sft(examples, steps=steps, learning_rate=learning_rate)
            return losses, trainer.step_count, trainer.save_checkpoint()

    def close(self) -> None:
        """Close every live trainer (a trainer process exits); the registry can be used again after."""
        with self._lock:
            slots, self._slots = list(self._slots.values()), OrderedDict()
        for slot in slots:
            with slot.lock:  # a step under way finishes first
                if slot.trainer is not None:
                    slot.trainer.close()
                slot.trainer = None

    def _create(self, config: GRPOConfig | None, folder: Path) -> PolicyTrainer:
        factory = self._factory
        if factory is None:
            from langgraph_art.train.trainer import GRPOTrainer

            factory = GRPOTrainer
        return factory(self.base_model, config, checkpoint_dir=folder, device=self.device,
                       chat_template=self.chat_template)  # fmt: skip

    def _make_room(self, key: PolicyKey) -> None:
        while self.max_trainers is not None and len(self._slots) >= self.max_trainers:
            idle = next((k for k, s in self._slots.items() if s.users == 0), None)  # oldest first
            if idle is None:
                raise ServiceBusyError(
                    f"all {self.max_trainers} live trainers are busy with other policies; retry shortly, or start "
                    "the service with a larger --max-trainers (each trainer holds a copy of the model in memory)"
                )
            log.info("dropping the trainer of %s/%s (least recently used) to make room for %s/%s", *idle, *key)
            dropped = self._slots.pop(idle).trainer
            if dropped is not None:
                dropped.close()  # its adapter leaves a model it shares with the engine
            gc.collect()
