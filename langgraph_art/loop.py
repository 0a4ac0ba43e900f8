"""``Trainer``: the training loop a user calls — rollouts -> rewards -> GRPO step -> checkpoint -> hot reload.

Each step gathers ``num_generations`` runs of the next scenarios with the current policy, stores them, scores
them, trains one LoRA update and serves the new checkpoint as ``project/name@step``; the next step's runs use it.
With ``max_steps_off_policy=N`` (N >= 1) the rollouts run up to N steps ahead of training: step k+1's runs sample
with the policy of step k-1 while step k trains, so the engine does not idle during the update. Each turn records
the policy step it was sampled with, the loss weights each token by its truncated importance weight (trainer /
sampler probability: ``GRPOConfig.importance_sampling_correction``), and each step reports how stale its runs were
(``off_policy/steps_mean``, ``_max``) and how far their logprobs are from the trainer's (``train/mismatch/*``). On
tiny-5m it took 0.65-0.70x the synchronous wall time (benchmarks/README.md, issue 15);
``LocalBackend(trainer_process=True)`` keeps the trainer's Python off the engine's GIL. The default stays 0: each
step trains on runs of the current policy, and a seeded run repeats itself (with N >= 1 which policy a rollout uses
depends on timing). With ``eval_scenarios`` the policy is also evaluated on them (``evaluation.py``: runs stored as
``split="eval"``, never trained on) before the first step, every ``eval_every`` steps and after the last.
Metrics go to ``<home>/<project>/runs/<name>/metrics.jsonl`` (one line per step, ``"split": "train"``, and one per
evaluation, ``"split": "eval"``) and the reward curve (train and eval) to ``reward_curve.png`` beside it; the run
log is ``runlog.py``. The same records go to the sinks (``sinks.py``): the installed integrations' (Langfuse by
``LANGFUSE_*`` or ``langfuse=True`` with ``langgraph-art-langfuse``; W&B by ``WANDB_*`` or ``wandb=True`` with
``langgraph-art-wandb``) and the user's own (``sinks=[...]``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.runnables import Runnable

from langgraph_art.backends.base import Backend
from langgraph_art.capture.branching import (
    Branching,
    abranch,
    branch_metrics,
    deletes_threads,
    find_pregel,
    with_checkpointer,
)
from langgraph_art.capture.rollout import agather_groups, check_checkpointer, check_scenarios
from langgraph_art.config import GRPOConfig
from langgraph_art.dynamic_sampling import refill
from langgraph_art.errors import ConfigError, TrainingAborted
from langgraph_art.evaluation import aevaluate
from langgraph_art.model import TrainableModel
from langgraph_art.progress import ProgressBar
from langgraph_art.rewards.combine import as_source, ascore_groups, place_caches
from langgraph_art.rollouts.protocol import Rollouts
from langgraph_art.runlog import append_record, plot_rewards
from langgraph_art.sinks import make_sinks
from langgraph_art.sync import run_sync
from langgraph_art.teacher import Teacher, show_teacher

log = logging.getLogger(__name__)


class _Rollout(NamedTuple):
    """A step's runs (each stored as it finished) and when they were sampled."""

    groups: list[Any]
    policy_step: int  # the checkpoint served when the rollout started
    started: float  # perf_counter at its start: the step's time counts from here
    wall: float  # time.time() at its start
    seconds: float
    metrics: Mapping[str, float]  # the rollouts' own (RayRollouts: rollouts/retried, rollouts/workers_lost)


