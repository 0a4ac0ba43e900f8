"""Data-parallel training over ``torch.distributed`` ranks: the step's micro-batches shared out, the LoRA's gradients
summed, and rank 0 leading the others through the same calls.

How a step stays the one-process step: every rank gets the same groups and builds the same sequences and
micro-batches (tokenizing is cheap and deterministic); each trains on its share of the micro-batches (``share``);
each micro-batch's loss is already weighted by the step's *global* counts (``batches.batch_weight``: sequences or
tokens of the whole step), so summing the ranks' gradients (``sum_gradients``, one ``all_reduce`` of the flattened
LoRA gradients and the step's metric sums) gives every rank the gradient one process would have computed. The
clip and AdamW then run on identical gradients and the LoRA replicas stay identical, without ever sending weights.

Why replicated LoRA + one all-reduce, not FSDP2 or DDP's wrapper: the trained parameters are the LoRA's (a few MB);
the frozen base is read-only. FSDP2 would shard the base and all-gather every layer's weights on every forward of
every micro-batch (the whole model over the wire, per micro-batch) to save memory that a model which fits one
device does not need; DDP's wrapper overlaps bucketed all-reduces with backward, which matters for gradients of
billions of parameters, not for a LoRA's, and wants the forward to go through it (ours runs body and LM head
apart, ``forward.py``). What DDP does under ``no_sync`` plus one final sync is what ``sum_gradients`` does.
A base too large for one device is vLLM's and FSDP2's case; see docs/guides/scale-out.md.

Rank 0 leads: ``LeadingTrainer`` sends each call (``step``, ``sft``, ``save_checkpoint``...) to the other ranks
with ``broadcast_object_list``; they run it in ``follow``. Only rank 0 writes checkpoints. The checkpoint folder
must be the same on every rank (one machine, or a shared file system): each rank resumes from it, and a rank that
sees another latest checkpoint than rank 0 stops with an error that says so.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError
from langgraph_art.train.protocol import PolicyTrainer, SFTExample, TrainerInit
from langgraph_art.types import StepResult, TrajectoryGroup

log = logging.getLogger(__name__)
RANK_TIMEOUT_S = 600.0  # how long a collective waits for a rank that stopped answering (torch's default: 30 min)


@dataclass(frozen=True)
class RankGroup:
    """This process's place among the training ranks (``rank`` of ``world_size``; one rank: no communication)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> RankGroup:
        """The default process group's ranks when ``torch.distributed`` is initialised, else one rank."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def writes(self) -> bool:
        """Rank 0 writes checkpoints (and is the one whose answers the caller gets)."""
        return self.rank == 0

    def share(self, batches: Sequence[Sequence[Any]]) -> list[Any]:
        """This rank's micro-batches. Each goes to the rank with the least work so far (work: rows x longest
        sequence, what the padded forward costs), largest first; with fewer micro-batches than ranks, the largest
        are halved until every rank has one (when the rows allow). Every rank computes the same split."""
        if self.world_size == 1:
            return list(batches)
        pieces = [list(b) for b in batches]
        while len(pieces) < self.world_size and any(len(p) > 1 for p in pieces):
            pieces.sort(key=cost)
            largest = next(p for p in reversed(pieces) if len(p) > 1)
            pieces.remove(largest)
            half = len(largest) // 2
            pieces += [largest[:half], largest[half:]]
        load = [0] * self.world_size
        mine = []
        for index, piece in sorted(enumerate(pieces), key=lambda item: (-cost(item[1]), item[0])):
            rank = min(range(self.world_size), key=lambda r: (load[r], r))
            load[rank] += cost(piece)
            if rank == self.rank:
                mine.append((index, piece))
        return [piece for _, piece in sorted(mine, key=lambda item: item[0])]  # in the one-process order

    def sum_gradients(self, params: Sequence[torch.nn.Parameter], values: Sequence[float] = ()) -> list[float]:
        """Sum every rank's ``.grad`` of ``params`` (in place; a missing one counts as zeros) and ``values`` (metric
        sums, flags) in one ``all_reduce``; returns the summed values. One rank: nothing to do."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        # float32 on the wire (what the LoRA trains in on CPU; bf16 gradients are summed without rounding to bf16)
        extra = torch.tensor(list(values), dtype=torch.float32, device=params[0].device)
        flat = torch.cat([p.grad.reshape(-1).float() for p in params] + [extra])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        offset = 0
        for param in params:
            grad = param.grad
            assert grad is not None
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        return [float(v) for v in flat[offset:]]

    def sum_values(self, values: Sequence[float]) -> list[float]:
        """Sum ``values`` over the ranks."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        total = torch.tensor(list(values), dtype=torch.float64, device=collective_device())  # counts, metric sums
        dist.all_reduce(total)
        return [float(v) for v in total]

    def max_values(self, values: Sequence[float]) -> list[float]:
        """The largest of each of ``values`` over the ranks."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        top = torch.tensor(list(values), dtype=torch.float64, device=collective_device())
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return [float(v) for v in top]

    def broadcast(self, value: Any = None) -> Any:
        """Rank 0's ``value`` on every rank (pickled)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, device=collective_device())
        return box[0]

    def check_same(self, value: Any, what: str) -> None:
        """ConfigError on every rank when one rank's ``value`` differs from rank 0's (e.g. the latest checkpoint)."""
        leader = self.broadcast(value)
        (differ,) = self.sum_values([float(leader != value)])
        if differ:
            raise ConfigError(
                f"{differ:.0f} training rank(s) see another {what} than rank 0 ({leader!r}): every rank must read "
                "the same checkpoint folder (one machine, or a file system shared by the nodes)"
            )


def cost(batch: Sequence[Any]) -> int:
    """What a padded micro-batch costs to run: rows x its longest sequence."""
    return len(batch) * max((len(s) for s in batch), default=0)


def collective_device() -> torch.device:
    """Where small tensors for collectives live: the rank's GPU under NCCL, the CPU under gloo."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_ranks(timeout_s: float = RANK_TIMEOUT_S) -> RankGroup:
    """Join the process group ``torchrun`` (or Slurm / a Kubernetes PyTorchJob through it) describes in the
    environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): NCCL on CUDA (each rank
    on GPU ``LOCAL_RANK``), gloo on CPU. Already joined: the group as it is."""
    import torch.distributed as dist

    if dist.is_initialized():
        return RankGroup.current()
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ConfigError(
            f"{missing} are not set: start the training ranks with torchrun (torchrun --nproc_per_node N ...), "
            "or let the service start them (--trainer-ranks N / LocalBackend(trainer_ranks=N))"
        )
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return RankGroup.current()


