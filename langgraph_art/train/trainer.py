"""``GRPOTrainer``: scored trajectory groups in, one step of LoRA updates out (``num_iterations``, 1 by default).

``step(groups)`` reads top to bottom: advantages -> token sequences -> length-sorted micro-batches -> for each of
``num_iterations`` passes: forward, loss, backward (gradient accumulation) -> clip -> AdamW; then metrics. A
non-finite loss or gradient in any pass aborts the step with the LoRA and the optimizer as they were before its
first pass (a later pass restores what the earlier ones changed), and no checkpoint is written for it.

Shortcuts, named: micro-batches group sequences of similar length (sorted) rather than packing several
sequences into one row, which would need block-diagonal attention masks the CPU attention path does not take.
With ``num_iterations=1`` (the default) a step is one optimizer update over all its sequences; with more, each pass
is one update over the same runs (TRL's mu, PPO epochs) and the clip keeps the policy near the one that sampled. The
first pass's logprobs, before the update, are the PPO ratio's reference; their gap to the sampler's is measured and,
by default, corrected with truncated importance weights (``train/mismatch.py``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError, LangGraphArtError, TrainingAborted
from langgraph_art.models.loading import (
    CHECKPOINTING_CPU_BYTES,
    LARGE_MODEL_BYTES,
    load_causal_lm,
    pick_device,
    return_large_buffers,
    set_gradient_checkpointing,
    trim_heap,
    weight_bytes,
)
from langgraph_art.models.lora import HookedLora, SharedBase
from langgraph_art.models.precision import AUTOCAST_CPU_BYTES, cpu_compute_dtype, measure_matmul
from langgraph_art.train import checkpoint
from langgraph_art.train.activations import ACTIVATION_SHARE, available_bytes, bytes_per_token, fit_micro_batches
from langgraph_art.train.advantages import Advantages, group_advantages
from langgraph_art.train.batches import (
    batch_tensors,
    batch_weight,
    first_trained_position,
    micro_batches,
)
from langgraph_art.train.constrained import batch_grammar_masks, grammar_mass, replay_grammars
from langgraph_art.train.distillation import reward_agreement, served_logprobs, teacher_metrics
from langgraph_art.train.forward import PolicyForward
from langgraph_art.train.loss import GrammarMasks, policy_loss
from langgraph_art.train.mismatch import MISMATCH_SUMS, Mismatch, importance_weights, mismatch_metrics
from langgraph_art.train.protocol import SFTExample
from langgraph_art.train.ranks import RankGroup
from langgraph_art.train.tokenize import TokenizeReport, TrainSequence, build_sequences, teacher_sequences
from langgraph_art.types import StepResult, TrajectoryGroup, Turn

log = logging.getLogger(__name__)


def train_dtype(config: GRPOConfig, device: str | None) -> torch.dtype:
    """The trainer's weights: ``config.dtype``; ``"auto"`` is bfloat16 on CUDA, float32 elsewhere (on CPU the
    compute may still be bfloat16: ``autocast_dtype``)."""
    if config.dtype == "bfloat16-autocast":
        return torch.float32
    if config.dtype != "auto":
        return getattr(torch, config.dtype)
    return torch.bfloat16 if pick_device(device).startswith("cuda") else torch.float32


def autocast_dtype(config: GRPOConfig, base: Any) -> torch.dtype | None:
    """The dtype the body's matmuls run in under autocast, None for the weights' own: bfloat16 for
    ``"bfloat16-autocast"``; for ``"auto"`` on CPU, bfloat16 for models of ``AUTOCAST_CPU_BYTES`` and more where
    this CPU's bfloat16 matmul measured ``BF16_MIN_SPEEDUP`` times float32's (``models/precision.py``), logged."""
    if config.dtype == "bfloat16-autocast":
        return torch.bfloat16
    if config.dtype != "auto" or base.device.type != "cpu" or next(base.parameters()).dtype != torch.float32:
        return None
    if weight_bytes(base) < AUTOCAST_CPU_BYTES:
        return None
    throughput = measure_matmul(torch.get_num_threads())
    chosen = cpu_compute_dtype(throughput)
    log.info("training in %s on this CPU: %s", chosen, throughput.describe())
    return torch.bfloat16 if chosen == "bfloat16" else None


class GRPOTrainer:
    """LoRA GRPO on ``base_model`` ("tiny", a hub id or a folder); checkpoints under ``checkpoint_dir``.

    The LoRA is ``models.lora.HookedLora`` on the base model's linear layers (not peft's wrappers), so the base
    can be the engine's own model (``shared``): one copy of the weights per process. Checkpoints are peft folders."""

    def __init__(
        self,
        base_model: str,
        config: GRPOConfig | None = None,
        *,
        checkpoint_dir: str | Path,
        device: str | None = None,
        shared: SharedBase | None = None,
        chat_template: str | None = None,
        ranks: RankGroup | None = None,
    ) -> None:
        """``shared``: an engine's model in this process (``LocalBackend`` passes it when the engine offers it) to
        train on instead of loading a copy; used when its dtype is the one this config trains in. ``chat_template``:
        the template the serving engine renders with (turns without prompt ids and SFT examples are rendered with
        it); a shared model comes with the engine's tokenizer. ``ranks``: this process's place among data-parallel
        training ranks that all get the same groups (``train/ranks.py``); None: one rank, even in a process group
        (a script of yours under torchrun rolls out different groups on each rank: they must not be summed)."""
        self.config = config or GRPOConfig()
        self.ranks = ranks or RankGroup()
        self.checkpoint_dir = Path(checkpoint_dir)
        dtype = train_dtype(self.config, device)
        if shared is not None and (
            next(shared.model.parameters()).dtype != dtype or shared.model.device.type != pick_device(device)
        ):
            log.info(
                "training %s in %s on its own copy: the engine's weights differ in dtype or device", base_model, dtype
            )
            shared = None
        if shared is None:
            base, self.tokenizer = load_causal_lm(base_model, device=device, dtype=dtype, chat_template=chat_template)
            self._lora = HookedLora(base)
        else:
            base, self.tokenizer, self._lora = shared.model, shared.tokenizer, shared.lora
        base.requires_grad_(False)
        self.model: Any = base  # the base model; run it with the adapter inside ``with trainer.adapter():``
        self.shares_weights = shared is not None
        self.adapter_name = f"trainer:{self.checkpoint_dir.resolve()}"  # ':' keeps it apart from served names
        self._named_params = self._lora.add_trainable(
            self.adapter_name,
            r=self.config.lora_r,
            alpha=self.config.lora_alpha,
            target_modules=self.config.target_modules,
            dropout=self.config.lora_dropout,
            seed=self.config.seed,
        )  # seeded as peft's get_peft_model was: the caller's RNG untouched
        try:
            self._setup(base)
        except BaseException:
            self.close()  # a shared model keeps no adapter of a trainer that failed to start
            raise

    def _setup(self, base: Any) -> None:
        self.device = base.device
        self._large = weight_bytes(base) >= LARGE_MODEL_BYTES
        # gradient checkpointing by default: from LARGE_MODEL_BYTES on a GPU, whose memory is what limits; on CPU from
        # CHECKPOINTING_CPU_BYTES (see there): below, the shared-prompt forward it rules out is worth more
        cpu = base.device.type == "cpu"
        self._checkpoint_by_default = weight_bytes(base) >= (CHECKPOINTING_CPU_BYTES if cpu else LARGE_MODEL_BYTES)
        self._checkpoint_now = self._checkpointing()  # an RL step's own (_plan_memory); SFT and scoring: this
        self._per_token = bytes_per_token(base.config, next(base.parameters()).element_size())
        self._trims_heap = self._large and base.device.type == "cpu"  # after each step (see trim_heap)
        if self._trims_heap:
            return_large_buffers()  # activation temporaries would otherwise pile up in the heap (see there)
        self.autocast = autocast_dtype(self.config, base)  # None: the weights' dtype
        self.forward = PolicyForward(base, self.autocast)  # sampled tokens' logprobs, no [B, T, V] logits
        self._params = list(self._named_params.values())
        self.optimizer = torch.optim.AdamW(
            self._params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay, foreach=True
        )
        self.step_count = 0
        self._grammars: Any = None
        self._resume()
        self.ranks.check_same(self.step_count, "latest checkpoint step")

    def adapter(self) -> Any:
        """``with trainer.adapter():`` runs ``trainer.model`` with the trained LoRA (outside: the base model)."""
        return self._lora.active(self.adapter_name)

    def named_lora_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The LoRA's parameters under the names peft saves them with (``...lora_A.weight``), in layer order."""
        return dict(self._named_params)

    def close(self) -> None:
        """Take this trainer's adapter off a shared model (a trainer with its own model just drops it)."""
        if self.adapter_name in self._lora.names():
            self._lora.remove(self.adapter_name)

    def update_config(self, config: GRPOConfig) -> None:
        """Take new hyper-parameters for the next steps; the LoRA's shape cannot change under a live adapter."""
        shape = ("lora_r", "lora_alpha", "lora_dropout", "target_modules", "dtype")
        changed = [k for k in shape if getattr(config, k) != getattr(self.config, k)]
        if changed:
            raise ConfigError(
                f"{changed} cannot change for a model that already has a LoRA; train a new model "
                "(another name) to use a different LoRA shape"
            )
        self.config = config
        for group in self.optimizer.param_groups:
            group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay

    def _checkpointing(self) -> bool:
        """``gradient_checkpointing``, where None means: on for models of ``LARGE_MODEL_BYTES`` and more on a GPU,
        ``CHECKPOINTING_CPU_BYTES`` and more on CPU (an RL step on CPU decides by its activations: ``_plan_memory``)."""
        if self.config.gradient_checkpointing is not None:
            return self.config.gradient_checkpointing
        return self._checkpoint_by_default

    def _plan_memory(self, batches: list[list[TrainSequence]]) -> list[list[TrainSequence]]:
        """This step's micro-batches and whether it checkpoints (``_checkpoint_now``). Under ``gradient_checkpointing
        =None`` on CPU: without checkpointing where the activations fit in ``ACTIVATION_SHARE`` of the memory
        available now, a micro-batch that does not fit split into parts that do; checkpointing only where a single
        sequence does not fit (``train/activations.py``). Elsewhere, or set: ``_checkpointing()``."""
        available = available_bytes() if self.device.type == "cpu" else None
        if self.config.gradient_checkpointing is not None or available is None or not batches:
            self._checkpoint_now = self._checkpointing()
            return batches
        fitted, self._checkpoint_now = fit_micro_batches(batches, self._per_token, int(available * ACTIVATION_SHARE))
        if len(fitted) > len(batches):
            log.info("step %d: %d micro-batches split into %d to train without gradient checkpointing",
                     self.step_count + 1, len(batches), len(fitted))  # fmt: skip
        return fitted

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA parameters (listed once: walking the module tree every step costs milliseconds)."""
        return self._params

    # -- the RL step -----------------------------------------------------------------------------------------
    def step(self, groups: Sequence[TrajectoryGroup]) -> StepResult:
        started = time.perf_counter()
        cfg = self.config
        # with a teacher, a group whose runs all scored the same still learns from it, token by token
        taught = cfg.teacher_model is not None and cfg.teacher_kl_coef > 0
        advantages = group_advantages(groups, cfg.scale_rewards, keep_uniform=taught)
        report = TokenizeReport(skipped=dict(advantages.skipped))
        runs = [t for g in groups for t in g.completed()]
        self._checkpoint_now = self._checkpointing()  # the teacher's forward; the update's: _plan_memory
        teacher, teacher_stats = self._teach(groups, advantages) if cfg.teacher_model is not None else (None, {})
        sequences = build_sequences(
            runs, advantages, self.tokenizer, nodes=cfg.trainable_nodes, max_length=cfg.max_length, report=report,
            teacher=teacher, teacher_kl_coef=cfg.teacher_kl_coef,
        )  # fmt: skip
        mismatched, forced = (
            replay_grammars(sequences, self.grammars()) if any(s.grammars for s in sequences) else (0, 0)
        )
        sequences = [s for s in sequences if any(s.mask)]  # a turn the grammar forced entirely teaches nothing
        if not sequences:
            return StepResult(
                self.step_count,
                False,
                skipped=report.skipped,
                reason="nothing to train on: " + (", ".join(report.skipped) or "no scored groups"),
                advantages=dict(advantages.by_trajectory),
            )

        batches = self.ranks.share(micro_batches(sequences, cfg.per_device_train_batch_size))  # this rank's
        batches = self._plan_memory(batches)  # split to fit without checkpointing, or checkpoint (CPU, None)
        total_tokens = sum(sum(s.mask) for s in sequences)
        keys = ["loss", "entropy", "kl", "clip_fraction", "ratio_mean"]
        keys += ["grammar/tokens", "grammar/mass"]  # summed: trained tokens under a grammar, the policy's mass inside
        sums, last = dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0.0)
        # each micro-batch's trainer logprobs before the update and its importance weights, from the first pass
        before: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        mismatches: list[Mismatch] = []
        norms: list[float] = []
        # num_iterations (TRL's, GRPO's mu) passes over the same runs, one update each: from the second pass on the
        # ratio to the sampler's logprobs moves away from 1 and the clip keeps the policy near the one that sampled
        with self._all_or_nothing(cfg.num_iterations > 1):  # an abort in pass 2 undoes pass 1's update
            for iteration in range(cfg.num_iterations):
                self.optimizer.zero_grad(set_to_none=True)
                aborted = self._accumulate(
                    batches, sequences, total_tokens, sums if iteration == 0 else last, before, mismatches
                )
                # the ranks' gradients summed: each micro-batch's loss is weighted by the step's global counts
                (failed,) = self.ranks.sum_gradients(self._params, [float(aborted is not None)])
                if failed:
                    raise aborted or TrainingAborted(
                        f"step {self.step_count + 1}: the loss is non-finite on another training rank; the weights "
                        "are as before the step and no checkpoint was written. Lower learning_rate or check the "
                        "rewards for extreme values."
                    )
                norms.append(float(torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), cfg.max_grad_norm)))
                if not math.isfinite(norms[-1]):
                    where = f" (pass {iteration + 1} of {cfg.num_iterations})" if cfg.num_iterations > 1 else ""
                    raise TrainingAborted(
                        f"step {self.step_count + 1}: the gradient norm is {norms[-1]}{where}; the weights are as "
                        "before the step and no checkpoint was written. Lower learning_rate or check the rewards "
                        "for extreme values."
                    )
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        if self._trims_heap:
            trim_heap()
        mine = [sum(getattr(m, f) for m in mismatches) for f in MISMATCH_SUMS]
        # each rank summed its own; the last value: the step's micro-batches over all ranks
        totals = self.ranks.sum_values([*sums.values(), *last.values(), *mine, float(len(batches))])
        sums, last = (
            dict(zip(keys, totals[: len(keys)], strict=True)),
            dict(zip(keys, totals[len(keys) : 2 * len(keys)], strict=True)),
        )
        mismatch = dict(zip(MISMATCH_SUMS, totals[2 * len(keys) : -1], strict=True))
        abs_max, checkpointed = self.ranks.max_values(
            [max((m.abs_max for m in mismatches), default=0.0), float(self._checkpoint_now)]
        )  # checkpointed: 1 when any rank recomputed its activations
        seconds = time.perf_counter() - started
        constrained, mass = sums.pop("grammar/tokens"), sums.pop("grammar/mass")
        metrics = {
            **{f"train/{k}": v for k, v in sums.items()},  # the first pass: before this step's update
            **{  # the passes after the first (none with num_iterations=1)
                f"train/later_passes/{k}": last[k] / (cfg.num_iterations - 1)
                for k in ("clip_fraction", "ratio_mean")
                if cfg.num_iterations > 1
            },
            "train/grad_norm": norms[0],  # the first pass's, before clipping, like the other train/ keys
            **({"train/later_passes/grad_norm": sum(norms[1:]) / len(norms[1:])} if len(norms) > 1 else {}),
            "train/sequences": float(len(sequences)),
            "train/longest_sequence": float(max(len(s) for s in sequences)),  # tokens: context and trained turns
            "train/micro_batches": totals[-1],  # all ranks'
            "train/gradient_checkpointing": checkpointed,
            "train/tokens": float(total_tokens),
            "train/tokens_per_s": total_tokens / seconds,
            "train/seconds": seconds,
            "train/truncated_tokens": float(report.truncated_tokens),
            **mismatch_metrics(mismatch, abs_max, cfg.importance_sampling_correction != "none"),
            **teacher_stats,
        }
        metrics.update({f"train/skipped/{k}": float(v) for k, v in report.skipped.items()})
        if constrained:  # structured output: how much of the policy's probability its grammars kept (1: all)
            metrics.update({"train/grammar/tokens": constrained, "train/grammar/mass": mass / constrained})
            metrics["train/grammar/mismatched_turns"] = float(mismatched)
            metrics["train/grammar/forced_tokens"] = float(forced)  # fed by jump-forward: context, not trained
        return StepResult(self.step_count, True, metrics, report.skipped, advantages=dict(advantages.by_trajectory))

    @torch.no_grad()
    def _teach(self, groups: Sequence[TrajectoryGroup], advantages: Advantages) -> tuple[dict[str, list[float]], dict]:
        """The teacher's logprobs of each trainable turn's sampled tokens (by turn id), in the teacher's context
        (``tokenize.teacher_sequences``), from one no-grad forward per micro-batch with the base model
        (``teacher_model="base"``: the LoRA off) or the policy as it is before this step's update (``"policy"``), or
        as a served teacher wrote them on the turns (``Turn.teacher_logprobs``); and the step's ``train/teacher/*``
        metrics (``train/distillation.py``)."""
        cfg = self.config
        started = time.perf_counter()
        by_group = [[r for r in g.completed() if r.id in advantages.by_trajectory] for g in groups]
        scored = [r for runs in by_group for r in runs]
        pairs = teacher_sequences(scored, self.tokenizer, nodes=cfg.trainable_nodes)
        sequences = [sequence for _, sequence in pairs]
        if any(s.grammars for s in sequences):
            replay_grammars(sequences, self.grammars())
        # 1 where the teacher's logprob counts (0: a grammar forced the token)
        scored_tokens = {turn.id: sequence.mask[len(sequence) - len(turn.token_ids) :] for turn, sequence in pairs}
        if cfg.teacher_is_served:
            out = {turn.id: served_logprobs(turn, cfg.teacher_model) for turn, _ in pairs}
        else:
            out = self._teacher_forward(pairs)
        sampler, teacher, reward = [], [], []
        ranked: list[list[tuple[float, float]]] = []  # per group, per run: (reward advantage, teacher term)
        for runs in by_group:
            ranked.append([])
            for run in runs:  # the trained tokens: the sampled ones, less those closing a structure or forced
                of_turn, term = advantages.of_turns(run), 0.0
                for turn in (t for t in run.trainable_turns(cfg.trainable_nodes) if t.id in out):
                    n = len(turn.token_ids) - min(turn.closing_tokens, len(turn.token_ids))
                    kept = [i for i in range(n) if scored_tokens[turn.id][i]]
                    sampler += [turn.logprobs[i] for i in kept]
                    teacher += [out[turn.id][i] for i in kept]
                    reward += [of_turn[turn.id]] * len(kept)
                    term += cfg.teacher_kl_coef * sum(out[turn.id][i] - turn.logprobs[i] for i in kept)
                ranked[-1].append((advantages.by_trajectory[run.id], term))
        seconds = time.perf_counter() - started
        agreement = reward_agreement(ranked)
        return out, teacher_metrics(sampler, teacher, reward, cfg.teacher_kl_coef, seconds, agreement)

    def _teacher_forward(self, pairs: list[tuple[Turn, TrainSequence]]) -> dict[str, list[float]]:
        """The held teacher's logprobs of each turn's sampled tokens: one no-grad forward per micro-batch, under the
        turns' grammar masks, with the LoRA off (``"base"``) or as it is before the update (``"policy"``)."""
        cfg = self.config
        where = {id(sequence): (turn, len(sequence) - len(turn.token_ids)) for turn, sequence in pairs}
        out: dict[str, list[float]] = {}
        with self._lora.active(None) if cfg.teacher_model == "base" else self.adapter():
            for batch in micro_batches([sequence for _, sequence in pairs], cfg.per_device_train_batch_size):
                ids, mask, _, _, temp = batch_tensors(batch, self.tokenizer.pad_token_id, self.device)
                first = first_trained_position(batch)
                masks = batch_grammar_masks(batch, first, self.device)
                trained = mask[:, first:].bool()  # the LM head runs on these positions only
                logprobs = self._token_logprobs(ids, first, ids[:, first:], temp, masks, trained=trained)[0]
                logprobs = logprobs.float().cpu()
                for row, sequence in enumerate(batch):
                    turn, start = where[id(sequence)]
                    out[turn.id] = logprobs[row, start - first : start - first + len(turn.token_ids)].tolist()
        return out

    def _accumulate(
        self, batches: list[list[TrainSequence]], sequences: list[TrainSequence], total_tokens: int,
        sums: dict[str, float], before: dict[int, tuple[torch.Tensor, torch.Tensor | None]],
        mismatches: list[Mismatch],
    ) -> TrainingAborted | None:  # fmt: skip
        """Forward and backward of this rank's micro-batches (gradients accumulate); a non-finite loss stops it and
        is returned, to be raised once every rank knows (``ranks.sum_gradients``). ``before``: each micro-batch's
        trainer logprobs before the step's update and importance weights, filled by the first pass (with its
        ``mismatches``) and read by the later ones."""
        with self._training():
            for index, batch in enumerate(batches):
                try:
                    self._backward(batch, sequences, total_tokens, sums, before, index, mismatches)
                except TrainingAborted as exc:
                    return exc
        return None

    def _backward(
        self, batch: list[TrainSequence], sequences: list[TrainSequence], total_tokens: int, sums: dict[str, float],
        before: dict[int, tuple[torch.Tensor, torch.Tensor | None]], index: int, mismatches: list[Mismatch],
    ) -> None:  # fmt: skip
        """One micro-batch: forward, loss, backward (gradients accumulate); its metrics added to ``sums``."""
        cfg = self.config
        ids, mask, sampler, adv, temp = batch_tensors(batch, self.tokenizer.pad_token_id, self.device)
        first = first_trained_position(batch)  # nothing before it is trained: no logits needed there
        targets, mask, sampler, adv = ids[:, first:], mask[:, first:], sampler[:, first:], adv[:, first:]
        masks = batch_grammar_masks(batch, first, self.device)  # where a grammar constrained the sampler
        trained = mask.bool()
        logprobs, token_entropy, log_mass = self._token_logprobs(ids, first, targets, temp, masks, trained=trained)
        ref = self._reference_logprobs(ids, first, targets, temp, masks, trained) if cfg.beta else None
        if index not in before:  # the first pass: the trainer's logprobs are the policy's before this step's update
            weights, mismatch = importance_weights(
                logprobs.detach(), sampler, mask, cfg.importance_sampling_correction, cfg.importance_sampling_cap
            )
            before[index] = (logprobs.detach(), weights)
            mismatches.append(mismatch)
        own, weights = before[index]
        # under a correction the ratio is to the trainer's own policy and the weights carry the sampler's drift
        old = own if cfg.importance_sampling_correction != "none" else sampler
        loss, stats = policy_loss(
            logprobs,
            old,
            adv,
            mask,
            loss_type=cfg.loss_type,
            epsilon=cfg.epsilon,
            epsilon_high=cfg.epsilon_high,
            beta=cfg.beta,
            ref_logprobs=ref,
            max_tokens=cfg.max_length,
            weights=weights,
        )
        weight = batch_weight(cfg.loss_type, batch, sequences, stats.tokens, total_tokens)
        if not torch.isfinite(loss):
            raise TrainingAborted(
                f"step {self.step_count + 1}: the loss is {loss.item()} (non-finite); the weights are as before the "
                "step and no checkpoint was written. Lower learning_rate or check the rewards for extreme values."
            )
        (loss * weight).backward()
        share = stats.tokens / max(total_tokens, 1)
        sums["loss"] += loss.detach().item() * weight
        for key, value in (
            ("entropy", float((token_entropy * mask).sum() / mask.sum().clamp(min=1))),
            ("kl", stats.kl),
            ("clip_fraction", stats.clip_fraction),
            ("ratio_mean", stats.ratio_mean),
        ):
            sums[key] += value * share
        if masks is not None:  # the policy's probability inside the grammar's mask, on the trained tokens under one
            tokens, mass = grammar_mass(masks, mask, log_mass)
            sums["grammar/tokens"] += tokens
            sums["grammar/mass"] += mass

    @contextlib.contextmanager
    def _all_or_nothing(self, several_passes: bool) -> Iterator[None]:
        """On ``TrainingAborted`` the LoRA and the optimizer's state go back to what they were on entry and the
        gradients are dropped. Only a step of several passes needs the copy (a LoRA's size, taken once a step): a
        single pass aborts before its optimizer step."""
        saved = None
        if several_passes:
            with torch.no_grad():
                params = [p.detach().clone() for p in self._params]
            saved = (params, copy.deepcopy(self.optimizer.state_dict()))
        try:
            yield
        except TrainingAborted:
            self.optimizer.zero_grad(set_to_none=True)
            if saved is not None:
                with torch.no_grad():
                    for param, value in zip(self._params, saved[0], strict=True):
                        param.copy_(value)
                self.optimizer.load_state_dict(saved[1])
            raise

    @contextlib.contextmanager
    def _training(self) -> Iterator[None]:
        """The model in training mode with this trainer's adapter active, and back in eval mode after (on shared
        weights the engine runs next)."""
        set_gradient_checkpointing(self.model, self._checkpoint_now)  # each turn: shared weights may differ
        self.model.train()
        try:
            with self.adapter():
                yield
        finally:
            self.model.eval()

    def sft(
        self,
        examples: Sequence[SFTExample],
        *,
        steps: int,
        learning_rate: float | None = None,
        nodes: Sequence[str] | None = None,
    ) -> list[float]:
        """Supervised warm-up of the same LoRA on conversations or trajectories; returns the loss per step.

        Each step is one pass over ``per_device_train_batch_size`` examples (cycling). Its own AdamW, so the RL
        optimizer's moments are not disturbed.
        """
        from langgraph_art.train.sft import sft_sequences, sft_steps

        sequences = sft_sequences(self.tokenizer, examples, nodes=nodes, max_length=self.config.max_length)
        if not sequences:
            raise LangGraphArtError("no SFT example has an assistant token to learn from")
        self._checkpoint_now = self._checkpointing()
        with self._training():
            return sft_steps(self, sequences, steps, learning_rate or self.config.learning_rate)

    def grammars(self) -> Any:
        """llguidance over this model's tokenizer and vocabulary (``models.grammar.Grammars``), built on the first
        step with a constrained turn, to replay the masks it was sampled under."""
        if self._grammars is None:
            from langgraph_art.models.grammar import Grammars

            self._grammars = Grammars(self.tokenizer, vocab_size=int(self.model.config.vocab_size))
        return self._grammars

    def _token_logprobs(
        self,
        ids: torch.Tensor,
        first: int,
        targets: torch.Tensor,
        temp: torch.Tensor,
        masks: GrammarMasks | None = None,
        share_prefix: bool = True,
        trained: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``PolicyForward.token_logprobs`` under this trainer's config (the adapter active is the caller's)."""
        return self.forward.token_logprobs(
            ids,
            first,
            targets,
            temp,
            masks,
            trained=trained,
            share_prefix=share_prefix and not self._checkpoint_now,
            chunk_size=self.config.logits_chunk_size,
            apply_masks=self.config.constrained_logprobs == "masked",
        )

    @torch.no_grad()
    def _reference_logprobs(
        self,
        ids: torch.Tensor,
        first: int,
        targets: torch.Tensor,
        temp: torch.Tensor,
        masks: GrammarMasks | None = None,
        trained: torch.Tensor | None = None,
    ) -> Any:
        with self._lora.active(None):  # the base model is the KL reference, under the same masks
            return self._token_logprobs(ids, first, targets, temp, masks, trained=trained)[0]

    # -- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write checkpoint ``step_count`` atomically; returns its folder (a peft adapter folder). Only rank 0
        writes (the ranks' LoRAs are identical); the others return the folder it writes."""
        if not self.ranks.writes:
            return checkpoint.step_dir(self.checkpoint_dir, self.step_count)
        name = getattr(self.model, "name_or_path", None)

        def write(folder: Path) -> None:
            self._lora.save_peft(self.adapter_name, folder, base_model=name)
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

        return checkpoint.save(
            self.checkpoint_dir,
            self.step_count,
            write,
            {"config": self.config.model_dump(), "world_size": self.ranks.world_size},
            keep=self.config.save_total_limit,
        )

    def _resume(self) -> None:
        step = checkpoint.load_latest(self.checkpoint_dir, self._named_params, self.optimizer, self.config)
        if step is not None:
            self.step_count = step
