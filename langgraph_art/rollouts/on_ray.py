"""``RayRollouts``: a step's runs on ``RolloutWorker`` actors; the driver's side (see the package's docstring)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import math
import os
import pickle
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import Runnable

from langgraph_art.capture.messages import to_jsonable
from langgraph_art.capture.rollout import RunWriter, afill_groups, check_gather, new_groups
from langgraph_art.errors import ConfigError
from langgraph_art.rollouts.pickling import dumps
from langgraph_art.rollouts.protocol import RolloutBatch
from langgraph_art.rollouts.worker import RolloutWorker
from langgraph_art.store import TrajectoryStore
from langgraph_art.types import Trajectory

log = logging.getLogger(__name__)
INSTALL = "pip install 'langgraph-art[ray]'"


@dataclass(eq=False)
class _Worker:
    actor: Any
    name: str
    pid: int | None = None
    key: str | None = None  # the graph it holds
    busy: int = 0
    dead: bool = False
    loading: asyncio.Task[None] | None = None


@dataclass
class _Lost:
    worker: _Worker
    error: str
    retried: int = 0
    failed: int = 0


@dataclass
class _Step:
    """One ``agather`` call's bookkeeping."""

    key: str
    blob: Any  # the graph's pickle in Ray's object store
    per_worker: int
    changed: asyncio.Condition
    lost: dict[int, _Lost] = field(default_factory=dict)  # by id of the dead worker
    retried: set[tuple[int, int]] = field(default_factory=set)  # (group index, generation)
    replacements: int = 0
    load_error: str | None = None
    unpickled_states: list[str] = field(default_factory=list)


class _NoWorkers(Exception):
    pass


def _require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"RayRollouts needs Ray: {INSTALL}") from exc
    return ray


@functools.cache
def _remote_worker_class() -> Any:
    """``ray.remote(RolloutWorker)``, made once (Ray registers the class when it is first used)."""
    return _require_ray().remote(RolloutWorker)


