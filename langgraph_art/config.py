"""Training configuration, validated with messages that say how to fix a bad value (TRL's field names where the
concept matches)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from langgraph_art.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)


def check_name(value: str) -> str:
    """A policy or project name: it becomes a folder name and the ``name`` of ``name@step``. Raises ValueError."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{value!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (no '@' or '/'; "
            "the step is added as name@step)"
        )
    return value


def served_name(project: str, name: str) -> str:
    """What a policy is served as: ``project/name`` (then ``project/name@step``), so two projects may each have an
    ``agent`` on one service without sharing adapters."""
    return f"{check_name(project)}/{check_name(name)}"


def check_served_name(value: str) -> str:
    """A policy name as registered with a service: ``project/name``, or a plain ``name``. Raises ValueError."""
    for part in value.split("/", 1) if isinstance(value, str) else [value]:
        check_name(part)
    return value


class GRPOConfig(BaseModel):
    """Hyper-parameters of the GRPO step and the LoRA it trains."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(
        default=1e-5, description="AdamW's learning rate for the LoRA (1e-5 to 1e-4 on a real model)."
    )
    num_generations: int = Field(
        default=8,
        description="Runs per scenario: the group GRPO compares (>= 2). Trainer(num_generations=...) sets it too; "
        "giving both with different values is an error.",
    )
    beta: float = Field(default=0.0, description="KL coefficient against the base model (0: no reference forward).")
    epsilon: float = Field(default=0.2, description="Clip range of the importance ratio (PPO's epsilon).")
    epsilon_high: float | None = Field(
        default=None, description="Upper clip range when it differs from epsilon (DAPO's clip-higher); None: epsilon."
    )
    loss_type: Literal["grpo", "dr_grpo", "bnpo", "cispo", "gspo"] = Field(
        default="grpo",
        description="How token losses are averaged and clipped: grpo (per sequence), dr_grpo (a constant), bnpo "
        "(per token of the batch), cispo (clipped weights), gspo (sequence-level ratios; needs a tiny epsilon).",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group", description="Divide advantages by the reward std of the group, of the batch, or not at all."
    )
    max_grad_norm: float = Field(default=1.0, description="Gradients are clipped to this global norm.")
    weight_decay: float = Field(default=0.0, description="AdamW's weight decay.")
    per_device_train_batch_size: int = Field(
        default=8, description="Sequences per micro-batch (gradient accumulation over the step's micro-batches)."
    )
    num_iterations: int = Field(
        default=1,
        description="Optimizer updates per step on the same runs (TRL's name; GRPO's mu). An abort in any pass "
        "leaves the weights as before the step.",
    )
    max_length: int = Field(
        default=4096, description="Tokens per trained sequence; longer runs are truncated (counted)."
    )
    lora_r: int = Field(default=8, description="LoRA rank.")
    lora_alpha: int = Field(default=16, description="LoRA alpha (the update is scaled by alpha / r).")
    lora_dropout: float = Field(default=0.0, description="Dropout on the LoRA's input.")
    target_modules: list[str] | str = Field(
        default="all-linear",
        description="Which linear layers get a LoRA: 'all-linear' or module names (peft's option).",
    )
    trainable_nodes: list[str] | None = Field(
        default=None, description="Train only the turns of these graph nodes (None: every node's turns)."
    )
    save_total_limit: int = Field(default=3, description="Checkpoints kept (pinned ones are kept besides).")
    seed: int = Field(default=0, description="Seeds the LoRA's initialisation.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="The trainer's weights; auto: bfloat16 on CUDA, float32 on CPU."
    )
    gradient_checkpointing: bool | None = Field(
        default=None,
        description="Recompute each layer's activations in backward (memory for ~30% more step time). None: on for "
        "models of 256 MiB of weights and more on a GPU, 1 GiB and more on CPU; off for smaller ones, which keep the "
        "shared-prompt forward (one prompt forward per micro-batch, not possible under checkpointing).",
    )
    logits_chunk_size: int | None = Field(
        default=None, description="Tokens per LM-head chunk; None: chunks of <= 2**26 logits (256 MB in float32)."
    )
    constrained_logprobs: Literal["masked", "unmasked"] = Field(
        default="masked",
        description="Turns sampled under a grammar (structured output, forced tool calls): their logprobs are "
        "recomputed under the same mask (masked: the distribution they were sampled from) or the whole vocabulary "
        "(unmasked: the importance ratio then starts at the policy's mass inside the mask, not 1).",
    )

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        problems = []
        if not 0 < self.learning_rate < 1:
            problems.append(
                f"learning_rate={self.learning_rate}: use a small positive value like 1e-5 (LoRA on a "
                "real model) or 1e-2 (the tiny model)"
            )
        if self.num_generations < 2:
            problems.append(f"num_generations={self.num_generations}: GRPO compares runs of one scenario; use >= 2")
        if self.beta < 0:
            problems.append(f"beta={self.beta}: the KL coefficient must be >= 0 (0 disables the reference model)")
        if not 0 < self.epsilon < 1:
            problems.append(f"epsilon={self.epsilon}: the clip range must be in (0, 1), typically 0.2")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            problems.append(
                f"epsilon_high={self.epsilon_high} < epsilon={self.epsilon}: epsilon_high widens the "
                "upper clip (DAPO), it must be >= epsilon"
            )
        if self.loss_type == "gspo" and self.epsilon > 0.01:
            problems.append(
                f"loss_type='gspo' with epsilon={self.epsilon}: sequence-level ratios need a tiny clip "
                "range, e.g. epsilon=3e-4, epsilon_high=4e-4"
            )
        if self.max_grad_norm <= 0:
            problems.append(f"max_grad_norm={self.max_grad_norm}: must be > 0 (e.g. 1.0)")
        if self.num_iterations < 1:
            problems.append(
                f"num_iterations={self.num_iterations}: updates per step on the same runs; use 1 (on-policy) or "
                "a few (2-4) to learn more from each rollout"
            )
        if self.per_device_train_batch_size < 1:
            problems.append("per_device_train_batch_size must be >= 1 (sequences per micro-batch)")
        if self.max_length < 16:
            problems.append(f"max_length={self.max_length}: too short to hold a prompt and an answer")
        if self.lora_r < 1 or self.lora_alpha < 1:
            problems.append(f"lora_r={self.lora_r}, lora_alpha={self.lora_alpha}: both must be >= 1 (e.g. 8 and 16)")
        if not 0 <= self.lora_dropout < 1:
            problems.append(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if self.save_total_limit < 1:
            problems.append("save_total_limit must be >= 1 (checkpoints kept besides pinned ones)")
        if self.logits_chunk_size is not None and self.logits_chunk_size < 1:
            problems.append(f"logits_chunk_size={self.logits_chunk_size}: use >= 1 tokens, or None to size it")
        if problems:
            raise ConfigError("invalid GRPOConfig: " + "; ".join(problems))
        return self