class Trainer:
    """Train ``model`` on runs of ``graph`` (whose LLM is ``ChatART(model=model)``) scored by ``rewards``.

    Each step runs ``scenarios_per_step`` scenarios ``num_generations`` times with the current policy, stores and
    scores the runs, makes one GRPO update of the LoRA from the differences inside each scenario's group, writes a
    checkpoint and serves it, so the next step samples the new policy (``train``, ``atrain``, ``train_step``).
    ``warmup`` trains the same LoRA by SFT first. Metrics: ``history`` (one dict per step), ``evals``, and
    ``<home>/<project>/runs/<name>/metrics.jsonl`` with ``reward_curve.png`` beside it (``run_dir``).

    Args:
        graph: The compiled LangGraph graph (any ``Runnable``) to train, its LLM a ``ChatART(model=model)``.
        model: The ``TrainableModel``, registered with a backend (``art.LocalBackend()``,
            ``art.RemoteBackend(url)``).
        rewards: At least one: ``@art.reward`` functions, an ``art.RulerJudge``, or any ``art.RewardSource``.
            A run's reward is their weighted total.
        num_generations: Runs per scenario, the group GRPO compares (>= 2; default ``GRPOConfig.num_generations``,
            8). Given here or in ``config``, not both with different values.
        config: The ``GRPOConfig`` of the update and the LoRA (None: every field's default).
        scenarios_per_step: Scenarios per step, taken in turn from the list ``train`` gets (cycled).
        max_concurrency: Runs in flight at once during a step's rollouts and evaluations.
        max_steps_off_policy: How many steps the rollouts may run ahead of training (0: sample, then train,
            then sample; see the module docstring).
        eval_scenarios: Held-out scenarios, run ``eval_generations`` times each and scored with ``eval_rewards``
            before the first step, every ``eval_every`` steps and after the last; never trained on.
        eval_every: Steps between evaluations (None: only before the first step and after the last).
        eval_generations: Runs per evaluation scenario (>= 2 for a group judge such as ``RulerJudge``).
        eval_rewards: The evaluation's rewards (None: ``rewards``).
        langfuse: For the ``langgraph-art-langfuse`` integration: None follows the environment (on when
            ``LANGFUSE_PUBLIC_KEY`` and ``LANGFUSE_SECRET_KEY`` are set), True requires it, False never; or your
            own ``LangfuseExporter``.
        wandb: For the ``langgraph-art-wandb`` integration: None follows the environment (``WANDB_API_KEY`` /
            ``WANDB_PROJECT`` set, or ``WANDB_MODE`` offline/online), True requires it, False never; or a dict of
            ``wandb.init`` arguments.
        sinks: Your own ``art.Sink`` objects, given each step's and each evaluation's record.
        rollouts: Where each step's runs happen: None on this process's event loop, ``art.RayRollouts(...)`` on
            Ray actors (evaluation stays here).
        branching: ``art.Branching(groups_per_step=4)`` adds groups of continuations resumed from checkpoints
            inside each step's runs (docs/guides/branching.md). A graph without a checkpointer is run as a copy
            with one (the graph you pass is not changed).
        resume: For graphs that call ``interrupt()``: ``resume(interrupts, state)`` gives the value each
            interrupted run (and continuation) is resumed with, ``Command(resume=value)``; None: such a run ends
            ``interrupted`` and is scored as it stands. Needs a checkpointer (or ``branching``).
        teacher: ``art.Teacher(...)``: on-policy distillation, a teacher's logprobs of each sampled token as a
            per-token advantage beside the reward's (``teacher.py``, docs/guides/distillation.md).
        dynamic_sampling: Up to this many further scenarios a step samples in place of groups whose runs all
            scored the same, which teach GRPO nothing (DAPO's dynamic sampling; ``dynamic_sampling.py``). 0: off.

    Raises:
        ConfigError: A setting that cannot work, with what to change.

    Example:
        ```python
        trainer = art.Trainer(graph, model, rewards=[right_answer], scenarios_per_step=2,
                              eval_scenarios=held_out)
        history = trainer.train(scenarios, steps=10)   # one dict of metrics per step
        trainer.evals[-1]["eval/reward/mean"]          # the held-out score after the last step
        ```
    """

    def __init__(
        self,
        graph: Runnable,
        model: TrainableModel,
        *,
        rewards: Sequence[Any],
        num_generations: int | None = None,
        config: GRPOConfig | None = None,
        scenarios_per_step: int = 1,
        max_concurrency: int = 8,
        max_steps_off_policy: int = 0,
        eval_scenarios: Sequence[Mapping[str, Any]] | None = None,
        eval_every: int | None = None,
        eval_generations: int = 1,
        eval_rewards: Sequence[Any] | None = None,
        langfuse: Any = None,
        wandb: Any = None,
        sinks: Sequence[Any] = (),
        rollouts: Rollouts | None = None,
        branching: Branching | None = None,
        resume: Callable[[Any, Any], Any] | None = None,
        teacher: Teacher | None = None,
        dynamic_sampling: int = 0,
    ) -> None:
        """See the class docstring for the arguments."""
        if (
            isinstance(max_steps_off_policy, bool)
            or not isinstance(max_steps_off_policy, int)
            or max_steps_off_policy < 0
        ):
            raise ConfigError(
                f"max_steps_off_policy must be an int >= 0 (0: synchronous), got {max_steps_off_policy!r}"
            )
        if not rewards:
            raise ConfigError("Trainer needs at least one reward: rewards=[my_reward_fn, art.RulerJudge(...)]")
        if isinstance(dynamic_sampling, bool) or not isinstance(dynamic_sampling, int) or dynamic_sampling < 0:
            raise ConfigError(
                f"dynamic_sampling must be an int >= 0 (further groups a step may sample; 0: off), got "
                f"{dynamic_sampling!r}"
            )
        if dynamic_sampling and branching is not None:
            raise ConfigError("dynamic_sampling replaces whole-run groups: use it without branching=...")
        _check_eval(eval_scenarios, eval_every, eval_generations, eval_rewards)
        if rollouts is not None and not callable(getattr(rollouts, "agather", None)):
            raise ConfigError(
                f"rollouts must be None (runs on this event loop) or an object with an async agather(...), such as "
                f"art.RayRollouts(num_workers=2); got {type(rollouts).__name__}"
            )
        if branching is not None and not isinstance(branching, Branching):
            raise ConfigError(f"branching must be art.Branching(...) or None, got {type(branching).__name__}")
        if rollouts is not None and (branching is not None or resume is not None):
            raise ConfigError("branching and resume run in this process: leave rollouts=None to use them")
        if resume is not None and not callable(resume):
            raise ConfigError(f"resume must be a function (interrupts, state) -> value, got {type(resume).__name__}")
        if not isinstance(model.backend, Backend):
            raise ConfigError(
                f"{type(model.backend).__name__} cannot train: register the model with art.LocalBackend() or "
                "art.RemoteBackend(url), or a backend with every method of langgraph_art.Backend"
            )
        self.graph, self.model, self.rewards = graph, model, list(rewards)
        self.config = _with_teacher(_with_generations(config or GRPOConfig(), num_generations), teacher)
        self.teacher = teacher
        self.dynamic_sampling = dynamic_sampling
        self._more_scenarios: Callable[[int], list[Mapping[str, Any]]] | None = None  # set by atrain
        self.scenarios_per_step, self.max_concurrency = scenarios_per_step, max_concurrency
        self.max_steps_off_policy = max_steps_off_policy
        self.rollouts = rollouts
        self.branching, self.resume = branching, resume
        self.run_graph, self._own_checkpointer = graph, False  # the graph the training runs use
        if branching is not None:
            self.run_graph, self._own_checkpointer = with_checkpointer(graph, branching.checkpointer)
        self._branch_rng = random.Random(branching.seed if branching else None)
        pregel = find_pregel(self.run_graph)
        if resume is not None and (pregel is None or pregel.checkpointer in (None, False)):
            raise ConfigError(
                "resume=... resumes runs from their checkpoints: compile the graph with a checkpointer "
                "(graph.compile(checkpointer=InMemorySaver()); interrupt() needs one too) or pass branching=..."
            )
        check_checkpointer(self.run_graph, history=branching is not None or resume is not None)  # async savers only
        check_checkpointer(graph, history=resume is not None)  # the evaluation runs' graph
        self.backend: Backend = model.backend
        self.store = self.backend.store(model)
        self.run_id = uuid.uuid4().hex[:12]
        self.history: list[dict[str, float]] = []
        self.eval_scenarios = list(eval_scenarios or [])
        self.eval_every, self.eval_generations = eval_every, eval_generations
        self.eval_rewards = list(eval_rewards) if eval_rewards else self.rewards
        place_caches([*self.rewards, *self.eval_rewards], self.backend.home)  # a judge's cache: with the model's data
        self.evals: list[dict[str, Any]] = []  # one record per evaluation (as in metrics.jsonl)
        self._skips = 0  # training steps that found nothing to train on
        self.sinks = make_sinks(
            settings={"langfuse": langfuse, "wandb": wandb},
            extra=sinks,
            store=self.store,
            project=model.project,
            home=self.backend.home,
        )

    @property
    def run_dir(self) -> Path:
        return self.backend.run_dir(self.model)

    def warmup(self, examples: Sequence[Any], *, steps: int, learning_rate: float | None = None) -> list[float]:
        """SFT warm-up (conversations or stored trajectories) before RL; returns the loss per step. Works inside a
        running event loop too (there, ``await trainer.awarmup(...)`` does not block it)."""
        return run_sync(self.awarmup(examples, steps=steps, learning_rate=learning_rate))

    async def awarmup(self, examples: Sequence[Any], *, steps: int, learning_rate: float | None = None) -> list[float]:
        """Async ``warmup``: the SFT runs in a worker thread, so the caller's event loop stays responsive."""
        return await asyncio.to_thread(
            self.backend.warmup, self.model, examples, steps=steps, learning_rate=learning_rate, config=self.config
        )

    def train(self, scenarios: Sequence[Mapping[str, Any]], steps: int, *, progress: bool = True) -> list[dict]:
        """Run ``steps`` training steps over ``scenarios`` (cycled); returns the metrics of each step.

        Works from plain code and inside a running event loop (a notebook); in async code ``await
        trainer.atrain(...)`` runs on your loop instead of blocking it."""
        return run_sync(self.atrain(scenarios, steps, progress=progress))

    async def atrain(self, scenarios: Sequence[Mapping[str, Any]], steps: int, *, progress: bool = True) -> list[dict]:
        """Async ``train``: rollouts run on the caller's event loop, the GRPO step in a worker thread. (A graph with
        sync nodes: give your loop a default executor of at least ``max_concurrency`` threads; see
        ``agather_groups``.)"""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps must be an int >= 1, got {steps!r}")
        if not scenarios:
            raise ConfigError("scenarios is empty: pass a list of {'input': ..., **reference data} dicts")
        check_scenarios(scenarios)
        await asyncio.to_thread(self.backend.trainer, self.model, self.config)  # load (or resume) before rollouts
        for sink in self.sinks:
            await asyncio.to_thread(sink.start, self._run_info(steps))
        cycle = itertools.cycle(scenarios)
        self._more_scenarios = lambda n: [next(cycle) for _ in range(n)]  # dynamic sampling's further scenarios
        curve = None
        try:
            await self._evaluate()  # the policy before this call's first step (skipped if evaluated already)
            with ProgressBar("training", steps, progress) as bar:
                await self._pipeline(lambda: [next(cycle) for _ in range(self.scenarios_per_step)], steps, bar)
            await self._evaluate()  # and after its last
            curve = await asyncio.to_thread(self.plot)
        finally:
            await asyncio.to_thread(self.flush_exports, curve=curve)
        return self.history

    def _run_info(self, steps: int) -> dict[str, Any]:
        """What a sink records as the run's configuration."""
        return {
            "run": self.run_id,
            "model": self.model.name,
            "project": self.model.project,
            "base_model": self.model.base_model,
            "steps": steps,
            "scenarios_per_step": self.scenarios_per_step,
            "max_steps_off_policy": self.max_steps_off_policy,
            "rewards": [as_source(r).name for r in self.rewards],
            "eval_scenarios": len(self.eval_scenarios),
            "eval_every": self.eval_every,
            **self.config.model_dump(mode="json"),
        }

    async def _evaluate(self) -> None:
        """Evaluate the policy served now on ``eval_scenarios`` (unless this iteration was evaluated already) and
        log the record."""
        iteration = len(self.history)
        if not self.eval_scenarios or (self.evals and self.evals[-1]["iteration"] == iteration):
            return
        wall = time.time()
        policy_step = await asyncio.to_thread(self.backend.current_step, self.model)
        result = await aevaluate(
            self.graph,
            self.eval_scenarios,
            self.eval_rewards,
            num_generations=self.eval_generations,
            max_concurrency=self.max_concurrency,
            store=self.store,
            recorders=[self.model.recorder],
            metadata={"policy_step": policy_step, "training_run": self.run_id, "iteration": iteration},
            resume=self.resume,
            delete_threads=deletes_threads(self.branching, self._own_checkpointer),  # as the steps' threads
        )
        record = {"split": "eval", "iteration": iteration, "step": policy_step, "policy_step": policy_step,
                  **result.metrics}  # fmt: skip
        self.evals.append(record)
        await asyncio.to_thread(self._log, record, wall)

    async def _pipeline(self, next_batch: Any, steps: int, bar: ProgressBar) -> None:
        """Rollouts in order, each step's learning (rewards, update, checkpoint) in a task after the previous one;
        rollout i waits until at most ``max_steps_off_policy`` steps are still untrained."""
        learning: list[asyncio.Task[dict[str, float]]] = []
        done = 0
        try:
            for i in range(steps):
                while i - done > self.max_steps_off_policy:
                    self._advance(bar, await learning[done])
                    done += 1
                    await self._evaluate_every()
                rollout = await self._rollout(next_batch())
                previous = learning[-1] if learning else None
                learning.append(asyncio.create_task(self._learn_after(previous, rollout)))
            while done < steps:
                self._advance(bar, await learning[done])
                done += 1
                if done < steps:  # the last step's evaluation is atrain's, after the progress bar
                    await self._evaluate_every()
        finally:  # an error or a cancel: the steps already training finish (their checkpoints are atomic)
            pending = [task for task in learning if not task.done()]
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _evaluate_every(self) -> None:
        if self.eval_every and len(self.history) % self.eval_every == 0:
            await self._evaluate()

    @staticmethod
    def _advance(bar: ProgressBar, m: dict[str, float]) -> None:
        bar.advance(f"reward {m['reward/mean']:.3f} ± {m['reward/std']:.3f}  step {m['time/step_s']:.2f}s")

    def flush_exports(self, timeout: float = 30.0, *, curve: Path | None = None) -> None:
        """End this ``train()`` in every sink: the curve, a bounded wait for the background deliveries, a word on
        what did not arrive and how to send it."""
        for sink in self.sinks:
            sink.finish(curve=curve, timeout=timeout)

    def train_step(self, scenarios: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """One step: rollouts of ``scenarios``, rewards, one GRPO update, checkpoint; returns the step's metrics."""
        return run_sync(self.atrain_step(scenarios))

    async def atrain_step(self, scenarios: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Async ``train_step`` (dynamic sampling draws its further scenarios from ``scenarios``, in turn)."""
        cycle = itertools.cycle(scenarios)
        self._more_scenarios = lambda n: [next(cycle) for _ in range(n)]
        return await self._learn(await self._rollout(scenarios))

    async def _rollout(self, scenarios: Sequence[Mapping[str, Any]]) -> _Rollout:
        """The step's runs, each stored as it finishes."""
        started, wall = time.perf_counter(), time.time()
        policy_step = await asyncio.to_thread(self.backend.current_step, self.model)
        engine_before = await asyncio.to_thread(self.backend.engine_stats, self.model)
        metadata = {"policy_step": policy_step, "training_run": self.run_id, "split": "train"}
        metrics: Mapping[str, float] = {}
        if self.rollouts is None:
            groups = await agather_groups(
                self.run_graph,
                scenarios,
                self.config.num_generations,
                max_concurrency=self.max_concurrency,
                recorders=[self.model.recorder],
                store=self.store,
                progress=False,
                metadata=metadata,
                resume=self.resume,
            )
            if self.branching is not None:
                branch_started = time.perf_counter()
                groups += await self._branch(groups, metadata)
                metrics = {"branch/time_s": time.perf_counter() - branch_started}
        else:
            groups, metrics = await self.rollouts.agather(
                self.graph,
                scenarios,
                self.config.num_generations,
                max_concurrency=self.max_concurrency,
                metadata=metadata,
                store=self.store,
            )
        engine_after = await asyncio.to_thread(self.backend.engine_stats, self.model)
        metrics = {**metrics, **engine_metrics(engine_before, engine_after)}
        return _Rollout(groups, policy_step, started, wall, time.perf_counter() - started, metrics)

    async def _more_groups(self, scenarios: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Dynamic sampling's further groups: rollouts of ``scenarios`` with the policy served now."""
        return list((await self._rollout(scenarios)).groups)

    async def _branch(self, groups: list[Any], metadata: Mapping[str, Any]) -> list[Any]:
        """The step's branch groups (``abranch``)."""
        assert self.branching is not None
        return await abranch(self.run_graph, groups, self.branching, self._branch_rng,
                             num_generations=self.branching.num_generations or self.config.num_generations,
                             own_checkpointer=self._own_checkpointer, max_concurrency=self.max_concurrency,
                             metadata=metadata, recorders=[self.model.recorder], store=self.store,
                             resume=self.resume)  # fmt: skip

    async def _learn_after(self, previous: asyncio.Task[Any] | None, rollout: _Rollout) -> dict[str, float]:
        """``_learn`` once the step before has learned; if that one failed, this step's groups are stored unscored
        and its error is raised here too (the runs themselves were stored as they finished)."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                for group in rollout.groups:
                    await asyncio.to_thread(self.store.add_group, group)
                raise TrainingAborted("an earlier step failed; this step's runs are stored, not trained on")
        return await self._learn(rollout)

    async def _learn(self, rollout: _Rollout) -> dict[str, float]:
        """Rewards, one update, checkpoint, metrics (the step's time counts from its rollout's start)."""
        groups, policy_step = rollout.groups, rollout.policy_step
        whole = [g for g in groups if "branch" not in g.metadata]
        branches = [g for g in groups if "branch" in g.metadata]
        trained = branches if self.branching and not self.branching.train_whole_runs else groups
        learn_started = time.perf_counter()
        report = await ascore_groups(whole, self.rewards)
        sampled: Mapping[str, float] = {}
        if self.dynamic_sampling and self._more_scenarios is not None:  # further groups for the uniform ones
            more = self._more_scenarios
            extra, sampled = await refill(
                whole, lambda n: self._more_groups(more(n)), lambda g: ascore_groups(g, self.rewards),
                self.dynamic_sampling,
            )  # fmt: skip
            groups, trained = [*groups, *extra], [*trained, *extra]
        branch_report = await ascore_groups(branches, self.rewards) if branches else None
        branch_mean = branch_report.metrics.get("reward/total", float("nan")) if branch_report else float("nan")
        trained_on = await asyncio.to_thread(self.backend.current_step, self.model)
        if self.teacher is not None and self.teacher.prompt is not None:
            show_teacher(trained, self.teacher.prompt)  # what the teacher sees of each call, kept with the run
        try:
            result = await asyncio.to_thread(self.backend.train_step, self.model, trained, self.config)
            for t in (t for g in groups for t in g.trajectories if t.id in result.advantages):
                t.metadata["advantage"] = result.advantages[t.id]  # what the trainer used, computed once there
        finally:  # rewards (and advantages) are part of the record, kept even when the step fails
            for group in groups:
                await asyncio.to_thread(self.store.add_group, group)
        lags = [trained_on - turn.policy_step for g in groups for t in g.trajectories for turn in t.turns()
                if turn.policy_step is not None]  # fmt: skip
        metrics = {
            "step": float(result.step),
            "policy_step": float(policy_step),
            **report.summary(groups),  # reward/mean (of the runs' weighted totals), reward/std, runs/failed, ...
            "rollout/sampled_tokens": float(sum(t.sampled_tokens() for g in groups for t in g.trajectories)),
            # call-like text the server's tool-call parser could not read (it stayed content; see the models guide)
            "tool_calls/unparsed": float(sum(t.unparsed_tool_calls() for g in groups for t in g.trajectories)),
            **(branch_metrics(branches, branch_mean) if self.branching else {}),
            **sampled,
            "time/rollout_s": rollout.seconds,
            "time/learn_s": time.perf_counter() - learn_started,
            "time/step_s": time.perf_counter() - rollout.started,
            "off_policy/steps_mean": sum(lags) / len(lags) if lags else 0.0,
            "off_policy/steps_max": float(max(lags, default=0)),
            "train/updated": float(result.updated),
            **result.metrics,
            **rollout.metrics,
        }
        if not result.updated:  # warned once; later ones at INFO (train/updated = 0 in the metrics says it too)
            log.log(logging.INFO if self._skips else logging.WARNING, "step skipped: %s%s", result.reason,
                    "" if self._skips else " (further skipped steps are logged at INFO)")  # fmt: skip
            self._skips += 1
        self.history.append(metrics)
        # iteration: 1, 2, ... in this run ("step" is the checkpoint, which does not move on a skipped step)
        record = {"split": "train", "iteration": len(self.history), **metrics}
        await asyncio.to_thread(self._log, record, rollout.wall)
        return metrics

    def _log(self, metrics: Mapping[str, Any], wall: float) -> None:
        """Append a step's (or an evaluation's) record to the run log and hand it to the sinks."""
        record = {"run": self.run_id, "model": self.model.name, "started": wall, "finished": time.time(), **metrics}
        append_record(self.run_dir, record)
        for sink in self.sinks:
            sink.submit(record)

    def plot(self, path: str | Path | None = None) -> Path | None:
        """Write the reward curve (train: mean and std per step; eval: each evaluation's mean) as a PNG; needs
        matplotlib."""
        target = Path(path) if path else self.run_dir / "reward_curve.png"
        return plot_rewards(self.history, target, f"{self.model.name} ({self.model.project})", evals=self.evals)


def engine_metrics(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What the engine did during a rollout, from its counters before and after (``Backend.engine_stats``):
    ``engine/prompt_tokens`` sent, ``engine/prefill_tokens`` computed, ``engine/prefix_cache_hit_rate`` (of the
    prompt tokens looked up, the share whose KV was reused), ``engine/prefix_cache_evictions`` (blocks) and
    ``engine/prefix_cache_bytes`` held after it, ``engine/prefill_s`` and ``engine/decode_s`` (the engine worker's
    seconds in prefill forwards and in decode steps). Steps that overlap (``max_steps_off_policy``) share their
    counts."""
    delta = {key: after[key] - before.get(key, 0) for key in after if key != "prefix_cache_bytes"}
    metrics = {f"engine/{key}": float(delta[key]) for key in ("prompt_tokens", "prefill_tokens") if key in delta}
    for key in ("prefill", "decode"):  # the engine worker's seconds (the HF engine counts them)
        if f"{key}_seconds" in delta:
            metrics[f"engine/{key}_s"] = float(delta[f"{key}_seconds"])
    queries = delta.get("prefix_cache_queries", 0)
    if queries:
        metrics["engine/prefix_cache_hit_rate"] = delta.get("prefix_cache_hits", 0) / queries
    if "prefix_cache_evictions" in delta:
        metrics["engine/prefix_cache_evictions"] = float(delta["prefix_cache_evictions"])
    if "prefix_cache_bytes" in after:
        metrics["engine/prefix_cache_bytes"] = float(after["prefix_cache_bytes"])
    return metrics


def _with_teacher(config: GRPOConfig, teacher: Teacher | None) -> GRPOConfig:
    """``config`` with ``teacher``'s model and weight (a config that names another teacher is an error)."""
    if teacher is None:
        return config
    if not isinstance(teacher, Teacher):
        raise ConfigError(f"teacher must be art.Teacher(...) or None, got {type(teacher).__name__}")
    if config.teacher_model not in (None, teacher.model):
        raise ConfigError(
            f"GRPOConfig(teacher_model={config.teacher_model!r}) and Teacher(model={teacher.model!r}) differ: "
            "name the teacher in one place"
        )
    update = {"teacher_model": teacher.model, "teacher_kl_coef": teacher.kl_coef, "teacher_base_url": teacher.base_url}
    return config.model_copy(update=update)  # validated: a base_url must be a server's URL


def _check_eval(scenarios: Any, every: Any, generations: Any, rewards: Any) -> None:
    """Evaluation settings that can run, or a ConfigError that says what to change."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ConfigError(f"eval_every must be an int >= 1 (evaluate every that many steps) or None, got {every!r}")
    if isinstance(generations, bool) or not isinstance(generations, int) or generations < 1:
        raise ConfigError(f"eval_generations must be an int >= 1 (runs per eval scenario), got {generations!r}")
    if not scenarios and (every is not None or rewards):
        raise ConfigError("eval_every/eval_rewards need eval_scenarios=[...] (held-out scenarios to evaluate on)")
    if scenarios:
        check_scenarios(scenarios)


def _with_generations(config: GRPOConfig, num_generations: int | None) -> GRPOConfig:
    """``config`` with ``num_generations`` when given; a config that set another value on purpose is an error (the
    argument used to overwrite it silently)."""
    if num_generations is None:
        return config
    if "num_generations" in config.model_fields_set and config.num_generations != num_generations:
        raise ConfigError(
            f"num_generations={num_generations} and GRPOConfig(num_generations={config.num_generations}) disagree; "
            "give it in one place"
        )
    return config.model_copy(update={"num_generations": num_generations})  # validated: a ConfigError if bad
