"""``GRPOTrainer``: scored trajectory groups in, one LoRA update out.

``step(groups)`` reads top to bottom: advantages -> token sequences -> length-sorted micro-batches -> forward,
loss, backward (gradient accumulation) -> clip -> AdamW -> metrics. A non-finite loss or gradient aborts the step
before the optimizer touches the weights, and no checkpoint is written for it.

Shortcuts, named: micro-batches group sequences of similar length (sorted) rather than packing several
sequences into one row, which would need block-diagonal attention masks the CPU attention path does not take;
and a step is one optimizer update over all its sequences (no PPO epochs), so the importance ratio corrects
sampler/trainer drift rather than multiple passes.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError, LangGraphArtError, TrainingAborted
from langgraph_art.models.loading import cache_argument, cache_of, load_causal_lm, quiet_transformers
from langgraph_art.train import checkpoint
from langgraph_art.train.advantages import group_advantages
from langgraph_art.train.loss import (
    chunk_tokens,
    chunked_logprobs_and_entropy,
    policy_loss,
    token_logprobs_and_entropy,
)
from langgraph_art.train.tokenize import TokenizeReport, TrainSequence, build_sequences
from langgraph_art.types import StepResult, TrajectoryGroup

log = logging.getLogger(__name__)


def train_dtype(config: GRPOConfig, device: str | None) -> torch.dtype:
    """The trainer's weights: ``config.dtype``; ``"auto"`` is bfloat16 on CUDA, float32 elsewhere."""
    from langgraph_art.models.loading import pick_device

    if config.dtype != "auto":
        return getattr(torch, config.dtype)
    return torch.bfloat16 if pick_device(device).startswith("cuda") else torch.float32


