"""``ProcessTrainer``: a ``GRPOTrainer`` in a child process, for training that overlaps sampling on a CPU.

Why: in one Python process the engine's decode loop and the trainer's forward/backward take turns on the GIL.
With ``Trainer(max_steps_off_policy=1)`` on tiny-5m (32 runs a step, 2 cores) the process used 1.27 cores while
both ran, and a step's learning took twice as long as alone. A child process has its own interpreter: the
trainer gets a core of its own. ``LocalBackend(trainer_process=True)`` builds its trainers with this class.

The child is ``python -m langgraph_art.train.process R W`` (not ``multiprocessing``: its "spawn" re-imports the
user's ``__main__``, and a script without an ``if __name__ == "__main__"`` guard would start training again in the
child). It talks over two pipes with ``multiprocessing.connection``'s framing: the parent sends
``(method, args, kwargs)``, the child answers ``("ok", value, step_count)`` or ``("error", exception, step_count)``.
Checkpoints go to disk as they do in process (atomically), and the caller serves them from there, as always.

What it guarantees: an error in the child is raised in the parent with its own class (``TrainingAborted``,
``ConfigError``...) and the child's traceback as a note; a child that dies (killed, out of memory) raises
``TrainingAborted`` naming its exit code, and the next call starts a new child that resumes from the latest
checkpoint; the child ignores Ctrl-C (the parent decides) and exits when the parent's end of the pipe closes, so a
killed parent leaves no trainer behind once the current call is done. The child's torch threads: half the
parent's (at least 1) unless ``OMP_NUM_THREADS`` is set, so the engine and the trainer do not oversubscribe the
cores. The cost: the model's weights are loaded a second time, in the child.

``ranks=N`` (``LocalBackend(trainer_ranks=N)``, ``serve --trainer-ranks N``) starts N children as one
``torch.distributed`` group on loopback (gloo on CPU, NCCL on CUDA, a GPU each), the environment ``torchrun`` would
give them: rank 0 answers the pipe and leads, the others follow it (``train/ranks.py``). A rank that dies mid-call
aborts the call with ``TrainingAborted`` naming it: the parent stops the whole group (the others wait in a collective
that can no longer finish), nothing of the call is saved, and the next call starts a new group that resumes from the
latest checkpoint. Any error of a group of several ranks ends the group the same way, so no rank is left mid-step.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError, TrainingAborted
from langgraph_art.train.protocol import PolicyTrainer, SFTExample, TrainerInit
from langgraph_art.types import StepResult, Trajectory, TrajectoryGroup

T = TypeVar("T", Trajectory, TrajectoryGroup)

log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 30.0


class ProcessTrainer:
    """A ``PolicyTrainer`` (``train/protocol.py``) whose ``GRPOTrainer`` runs in a child process (one per rank);
    built like ``GRPOTrainer`` (both are ``TrainerFactory``s), plus the number of ``ranks``."""

    shares_weights = False

    def __init__(
        self,
        base_model: str,
        config: GRPOConfig | None = None,
        *,
        checkpoint_dir: str | Path,
        device: str | None = None,
        threads: int | None = None,
        chat_template: str | None = None,
        ranks: int = 1,
    ) -> None:
        """``threads``: each child's torch threads (None: ``OMP_NUM_THREADS`` if set, else half the parent's, shared
        by the ranks). ``ranks``: data-parallel training ranks, one child each."""
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ConfigError(f"trainer ranks must be an int >= 1 (one process each), got {ranks!r}")
        self.ranks = ranks
        self.config = config or GRPOConfig()
        self.checkpoint_dir = Path(checkpoint_dir)
        self._base_model, self._device, self._chat_template = base_model, device, chat_template
        self._threads = threads if threads is not None else max(1, child_threads() // ranks)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None  # rank 0, which the pipe reaches
        self._followers: list[subprocess.Popen[bytes]] = []  # ranks 1..N-1
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self.step_count = 0
        with self._lock:
            self._start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pids(self) -> list[int]:
        """The children's process ids, rank 0 first."""
        return [p.pid for p in ([self._proc] if self._proc else []) + self._followers]

    def step(self, groups: Sequence[TrajectoryGroup]) -> StepResult:
        result: StepResult = self._call("step", [without_final_state(g) for g in groups])
        return result

    def save_checkpoint(self) -> Path:
        return Path(self._call("save_checkpoint"))

    def sft(self, examples: Sequence[SFTExample], *, steps: int, learning_rate: float | None = None) -> list[float]:
        portable = [without_final_state(e) if isinstance(e, Trajectory) else e for e in examples]
        losses: list[float] = self._call("sft", portable, steps=steps, learning_rate=learning_rate)
        return losses

    def update_config(self, config: GRPOConfig) -> None:
        self._call("update_config", config)
        self.config = config

    def close(self) -> None:
        """Ask the child to exit (then terminate it if it does not within 30 s)."""
        with self._lock:
            self._stop()

    # -- the pipe ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        path = os.pathsep.join(filter(None, [package_root(), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        group = rank_environments(self.ranks)
        try:
            for rank in range(1, self.ranks):  # they wait for rank 0 in init_process_group
                follower_env = {**env, **group[rank], "OMP_NUM_THREADS": str(self._threads)}
                command = [sys.executable, "-m", "langgraph_art.train.process", "--follow"]
                self._followers.append(subprocess.Popen(command, env=follower_env))
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "langgraph_art.train.process", str(to_child), str(from_child)],
                pass_fds=(to_child, from_child),
                env={**env, **group[0]},
            )
        except BaseException:
            self._kill_followers()
            os.close(from_parent)
            os.close(to_parent)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        self._send, self._recv = Connection(from_parent, readable=False), Connection(to_parent, writable=False)
        init = TrainerInit(base_model=self._base_model, config=self.config, checkpoint_dir=str(self.checkpoint_dir),
                           device=self._device, chat_template=self._chat_template)  # fmt: skip
        try:
            self._exchange("start", (init, self._threads), {})
        except BaseException:
            self._stop()
            raise

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            lost = self._dead_followers()  # a rank that died between calls: the group cannot train any more
            if self._proc is None or self._proc.poll() is not None or lost:
                why = f"; ranks {[r for r, _ in lost]} had exited" if lost else ""
                log.warning("starting new trainer processes for %s (they resume from the latest checkpoint)%s",
                            self.checkpoint_dir, why)  # fmt: skip
                self._stop(kill=bool(lost))  # the live ranks would wait for the dead one in a collective
                self._start()
            return self._exchange(method, args, kwargs)

    def _exchange(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        assert self._send is not None and self._recv is not None and self._proc is not None
        try:
            self._send.send((method, args, kwargs))
            while not self._recv.poll(0.2):  # and watch the other ranks: one that dies leaves rank 0 waiting
                if self._dead_followers():
                    self._rank_died(method)
            status, value, self.step_count = self._recv.recv()
        except (EOFError, OSError) as exc:
            try:
                code = self._proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # its pipe broke but it lives on: it cannot answer anymore
                self._proc.kill()
                code = self._proc.wait()
            self._stop(kill=True)
            raise TrainingAborted(
                f"the trainer process for {self.checkpoint_dir} exited (code {code}) during {method}; nothing of "
                "this call was saved, the checkpoints before it are intact, and the next call starts a new trainer "
                "process that resumes from the latest one"
            ) from exc
        if status == "error":
            if self.ranks > 1:  # a rank may be left mid-collective: the next call starts the group anew
                if self._dead_followers(wait_s=2.0):  # rank 0 saw the connection drop before we saw the exit
                    self._rank_died(method, value)
                self._stop(kill=True)
            raise value
        return value

    def _dead_followers(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """(rank, exit code) of the ranks > 0 that exited, waiting up to ``wait_s`` for one to."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = [(r, p.returncode) for r, p in enumerate(self._followers, 1) if p.poll() is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _rank_died(self, method: str, error: BaseException | None = None) -> None:
        rank, code = self._dead_followers()[0]
        self._stop(kill=True)
        raise TrainingAborted(
            f"training rank {rank} for {self.checkpoint_dir} exited (code {code}) during {method}; the group of "
            f"{self.ranks} ranks is stopped, nothing of this call was saved, the checkpoints before it are intact, "
            "and the next call starts a new group that resumes from the latest one"
        ) from error

    def _kill_followers(self) -> None:
        for follower in self._followers:
            if follower.poll() is None:
                follower.kill()
            follower.wait()
        self._followers = []

    def _stop(self, kill: bool = False) -> None:
        """Close the pipe (rank 0 tells the other ranks to stop, then exits); ``kill``: kill every rank now (one is
        dead or stuck in a collective)."""
        proc, send, recv = self._proc, self._send, self._recv
        self._proc = self._send = self._recv = None
        for conn in (send, recv):
            if conn is not None:
                conn.close()  # the child reads EOF and exits
        if kill:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            self._kill_followers()
            return
        for follower in self._followers:
            try:
                follower.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("training rank %d did not exit within %.0f s; killing it", follower.pid, CLOSE_TIMEOUT_S)
        self._kill_followers()
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("the trainer process %d did not exit within %.0f s; terminating it", proc.pid,
                            CLOSE_TIMEOUT_S)  # fmt: skip
                proc.kill()
                proc.wait()


def without_final_state(item: T) -> T:
    """A copy of a run (or of a group's runs) without ``final_state``: the graph's output may hold anything (a
    client, a lock) that does not pickle, and the trainer reads turns, rewards and metadata only."""
    if isinstance(item, TrajectoryGroup):
        return item.model_copy(update={"trajectories": [without_final_state(t) for t in item.trajectories]})
    copy = item.model_copy()
    copy.final_state = None
    return copy


def package_root() -> str:
    """The folder that holds this package, so the child imports the same code as the parent."""
    return str(Path(__file__).resolve().parents[2])


def rank_environments(ranks: int) -> list[dict[str, str]]:
    """What ``torchrun --nproc_per_node ranks`` would set for each rank, on loopback and a free port."""
    if ranks == 1:
        return [{"WORLD_SIZE": "1"}]  # not a rank of a group the parent may be in (a torchrun-started service)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks),
              "LOCAL_WORLD_SIZE": str(ranks)}  # fmt: skip
    return [{**common, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(ranks)]


def child_threads() -> int:
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"])
    import torch

    return max(1, torch.get_num_threads() // 2)


# -- the child ---------------------------------------------------------------------------------------------
def serve(requests: Connection, answers: Connection) -> None:
    """Build the trainer from the first message, then answer calls until the parent closes the pipe."""
    trainer: PolicyTrainer | None = None
    while True:
        try:
            method, args, kwargs = requests.recv()
        except EOFError:
            from langgraph_art.train.ranks import LeadingTrainer, stop_followers

            if isinstance(trainer, LeadingTrainer):
                stop_followers(trainer.ranks)
            return
        try:
            if method == "start":
                trainer = start_trainer(*args)
                value = None
            else:
                value = getattr(trainer, method)(*args, **kwargs)
            answer: tuple[str, Any, int] = ("ok", value, trainer.step_count if trainer is not None else 0)
        except Exception as exc:  # noqa: BLE001 - not swallowed: raised in the parent
            answer = ("error", portable(exc), trainer.step_count if trainer is not None else 0)
        try:
            answers.send(answer)
        except OSError:  # the parent is gone (killed): nobody to answer
            return
        if method == "start" and trainer is None:
            return


def start_trainer(init: TrainerInit, threads: int) -> PolicyTrainer:
    import torch

    torch.set_num_threads(threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # rank 0 of a group: it leads the others
        from langgraph_art.train.ranks import LeadingTrainer, init_ranks

        return LeadingTrainer(init_ranks(), init["checkpoint_dir"], init, build_trainer)
    return build_trainer(**init)


def build_trainer(
    base_model: str, config: GRPOConfig, checkpoint_dir: str, device: str | None, chat_template: str | None
) -> PolicyTrainer:
    """A ``GRPOTrainer`` on this rank's device, a rank of the group this process joined (rank 0 and the followers
    build the trainers of a group with it)."""
    from langgraph_art.train.ranks import RankGroup, rank_device
    from langgraph_art.train.trainer import GRPOTrainer

    # the group this process joined to train (init_ranks), or one rank
    return GRPOTrainer(base_model, config, checkpoint_dir=checkpoint_dir, device=rank_device(device),
                       chat_template=chat_template, ranks=RankGroup.current())  # fmt: skip


def follow_leader() -> None:
    """A rank > 0 started by ``ProcessTrainer(ranks=N)``: join the group, follow rank 0 until it stops."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from langgraph_art.train.ranks import follow, init_ranks

    follow(init_ranks(), build_trainer)


def portable(exc: Exception) -> Exception:
    """``exc`` with the child's traceback as a note, or a RuntimeError saying what it was if it cannot pickle."""
    where = f"in the trainer process (pid {os.getpid()}):\n" + "".join(traceback.format_exception(exc))
    try:
        exc.add_note(where)
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure: the parent gets the class, message and traceback
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{where}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    if sys.argv[1] == "--follow":
        follow_leader()
        sys.exit(0)
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
