"""Where a service's trainers run, validated once (``TrainingOptions``), and the one function that turns that into
the ``TrainerFactory`` a ``PolicyRegistry`` uses (``trainer_factory``). ``LocalBackend`` and ``langgraph-art serve``
both come through here (``backends/service.py``); nothing else chooses a trainer class.

- in this process: ``GRPOTrainer``, on the engine's own weights when the engine shares them;
- in child processes (``process``, ``ranks > 1``): ``ProcessTrainer``, one child per data-parallel rank;
- under torchrun (``torchrun``): ``LeadingTrainer``, this process leading the ranks torchrun started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError
from langgraph_art.train.protocol import PolicyTrainer, TrainerFactory, TrainerInit

if TYPE_CHECKING:
    from langgraph_art.models.lora import SharedBase
    from langgraph_art.train.ranks import RankGroup


@dataclass(frozen=True)
class TrainingOptions:
    """Where trainers run: ``LocalBackend(trainer_process=, trainer_ranks=)`` and ``langgraph-art serve
    --trainer-process / --trainer-ranks`` (or torchrun) give them; ``ConfigError`` names what to change.

    ``process``: each trainer in a child process with its own copy of the weights (its updates overlap sampling on
    another core). ``ranks``: data-parallel ranks per policy, one child process each. ``torchrun``: this process is
    rank 0 of the group torchrun started, whose processes are the ranks. ``share_weights``: the HF engine's option
    (the trainers train on the engine's own weights, in this process), so it cannot be on with the others."""

    process: bool = False
    ranks: int = 1
    torchrun: bool = False
    share_weights: bool | None = None

    def __post_init__(self) -> None:
        ranks = self.ranks
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ConfigError(
                f"trainer_ranks (--trainer-ranks) must be an int >= 1 (training processes per policy), got {ranks!r}"
            )
        if self.torchrun and ranks > 1:
            raise ConfigError(
                f"trainer_ranks (--trainer-ranks) must be 1 under torchrun (got {ranks}): torchrun's processes are "
                "the ranks"
            )
        if self.in_children and self.share_weights:
            raise ConfigError(
                "trainer_process / trainer_ranks > 1 (--trainer-process / --trainer-ranks) train a copy of the "
                "weights in child processes, so they cannot share the engine's: drop share_weights (--share-weights)"
            )

    @property
    def in_children(self) -> bool:
        """Trainers run in child processes of this one."""
        return self.process or self.ranks > 1


def trainer_factory(
    options: TrainingOptions,
    *,
    shared: Callable[[], SharedBase | None] | None = None,
    ranks: RankGroup | None = None,
) -> TrainerFactory:
    """The factory ``options`` call for. ``shared``: asked when a trainer is made in this process (the engine has
    loaded by then) for the engine's weights to train on, None when it offers none. ``ranks``: torchrun's group this
    process leads (``options.torchrun``); its trainers' calls go through the ranks one at a time."""
    if options.torchrun:
        if ranks is None:
            raise ConfigError("TrainingOptions(torchrun=True) needs the group this process leads (ranks.init_ranks())")
        return _leading(ranks)
    if options.in_children:
        return _in_children(options.ranks)
    return _in_process(shared or (lambda: None))


def _in_process(shared: Callable[[], SharedBase | None]) -> TrainerFactory:
    from langgraph_art.train.trainer import GRPOTrainer

    def make(
        base_model: str,
        config: GRPOConfig | None,
        *,
        checkpoint_dir: Path,
        device: str | None,
        chat_template: str | None = None,
    ) -> PolicyTrainer:
        return GRPOTrainer(base_model, config, checkpoint_dir=checkpoint_dir, device=device,
                           chat_template=chat_template, shared=shared())  # fmt: skip

    return make


def _in_children(ranks: int) -> TrainerFactory:
    from langgraph_art.train.process import ProcessTrainer

    def make(
        base_model: str,
        config: GRPOConfig | None,
        *,
        checkpoint_dir: Path,
        device: str | None,
        chat_template: str | None = None,
    ) -> PolicyTrainer:
        return ProcessTrainer(base_model, config, checkpoint_dir=checkpoint_dir, device=device,
                              chat_template=chat_template, ranks=ranks)  # fmt: skip

    return make


def _leading(ranks: RankGroup) -> TrainerFactory:
    from langgraph_art.train.process import build_trainer
    from langgraph_art.train.ranks import LeadingTrainer

    leading = threading.Lock()  # shared by every policy's leader: one call at a time goes through the ranks

    def make(
        base_model: str,
        config: GRPOConfig | None,
        *,
        checkpoint_dir: Path,
        device: str | None,
        chat_template: str | None = None,
    ) -> PolicyTrainer:
        init = TrainerInit(base_model=base_model, config=config or GRPOConfig(), checkpoint_dir=str(checkpoint_dir),
                           device=device, chat_template=chat_template)  # fmt: skip
        return LeadingTrainer(ranks, init["checkpoint_dir"], init, build_trainer, lock=leading)

    return make