class GRPOTrainer:
    """LoRA GRPO on ``base_model`` ("tiny", a hub id or a folder); checkpoints under ``checkpoint_dir``."""

    def __init__(
        self,
        base_model: str,
        config: GRPOConfig | None = None,
        *,
        checkpoint_dir: str | Path,
        device: str | None = None,
    ) -> None:
        from peft import LoraConfig, get_peft_model

        self.config = config or GRPOConfig()
        self.checkpoint_dir = Path(checkpoint_dir)
        base, self.tokenizer = load_causal_lm(base_model, device=device, dtype=train_dtype(self.config, device))
        lora = LoraConfig(
            r=self.config.lora_r,
            lora_alpha=self.config.lora_alpha,
            lora_dropout=self.config.lora_dropout,
            target_modules=self.config.target_modules,
        )
        cuda = [base.device.index or 0] if base.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), quiet_transformers():  # seeded LoRA init; the caller's RNG untouched
            torch.manual_seed(self.config.seed)
            self.model = get_peft_model(base, lora)
        self.device = base.device
        self._keeps_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self._cache_kwarg = cache_argument(base)
        # the LM head run in chunks over the body's hidden states; not for models that post-process their logits
        plain_head = not any(getattr(base.config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
        self._body: Any = base.get_decoder() if plain_head else None
        self._head: Any = base.get_output_embeddings() if plain_head else None
        self._body_cache_kwarg = cache_argument(self._body) if self._body is not None else ""
        self._checkpointing = False
        self._set_checkpointing(self.config.gradient_checkpointing)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self._params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay, foreach=True
        )
        self.step_count = 0
        self._saved_keys: dict[str, torch.nn.Parameter] | None = None
        self._resume()

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
        self._set_checkpointing(config.gradient_checkpointing)
        for group in self.optimizer.param_groups:
            group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay

    def _set_checkpointing(self, on: bool) -> None:
        if on == self._checkpointing:
            return
        base: Any = self.model.get_base_model()
        kwargs = {"use_reentrant": False}
        if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.20's name; the old one warns
            base.activation_checkpointing_enable(kwargs) if on else base.activation_checkpointing_disable()
        elif on:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_disable()
        self._checkpointing = on

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA parameters (listed once: walking the module tree every step costs milliseconds)."""
        return self._params

    # -- the RL step -----------------------------------------------------------------------------------------
    def step(self, groups: Sequence[TrajectoryGroup]) -> StepResult:
        started = time.perf_counter()
        cfg = self.config
        advantages = group_advantages(groups, cfg.scale_rewards)
        report = TokenizeReport(skipped=dict(advantages.skipped))
        runs = [t for g in groups for t in g.completed()]
        sequences = build_sequences(
            runs, advantages, self.tokenizer, nodes=cfg.trainable_nodes, max_length=cfg.max_length, report=report
        )
        if not sequences:
            return StepResult(
                self.step_count,
                False,
                skipped=report.skipped,
                reason="nothing to train on: " + (", ".join(report.skipped) or "no scored groups"),
                advantages=dict(advantages.by_trajectory),
            )

        if not self.model.get_base_model().training:  # the PeftModel's own flag says True over an eval() base
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        batches = _micro_batches(sequences, cfg.per_device_train_batch_size)
        total_tokens = sum(sum(s.mask) for s in sequences)
        sums = dict.fromkeys(("loss", "entropy", "kl", "clip_fraction", "ratio_mean", "sampler_logprob_gap"), 0.0)
        for batch in batches:
            ids, mask, old, adv, temp = _tensors(batch, self.tokenizer.pad_token_id, self.device)
            first = _first_trained_position(batch)  # nothing before it is trained: no logits needed there
            targets, mask, old, adv = ids[:, first:], mask[:, first:], old[:, first:], adv[:, first:]
            logprobs, token_entropy = self._token_logprobs(ids, first, targets, temp)  # [B, T-first] each
            ref = self._reference_logprobs(ids, first, targets, temp) if cfg.beta else None
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
            )
            weight = _batch_weight(cfg.loss_type, batch, sequences, stats.tokens, total_tokens)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingAborted(
                    f"step {self.step_count + 1}: the loss is {loss.item()} (non-finite); the "
                    "weights were not updated and no checkpoint was written. Lower "
                    "learning_rate or check the rewards for extreme values."
                )
            (loss * weight).backward()
            share = stats.tokens / max(total_tokens, 1)
            sums["loss"] += loss.detach().item() * weight
            for key, value in (
                ("entropy", float((token_entropy * mask).sum() / mask.sum().clamp(min=1))),
                ("kl", stats.kl),
                ("clip_fraction", stats.clip_fraction),
                ("ratio_mean", stats.ratio_mean),
                # the trainer's logprob of each sampled token against the sampler's, before this step's update:
                # the numeric mismatch (bf16, kernels) the importance ratio absorbs
                (
                    "sampler_logprob_gap",
                    float(((logprobs.detach() - old).abs() * mask).sum() / mask.sum().clamp(min=1)),
                ),
            ):
                sums[key] += value * share

        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingAborted(
                f"step {self.step_count + 1}: the gradient norm is {grad_norm}; the weights were "
                "not updated and no checkpoint was written"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        seconds = time.perf_counter() - started
        metrics = {
            **{f"train/{k}": v for k, v in sums.items()},
            "train/grad_norm": grad_norm,
            "train/sequences": float(len(sequences)),
            "train/tokens": float(total_tokens),
            "train/tokens_per_s": total_tokens / seconds,
            "train/seconds": seconds,
            "train/truncated_tokens": float(report.truncated_tokens),
        }
        metrics.update({f"train/skipped/{k}": float(v) for k, v in report.skipped.items()})
        return StepResult(self.step_count, True, metrics, report.skipped, advantages=dict(advantages.by_trajectory))

    def sft(
        self,
        examples: Sequence[Any],
        *,
        steps: int,
        learning_rate: float | None = None,
        nodes: Sequence[str] | None = None,
    ) -> list[float]:
        """Supervised warm-up of the same LoRA on conversations or trajectories; returns the loss per step.

        Each step is one pass over ``per_device_train_batch_size`` examples (cycling). Its own AdamW, so the RL
        optimizer's moments are not disturbed.
        """
        from langgraph_art.train.sft import sft_loss, sft_sequences

        sequences = sft_sequences(self.tokenizer, examples, nodes=nodes, max_length=self.config.max_length)
        if not sequences:
            raise LangGraphArtError("no SFT example has an assistant token to learn from")
        optimizer = torch.optim.AdamW(self.trainable_parameters(), lr=learning_rate or self.config.learning_rate)
        self.model.train()
        size, losses = self.config.per_device_train_batch_size, []
        for index in range(steps):
            start = (index * size) % len(sequences)
            batch = (sequences + sequences)[start : start + size]
            loss, _ = sft_loss(self.model, batch, self.tokenizer.pad_token_id, self.device)
            if not torch.isfinite(loss):
                raise TrainingAborted(f"SFT step {index + 1}: non-finite loss; lower the learning rate")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.config.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
        return losses

    def _token_logprobs(
        self, ids: torch.Tensor, first: int, targets: torch.Tensor, temp: torch.Tensor, share_prefix: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs (with grad) and entropy (detached) [B, T-first] of ``targets`` = ``ids[:, first:]``. The LM head
        runs only on positions ``first-1 .. T-2`` and in chunks (``logits_chunk_size``): no [B, T, V] logits, which
        for a 150k vocabulary and 8k tokens would be ~5 GB per sequence in float32."""
        if self._body is None or self._head is None:  # a model that post-processes its logits: the whole forward
            return token_logprobs_and_entropy(self._logits(ids, first), targets, temp)
        hidden = self._hidden(ids, first, share_prefix)  # [B, T-first, H]: position t predicts token t+1
        chunk = chunk_tokens(ids.shape[0], self._head.out_features, self.config.logits_chunk_size)
        return chunked_logprobs_and_entropy(hidden, self._head, targets, temp, chunk)

    def _hidden(self, ids: torch.Tensor, first: int, share_prefix: bool = True) -> torch.Tensor:
        """The final hidden states of positions ``first-1 .. T-2`` (those predicting tokens ``first .. T-1``). No
        attention mask: see ``_tensors``.

        A GRPO group's runs all start with the same prompt. The tokens every row starts with (before the first
        trained one) go through the model once; each row's KV cache is a copy of that one's, and the rest of the
        rows runs on top of it. Gradients flow back through the copies into the shared forward, so the result is
        the full forward's (tested), at a fraction of the cost when the prompt is long. Not with gradient
        checkpointing (transformers turns the KV cache off there)."""
        assert self._body is not None
        rows, width = ids.shape
        shared = _shared_prefix(ids, first - 1) if share_prefix and rows > 1 and not self._checkpointing else 0
        if shared < _MIN_SHARED_PREFIX:
            return self._body(input_ids=ids, use_cache=False).last_hidden_state[:, first - 1 : -1]
        prefix = self._body(input_ids=ids[:1, :shared], use_cache=True)
        cache = cache_of(prefix)
        cache.batch_repeat_interleave(rows)  # [1, ...] -> [B, ...] per layer, differentiable
        positions = torch.arange(shared, width, device=ids.device).expand(rows, -1)
        out = self._body(input_ids=ids[:, shared:], position_ids=positions, **{self._body_cache_kwarg: cache})
        return out.last_hidden_state[:, first - 1 - shared : -1]

    def _logits(self, ids: torch.Tensor, first: int) -> torch.Tensor:
        """Logits [B, T-first, V] of positions ``first-1 .. T-2`` through the whole model (``logits_to_keep``)."""
        if not self._keeps_logits:
            return self.model(input_ids=ids).logits[:, first - 1 : -1]
        return self.model(input_ids=ids, logits_to_keep=ids.shape[1] - first + 1).logits[:, :-1]

    @torch.no_grad()
    def _reference_logprobs(self, ids: torch.Tensor, first: int, targets: torch.Tensor, temp: torch.Tensor) -> Any:
        with self.model.disable_adapter():  # the base model is the KL reference
            return self._token_logprobs(ids, first, targets, temp)[0]

    # -- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write checkpoint ``step_count`` atomically; returns its folder (a peft adapter folder)."""

        def write(folder: Path) -> None:
            _save_adapter(self.model, self._adapter_tensors(), folder)
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

        return checkpoint.save(
            self.checkpoint_dir,
            self.step_count,
            write,
            {"config": self.config.model_dump()},
            keep=self.config.save_total_limit,
        )

    def _adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under the names peft saves them with. peft's ``get_peft_model_state_dict`` walks
        the whole model each time (~7 ms here); its keys are mapped to our parameters once, then read directly."""
        from peft import get_peft_model_state_dict

        if self._saved_keys is None:
            by_storage = {p.data_ptr(): p for p in self._params}
            state = get_peft_model_state_dict(self.model)
            if any(t.data_ptr() not in by_storage for t in state.values()):  # peft built copies: no shortcut
                return dict(state)
            self._saved_keys = {key: by_storage[t.data_ptr()] for key, t in state.items()}
        return {key: p.detach() for key, p in self._saved_keys.items()}

    def _resume(self) -> None:
        step = checkpoint.latest_step(self.checkpoint_dir)
        if step is None:
            return
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = checkpoint.step_dir(self.checkpoint_dir, step)
        set_peft_model_state_dict(self.model, load_file(folder / "adapter_model.safetensors"))
        optimizer_state = folder / "optimizer.pt"
        if optimizer_state.exists():
            self.optimizer.load_state_dict(torch.load(optimizer_state, map_location=self.device))
        self.step_count = step
        log.info("resumed from checkpoint %s", folder)


def _save_adapter(model: Any, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """The adapter as peft's ``save_pretrained`` writes it (``adapter_model.safetensors`` with the same keys,
    ``adapter_config.json`` in inference mode) without the README model card, whose template rendering took
    most of the ~50 ms a save cost: the loop saves after every step."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = model.peft_config["default"]
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = getattr(model.get_base_model(), "name_or_path", None)
    training, config.inference_mode = config.inference_mode, True
    try:
        config.save_pretrained(str(folder))
    finally:
        config.inference_mode = training