class RayRollouts:
    """Run a ``Trainer``'s rollouts on ``num_workers`` Ray actors: ``Trainer(..., rollouts=art.RayRollouts(4))``.

    ``address``: None starts Ray on this machine (``ray.init(num_cpus=...)``) unless it is running in this process
    already; ``"auto"`` or ``"ray://head:10001"`` joins a cluster (``ray start --head`` on the head node). The
    workers reach the policy over HTTP at the ``base_url`` of the graph's ``ChatART``: a ``LocalBackend``'s service
    listens on loopback (fine for workers on this machine); a cluster needs ``langgraph-art serve`` on an address
    the workers reach, trained through ``RemoteBackend``.

    ``max_retries``: how many times a run whose worker died is started again on another worker before it counts
    as failed. ``runtime_env``: Ray's runtime environment for the workers (``{"pip": [...]}``, ``env_vars``...);
    they must be able to import ``langgraph_art`` and whatever the graph's code imports. ``num_cpus_per_worker``:
    the CPUs Ray reserves for each worker. ``start_timeout``: seconds a worker may take to start and load the graph.

    The workers live until ``close()`` (or the end of a ``with`` block, or the process): the graph is sent to them
    once, not every step. ``close()`` also shuts Ray down when this object started it."""

    def __init__(
        self,
        num_workers: int = 2,
        *,
        address: str | None = None,
        max_retries: int = 2,
        runtime_env: Mapping[str, Any] | None = None,
        num_cpus_per_worker: float = 1.0,
        start_timeout: float = 300.0,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an int >= 1 (Ray actors running rollouts), got {num_workers!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(
                f"max_retries must be an int >= 0 (times a run whose worker died is retried), got {max_retries!r}"
            )
        if (
            isinstance(num_cpus_per_worker, bool)
            or not isinstance(num_cpus_per_worker, int | float)
            or (num_cpus_per_worker < 0)
        ):
            raise ConfigError(f"num_cpus_per_worker must be a number >= 0, got {num_cpus_per_worker!r}")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float) or start_timeout <= 0:
            raise ConfigError(f"start_timeout must be a number of seconds > 0, got {start_timeout!r}")
        if address is not None and not isinstance(address, str):
            raise ConfigError(f"address must be a Ray address ('auto', 'ray://host:10001') or None, got {address!r}")
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise ConfigError(f"runtime_env must be a dict (Ray's runtime environment) or None, got {runtime_env!r}")
        self.ray = _require_ray()
        self.num_workers, self.address, self.max_retries = num_workers, address, max_retries
        self.runtime_env = dict(runtime_env) if runtime_env is not None else None
        self.num_cpus_per_worker, self.start_timeout = float(num_cpus_per_worker), float(start_timeout)
        self.workers: list[_Worker] = []
        self._started_ray = False
        self._spawned = 0
        self._graph: Any = None  # the graph object the workers hold (kept: its id is the key's only meaning)
        self._key: str | None = None
        self._blob: Any = None  # its pickle, in Ray's object store
        self._changed: tuple[asyncio.AbstractEventLoop, asyncio.Condition] | None = None
        self._step: _Step | None = None  # the latest agather's
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> RayRollouts:
        """Connect to (or start) Ray and start the workers; ``agather`` calls it, call it earlier to pay for it
        before the first step."""
        ray = self.ray
        if not ray.is_initialized():
            if self.address is None:
                cpus = max(os.cpu_count() or 1, math.ceil(self.num_workers * self.num_cpus_per_worker))
                ray.init(num_cpus=cpus, include_dashboard=False)
            else:
                ray.init(address=self.address)
            self._started_ray = True
        while len([w for w in self.workers if not w.dead]) < self.num_workers:
            self.workers.append(self._spawn())
        return self

    def _spawn(self) -> _Worker:
        options: dict[str, Any] = {"num_cpus": self.num_cpus_per_worker, "max_restarts": 0, "max_task_retries": 0,
                                   "max_concurrency": 1000}  # fmt: skip
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        self._spawned += 1
        return _Worker(_remote_worker_class().options(**options).remote(), f"rollout-worker-{self._spawned}")

    def pids(self) -> list[int]:
        """The process ids of the live workers (starting them if needed)."""
        self.start()
        return list(self.ray.get([w.actor.pid.remote() for w in self.workers if not w.dead]))

    def close(self) -> None:
        """Kill the workers, and shut Ray down if this object started it. Safe to call twice."""
        workers, self.workers = self.workers, []
        if not self.ray.is_initialized():
            return
        for worker in workers:
            try:
                self.ray.kill(worker.actor, no_restart=True)
            except Exception:
                log.debug("could not kill %s", worker.name, exc_info=True)
        self._graph = self._key = self._blob = self._step = None
        if self._started_ray:
            self.ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayRollouts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a step ---------------------------------------------------------------------------------------------------
    async def agather(
        self,
        graph: Runnable,
        scenarios: Sequence[Mapping[str, Any]],
        num_generations: int,
        *,
        max_concurrency: int = 8,
        metadata: Mapping[str, Any] | None = None,
        store: TrajectoryStore | None = None,
    ) -> RolloutBatch:
        """``agather_groups`` on the workers: every scenario ``num_generations`` times, at most ``max_concurrency``
        runs at once in all, each run stored once when it arrives, then the groups (in scenario order)."""
        check_gather(scenarios, num_generations, max_concurrency)
        blob = None
        if graph is not self._graph:  # pickled before anything starts: a graph that does not pickle starts nothing
            try:
                blob = dumps(graph)
            except Exception as exc:
                raise ConfigError(
                    f"RayRollouts sends the graph to its workers by cloudpickle, and it does not pickle: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        self.start()
        if blob is not None:
            self._graph, self._key, self._blob = graph, uuid.uuid4().hex, self.ray.put(blob)
        assert self._key is not None
        per_worker = max(1, math.ceil(max_concurrency / self.num_workers))
        step = self._step = _Step(self._key, self._blob, per_worker, self._condition())
        await self._load_all(step)

        metadata = dict(metadata or {})
        groups = new_groups(scenarios, metadata)
        writer = RunWriter(store) if store is not None else None

        async def one(index: int, generation: int) -> Trajectory:
            group = groups[index]
            meta = {**metadata, "scenario_id": group.scenario_id, "group_id": group.id, "generation": generation}
            trajectory = await self._run(step, (index, generation), scenarios[index]["input"], meta)
            if writer is not None:
                writer.add(trajectory)
            return trajectory

        try:
            results = await asyncio.gather(
                *(one(index, generation) for index in range(len(scenarios)) for generation in range(num_generations))
            )
        finally:  # cancelled or not, the runs that arrived are stored
            if writer is not None:
                await asyncio.shield(writer.drain())
            self._report(step)
        await afill_groups(groups, results, store)
        metrics = {"rollouts/retried": float(len(step.retried)), "rollouts/workers_lost": float(len(step.lost))}
        return RolloutBatch(groups, metrics)

    async def _run(self, step: _Step, slot: tuple[int, int], input: Any, meta: dict[str, Any]) -> Trajectory:
        """One run on whichever worker has room; again on another when its worker dies (``max_retries`` times)."""
        started, lost_on = time.time(), list[str]()
        while True:
            try:
                worker = await self._acquire(step)
            except _NoWorkers:
                why = f"; lost {', '.join(lost_on)}" if lost_on else ""
                return _failed(meta, started, f"WorkerLost: no rollout worker left to run it{why}")
            try:
                trajectory, state, unpickled = await worker.actor.run.remote(step.key, input, meta)
            except self._lost_errors() as exc:
                lost = self._lose(step, worker, exc)
                lost_on.append(worker.name)
                if len(lost_on) > self.max_retries:
                    lost.failed += 1
                    return _failed(
                        meta, started,
                        f"WorkerLost: its rollout worker died, {len(lost_on)} time(s) ({', '.join(lost_on)}; "
                        f"max_retries={self.max_retries}): {lost.error}",
                    )  # fmt: skip
                lost.retried += 1
                step.retried.add(slot)
                continue
            except self.ray.exceptions.RayError as exc:  # not the graph's error (arollout keeps those): ours
                return _failed(meta, started, f"{type(exc).__name__}: {exc}")
            finally:
                await self._release(step, worker)
            if state is not None:
                try:
                    trajectory.final_state = pickle.loads(state)
                except Exception as exc:  # noqa: BLE001 - the run is kept; `state` rewards abstain on it
                    unpickled = f"{type(exc).__name__}: {exc}"
            if unpickled is not None:
                step.unpickled_states.append(unpickled)
            return trajectory

    def _condition(self) -> asyncio.Condition:
        """Notified whenever a worker frees a slot, loads a graph or is lost: one per event loop, shared by the
        steps (a replacement started in one step may finish loading in the next)."""
        loop = asyncio.get_running_loop()
        if self._changed is None or self._changed[0] is not loop:
            self._changed = (loop, asyncio.Condition())
        return self._changed[1]

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        exceptions = self.ray.exceptions
        return (exceptions.RayActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError)

    async def _acquire(self, step: _Step) -> _Worker:
        async with step.changed:
            while True:
                ready = [w for w in self.workers if not w.dead and w.key == step.key and w.busy < step.per_worker]
                if ready:
                    worker = min(ready, key=lambda w: w.busy)
                    worker.busy += 1
                    return worker
                if not any(not w.dead for w in self.workers):
                    raise _NoWorkers
                await step.changed.wait()

    async def _release(self, step: _Step, worker: _Worker) -> None:
        async with step.changed:
            worker.busy -= 1
            step.changed.notify_all()

    def _lose(self, step: _Step, worker: _Worker, error: BaseException) -> _Lost:
        """Mark ``worker`` dead (once) and start its replacement."""
        lost = step.lost.get(id(worker))
        if lost is not None:
            return lost
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        lost = step.lost[id(worker)] = _Lost(worker, f"{type(error).__name__}: {text}")
        self._discard(worker)
        if step.replacements < self.num_workers * (self.max_retries + 1):  # a worker that cannot live: give up
            step.replacements += 1
            replacement = self._spawn()
            self.workers.append(replacement)
            replacement.loading = asyncio.ensure_future(self._load(step, replacement))
        return lost

    def _discard(self, worker: _Worker) -> None:
        """Kill ``worker`` (if it still lives) and forget it; ``start()`` makes up the number."""
        worker.dead = True
        self.workers = [w for w in self.workers if w is not worker]
        try:
            self.ray.kill(worker.actor, no_restart=True)
        except Exception:
            log.debug("could not kill %s", worker.name, exc_info=True)

    async def _load_all(self, step: _Step) -> None:
        """Send this step's graph to every live worker that lacks it; return once one holds it (the others join
        as they finish loading: a worker that cannot be scheduled does not hold the step up)."""
        async with step.changed:
            while True:
                for worker in self.workers:
                    if worker.key != step.key and (worker.loading is None or worker.loading.done()):
                        worker.loading = asyncio.ensure_future(self._load(step, worker))
                if any(w.key == step.key for w in self.workers):
                    return
                if step.load_error is not None:
                    raise ConfigError(
                        f"the graph does not load on a Ray worker ({step.load_error}); the workers must import "
                        "langgraph_art and the graph's own modules (RayRollouts(runtime_env={'pip': [...], "
                        "'working_dir': ...}))"
                    )
                if not self.workers:
                    raise ConfigError("no Ray rollout worker could start; see the warnings above")
                await step.changed.wait()

    async def _load(self, step: _Step, worker: _Worker) -> None:
        """Send the graph to ``worker``; a worker that dies meanwhile is replaced (and counted lost). Never
        raises: a graph that does not load is ``step.load_error``."""
        threads = max(step.per_worker, 4)
        try:
            ref = worker.actor.load.remote(step.key, step.blob, threads)
            worker.pid = await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.start_timeout)
        except self._lost_errors() as exc:
            self._lose(step, worker, exc)
        except Exception as exc:  # noqa: BLE001 - said by _load_all (or, for a replacement, here)
            self._discard(worker)
            if isinstance(exc, TimeoutError):
                log.warning(
                    "%s did not start and load the graph within %.0f s (start_timeout): does Ray have %s free "
                    "CPU(s) for it?", worker.name, self.start_timeout, self.num_cpus_per_worker,
                )  # fmt: skip
            else:
                cause = getattr(exc, "cause", None) or exc
                step.load_error = f"{type(cause).__name__}: {cause}"
                log.warning("%s could not load the graph: %s", worker.name, step.load_error)
        else:
            worker.key = step.key
            latest = self._step
            if latest is not None and latest.key != step.key:  # the graph changed while it loaded: the new one
                worker.loading = asyncio.ensure_future(self._load(latest, worker))
        finally:
            async with step.changed:
                step.changed.notify_all()

    def _report(self, step: _Step) -> None:
        for lost in step.lost.values():
            worker = lost.worker
            log.warning(
                "Ray rollout worker %s (pid %s) was lost (%s): %d of its runs retried on other workers%s; "
                "replaced for the next runs",
                worker.name, worker.pid, lost.error, lost.retried,
                f", {lost.failed} failed after {self.max_retries} retries" if lost.failed else "",
            )  # fmt: skip
        if step.unpickled_states:
            log.warning(
                "the final state of %d run(s) did not pickle back from the Ray workers (%s): rewards that take "
                "`state` abstain on them; score them from `trajectory`",
                len(step.unpickled_states), step.unpickled_states[0],
            )  # fmt: skip


def _failed(meta: Mapping[str, Any], started: float, error: str) -> Trajectory:
    """The record of a run that never came back."""
    return Trajectory(
        id=uuid.uuid4().hex,
        start_time=started,
        end_time=time.time(),
        metadata={k: to_jsonable(v) for k, v in meta.items()},
        status="failed",
        error=error,
    )


def _close_at_exit(ref: weakref.ref[RayRollouts]) -> None:
    rollouts = ref()
    if rollouts is not None:
        try:
            rollouts.close()
        except Exception:
            log.debug("RayRollouts.close at exit failed", exc_info=True)