def torchrun_ranks() -> RankGroup | None:
    """The ranks of the group ``torchrun`` started this process in (joined now), or None outside one."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return init_ranks()


def rank_device(device: str | None) -> str | None:
    """The device a rank trains on: its own GPU, ``cuda:LOCAL_RANK``, when ``device`` is None or ``"cuda"`` and
    CUDA is there; else ``device``."""
    if device in (None, "cuda") and torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


# -- rank 0 leads, the others follow ---------------------------------------------------------------------------
class LeadingTrainer:
    """Rank 0's trainer: each call goes to every rank (``follow``) and runs here too; rank 0's answer is returned.
    ``key`` names the trainer among those the followers hold (one per policy). After each call the ranks agree on
    whether it failed anywhere, so they stay in step: an error on every rank (a config the LoRA cannot take) is
    raised here as it is; one on another rank only is raised as ``TrainingAborted`` naming it."""

    def __init__(
        self,
        ranks: RankGroup,
        key: str,
        init: TrainerInit,
        build: Callable[..., PolicyTrainer],
        lock: threading.Lock | None = None,
    ) -> None:
        """``build(**init)`` makes the trainer on each rank. ``lock``: shared by every leader of one group (several
        policies), so their calls never interleave."""
        self.ranks, self.key, self._lock = ranks, key, lock or threading.Lock()
        with self._lock:
            ranks.broadcast(("start", key, init))
            self.trainer: PolicyTrainer = agree(ranks, lambda: build(**init), f"starting the trainer for {key}")

    @property
    def step_count(self) -> int:
        return self.trainer.step_count

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        with self._lock:
            self.ranks.broadcast(("call", self.key, (method, args, kwargs)))
            return agree(self.ranks, lambda: getattr(self.trainer, method)(*args, **kwargs), method)

    def step(self, groups: Sequence[TrajectoryGroup]) -> StepResult:
        result: StepResult = self._call("step", groups)
        return result

    def sft(self, examples: Sequence[SFTExample], *, steps: int, learning_rate: float | None = None) -> list[float]:
        losses: list[float] = self._call("sft", examples, steps=steps, learning_rate=learning_rate)
        return losses

    def save_checkpoint(self) -> Path:
        folder: Path = self._call("save_checkpoint")
        return folder

    def update_config(self, config: GRPOConfig) -> None:
        self._call("update_config", config)

    def close(self) -> None:
        self._call("close")


def agree(ranks: RankGroup, call: Callable[[], Any], what: str) -> Any:
    """Run ``call`` on this rank, then learn (one all-reduce) how many ranks failed it: this rank's own error is
    raised; a failure elsewhere only raises ``TrainingAborted`` (that rank logged its error)."""
    from langgraph_art.errors import TrainingAborted

    error: Exception | None = None
    value = None
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - raised below, once the other ranks know
        error = exc
    (failed,) = ranks.sum_values([float(error is not None)])
    if error is not None:
        if ranks.rank != 0:
            log.error("rank %d: %s failed: %s: %s", ranks.rank, what, type(error).__name__, error)
        raise error
    if failed:
        raise TrainingAborted(
            f"{what} failed on {failed:.0f} of {ranks.world_size} training ranks (their logs say why); nothing of "
            "it was saved and the checkpoints before it are intact"
        )
    return value


def stop_followers(ranks: RankGroup) -> None:
    """Tell the followers to return from ``follow`` (rank 0, when the service stops)."""
    ranks.broadcast(("stop", None, None))


def follow(ranks: RankGroup, build: Callable[..., PolicyTrainer]) -> None:
    """A rank > 0: build and call trainers as rank 0 says, until it says stop. Errors are agreed on (``agree``)
    and logged here; rank 0's caller gets them."""
    trainers: dict[str, PolicyTrainer] = {}
    while True:
        kind, key, payload = ranks.broadcast()
        if kind == "stop":
            return
        try:
            if kind == "start":
                trainers[key] = agree(ranks, functools.partial(build, **payload), f"starting the trainer for {key}")
            else:
                method, args, kwargs = payload
                agree(ranks, functools.partial(call_trainer, trainers, key, method, args, kwargs), method)
                if method == "close":
                    trainers.pop(key, None)
        except Exception:  # noqa: BLE001 - logged by agree; rank 0 raises it (or TrainingAborted) to its caller
            continue


def call_trainer(
    trainers: dict[str, PolicyTrainer], key: str, method: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> object:
    return getattr(trainers[key], method)(*args, **kwargs)