def _mean_gap(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |trainer logprob - sampler logprob| over the trained tokens [B, T], before the step's update: the
    numeric mismatch between engine and trainer (bf16, other kernels) that the importance ratio absorbs."""
    return float(((logprobs.detach() - old).abs() * mask).sum() / mask.sum().clamp(min=1))


def _micro_batches(sequences: list[TrainSequence], size: int) -> list[list[TrainSequence]]:
    ordered = sorted(sequences, key=len)  # similar lengths together: little padding
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def _batch_weight(
    loss_type: str, batch: list[TrainSequence], sequences: list[TrainSequence], tokens: int, total_tokens: int
) -> float:
    """Scale a micro-batch's loss so the accumulated gradient equals the loss over the whole step."""
    if loss_type in ("grpo", "gspo", "dr_grpo"):
        return len(batch) / len(sequences)
    return tokens / max(total_tokens, 1)


_MIN_SHARED_PREFIX = 16  # below this a second forward call can cost more than the tokens it saves (2-layer tiny)


def _shared_prefix(ids: torch.Tensor, limit: int) -> int:
    """How many leading columns (at most ``limit``) hold the same token in every row of ``ids`` [B, T]."""
    same = (ids[:, :limit] == ids[:1, :limit]).all(0)  # [limit]
    return int(same.long().cumprod(0).sum())


def _first_trained_position(batch: list[TrainSequence]) -> int:
    """The earliest position any sequence of the micro-batch trains on (>= 1: token 0 has no prediction)."""
    return max(1, min(seq.mask.index(1) for seq in batch))


def _tensors(batch: list[TrainSequence], pad: int, device: Any) -> tuple[torch.Tensor, ...]:
    """Right-padded [B, T] tensors: ids (pad id in padding), loss mask, sampler logprobs, advantages; and the
    sampling temperature per sequence [B].

    No attention mask: with right padding under causal attention, a real token only attends to the real tokens
    before it, never to the padding after it, so the model runs the plain causal path (no [B, T, T] mask).
    Positions are 0..T-1 for every row, which is also right. What the padding computes is masked out of the loss.
    """
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width))
    old = torch.zeros((len(batch), width))
    adv = torch.zeros((len(batch), width))
    for row, seq in enumerate(batch):
        n = len(seq)
        ids[row, :n] = torch.tensor(seq.input_ids)
        mask[row, :n] = torch.tensor(seq.mask, dtype=torch.float)
        old[row, :n] = torch.tensor(seq.old_logprobs)
        adv[row, :n] = torch.tensor(seq.advantages)
    temp = torch.tensor([s.temperature for s in batch])
    return tuple(t.to(device) for t in (ids, mask, old, adv, temp))
