"""Training configuration, validated with messages that say how to fix a bad value (TRL's field names where the
concept matches). Every invalid ``GRPOConfig`` raises ``ConfigError`` (a ``ValueError``), whatever is wrong."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    """Hyper-parameters of the GRPO step and the LoRA it trains.

    Every field is a keyword argument with a default and a ``description`` (the table in
    docs/reference/grpo-config.md is generated from them); TRL's names where the concept matches. The losses that
    ``loss_type`` picks are written out in docs/guides/training.md.

    Made, validated (``model_validate``, ``model_validate_json``) or copied with ``model_copy(update=...)`` (which
    validates the update, unlike pydantic's), an invalid config raises ``ConfigError`` naming each field that is
    wrong and what to use instead: a bad value, a wrong type or an unknown field. As a field of another pydantic
    model (the training routes' requests) it is validated by that model, which raises its own ValidationError.

    Example:
        ```python
        config = art.GRPOConfig(loss_type="dr_grpo", num_iterations=2, trainable_nodes=["agent"])
        trainer = art.Trainer(graph, model, rewards=[found_answer], config=config)
        ```
    """

    model_config = ConfigDict(extra="forbid")

    if not TYPE_CHECKING:  # type checkers keep the typed __init__ pydantic's dataclass_transform gives them

        def __init__(self, /, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as error:
                raise config_error(error, type(self)) from None

        # pydantic's own mark (RootModel's __init__ has it too): validation as another model's field skips this
        # __init__, so a request holding a bad config keeps the field's place in its error (config.learning_rat)
        __init__.__pydantic_base_init__ = True

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as error:
            raise config_error(error, cls) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as error:
            raise config_error(error, cls) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, a config validated as a new one from the fields chosen so far plus the update
        (pydantic's own copy takes an update unchecked: ``lora_r=-1`` or an unknown key would pass)."""
        if not update:
            return super().model_copy(deep=deep)
        chosen = {name: getattr(self, name) for name in self.model_fields_set}
        checked = type(self).model_validate({**chosen, **update})
        return super(GRPOConfig, checked).model_copy(deep=True) if deep else checked

    learning_rate: float = Field(
        default=4e-4,
        description="AdamW's learning rate for the LoRA. 4e-4 was chosen on the demo's task (SmolLM2-135M, LoRA r=8, "
        "8 runs of 1 question a step, temperature 0.7: held-out gains +0.54/+0.51/+0.56 on seeds 0-2, +0.34 at 2e-4; "
        "benchmarks/README.md, issue 35); larger models usually want less (1e-5 to 1e-4), the tiny model 1e-2.",
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
    dtype: Literal["auto", "float32", "bfloat16", "bfloat16-autocast"] = Field(
        default="auto",
        description="The trainer's weights and compute. bfloat16-autocast: float32 weights, LoRA and AdamW state, the "
        "model's body run under bfloat16 autocast. auto: bfloat16 on CUDA; on CPU float32, with bfloat16 autocast for "
        "models of 1 GiB of weights and more where this CPU's bfloat16 matmul measures at least 1.5x its float32 "
        "(AMX, AVX-512 BF16; on AVX2 alone bfloat16 is many times slower), logged at the trainer's start.",
    )
    gradient_checkpointing: bool | None = Field(
        default=None,
        description="Recompute each layer's activations in backward (memory for ~1.5x the update's time with a frozen "
        "base, and no shared-prompt forward). None: on a GPU from 256 MiB of weights; on CPU an RL step goes without "
        "it where its activations (estimated from the model's shape) fit in half the memory available at its start, "
        "splitting a micro-batch that does not fit, and checkpoints only when one sequence alone does not fit "
        "(train/gradient_checkpointing says which); SFT on CPU from 1 GiB of weights.",
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

    importance_sampling_correction: Literal[
        "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = Field(
        default="token_truncate",
        description="Correct the sampler/trainer mismatch (another engine's kernels, runs sampled by an older policy "
        "with max_steps_off_policy): the ratio is to the trainer's own logprobs and each token's loss is weighted by "
        "exp(trainer - sampler) logprob, truncated at importance_sampling_cap (token_truncate, TIS) or zeroed outside "
        "[1/cap, cap] (token_mask), per token or per sequence (sequence_*: the product of its tokens' ratios); none: "
        "the ratio is to the sampler's logprobs and the clip absorbs the mismatch (TRL's vllm_importance_sampling_mode "
        "values). token_truncate by measurement: nothing to correct on the HF engine on-policy, no worse than none or "
        "token_mask one step off-policy (benchmarks/README.md, issue 37).",
    )
    importance_sampling_cap: float = Field(
        default=2.0,
        description="The bound of importance_sampling_correction's weights (> 1); also the mismatch metrics' "
        "threshold (train/mismatch/beyond_cap).",
    )

    teacher_model: str | None = Field(
        default=None,
        description="On-policy distillation: a teacher scores every sampled token and the reverse KL to it is a "
        "per-token advantage (docs/guides/distillation.md). base: the base model (the LoRA off); policy: the policy "
        "itself (self-distillation, useful with a privileged prompt: Trainer(teacher=art.Teacher(prompt=...))); any "
        "other name: a model the service serves with the student's tokenizer ('project/name@step', a loaded "
        "adapter), or the model of that name at teacher_base_url; None: no teacher.",
    )
    teacher_base_url: str | None = Field(
        default=None,
        description="The OpenAI-compatible server (http://host:port/v1) that serves teacher_model and scores token "
        "ids (POST /v1/completions with prompt_logprobs: langgraph-art serve, or vLLM at temperature 1); None: the "
        "service that trains the policy.",
    )
    teacher_kl_coef: float = Field(
        default=1.0,
        description="Weight of the teacher's per-token advantage, (teacher - sampler) logprob, added to the reward's "
        "group advantage (>= 0; 0 with a teacher: its metrics only).",
    )

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        problems = []
        if not 0 < self.learning_rate < 1:
            problems.append(
                f"learning_rate={self.learning_rate}: use a small positive value like 4e-4 (the default: a LoRA "
                "on SmolLM2-135M), 1e-5 to 1e-4 (a larger model) or 1e-2 (the tiny model)"
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
        if not self.importance_sampling_cap > 1:
            problems.append(
                f"importance_sampling_cap={self.importance_sampling_cap}: the importance weights' bound must be > 1 "
                "(e.g. 2.0); to turn the correction off, use importance_sampling_correction='none'"
            )
        if not (self.teacher_kl_coef >= 0 and self.teacher_kl_coef < float("inf")):
            problems.append(
                f"teacher_kl_coef={self.teacher_kl_coef}: the teacher's weight must be a finite value >= 0 (e.g. 1.0)"
            )
        if self.teacher_model is not None and not self.teacher_model.strip():
            problems.append("teacher_model='': name the teacher ('base', 'policy' or a served model), or None")
        if self.teacher_base_url is not None:
            if not self.teacher_is_served:
                problems.append(
                    f"teacher_base_url={self.teacher_base_url!r} with teacher_model={self.teacher_model!r}: name the "
                    "model that server serves (the base model and the policy are the trainer's own)"
                )
            if not self.teacher_base_url.startswith(("http://", "https://")):
                problems.append(f"teacher_base_url={self.teacher_base_url!r}: give the server's http(s)://.../v1 URL")
        if problems:
            raise ConfigError("invalid GRPOConfig: " + "; ".join(problems))
        return self

    @property
    def teacher_is_served(self) -> bool:
        """True when the teacher is a model the trainer does not hold: its logprobs come from a server (the
        service's engine or ``teacher_base_url``), stored on each turn before the step (``Turn.teacher_logprobs``)."""
        return self.teacher_model is not None and self.teacher_model not in ("base", "policy")


def config_error(error: ValidationError, model: type[BaseModel]) -> ConfigError:
    """pydantic's ``error`` about ``model`` as one ConfigError: each wrong field (``trainable_nodes[0]`` for an item)
    with its value, what was wrong and what the field is (its description); an unknown field with the closest known
    name; the model's own check's message (a ConfigError) as it is."""
    fields = model.model_fields
    problems: list[str] = []
    by_place: dict[str, list[Any]] = {}
    for item in error.errors():
        if item["type"] == "value_error" and isinstance(item.get("ctx", {}).get("error"), ConfigError):
            problems.append(str(item["ctx"]["error"]).removeprefix(f"invalid {model.__name__}: "))
        elif not item["loc"]:
            problems.append(f"{item['msg']}, got {item['input']!r:.120}")
        else:  # a union's branches are in the location as type names: left out, their messages joined
            place = str(item["loc"][0]) + "".join(f"[{part}]" for part in item["loc"][1:] if isinstance(part, int))
            by_place.setdefault(place, []).append(item)
    for place, items in by_place.items():
        name = str(items[0]["loc"][0])
        if items[0]["type"] == "extra_forbidden":
            initials = [f for f in fields if name == "".join(word[0] for word in f.split("_"))]  # lr
            close = difflib.get_close_matches(name, list(fields), n=1) or initials
            hint = f"did you mean {close[0]}?" if close else f"the fields are {', '.join(fields)}"
            problems.append(f"{name}: unknown field; {hint}")
            continue
        said = [str(i["msg"]) for i in items]
        said = [said[0], *(m.removeprefix("Input should be ") for m in said[1:])]
        about = (fields[name].description or "").rstrip(".") if name in fields else ""
        problems.append(f"{place}={items[0]['input']!r:.120}: {' or '.join(dict.fromkeys(said))}"
                        + (f" ({about})" if about else ""))  # fmt: skip
    return ConfigError(f"invalid {model.__name__}: " + "; ".join(problems))
