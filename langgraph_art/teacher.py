"""``Teacher``: on-policy distillation for ``Trainer`` — a teacher scores every token the policy sampled, and the
reverse KL to it is a per-token advantage beside the reward's (``train/distillation.py``; the guide:
docs/guides/distillation.md).

The teacher is a model the trainer holds (``GRPOConfig.teacher_model``): the base model (the LoRA off) or the policy
itself before the step's update; or a model a server serves with the student's tokenizer: a checkpoint of a policy
(``"project/name@step"``), an adapter loaded into the service, or another model on another server (``base_url``),
whose logprobs the service fetches before each step (``backends/teacher_scoring.py``). Each is a better policy than
the student when it is larger, or when it is shown what the student is not: ``prompt(scenario, messages)`` rewrites
the messages the teacher sees for each of a run's calls (the reference answer, the relevant document, a hint from
feedback): self-distillation with privileged information. The rewritten messages are kept on each turn
(``Turn.teacher_messages``) and stored with the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph_art.errors import ConfigError
from langgraph_art.types import TrajectoryGroup

PrivilegedPrompt = Callable[[Mapping[str, Any], list[dict[str, Any]]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Teacher:
    """Args:
    model: ``"base"``: the base model, the LoRA off; ``"policy"``: the policy as it is before each update
        (self-distillation: worth it with a ``prompt`` that shows it more than the student sees); another name: a
        model served with the student's tokenizer, by the service that trains (``"project/name@step"``, a loaded
        adapter) or by ``base_url``'s server.
    prompt: ``prompt(scenario, messages) -> messages``: what the teacher sees in place of each call's messages
        (OpenAI-style dicts, as ``Turn.messages``); None: the call's own prompt.
    kl_coef: The weight of the teacher's per-token advantage, ``(teacher - sampler)`` logprob, beside the
        reward's group advantage (``GRPOConfig.teacher_kl_coef``).
    base_url: The OpenAI-compatible server (``http://host:port/v1``) serving ``model`` and scoring token ids
        (``POST /v1/completions`` with ``prompt_logprobs``: ``langgraph-art serve``, or vLLM at temperature 1).
        Its tokenizer must be the student's: a mismatch is a ConfigError naming both.

    Example:
        ```python
        def with_answer(scenario, messages):  # the teacher is told the answer the student must find
            return [{"role": "system", "content": f"The right answer: {scenario['answer']}"}, *messages]

        trainer = art.Trainer(graph, model, rewards=[right], teacher=art.Teacher(prompt=with_answer))
        ```
    """

    model: str = "base"
    prompt: PrivilegedPrompt | None = None
    kl_coef: float = 1.0
    base_url: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(
                f"Teacher(model={self.model!r}): use 'base' (the base model, the LoRA off), 'policy' (the policy "
                "itself, with a privileged prompt) or the name of a served model ('project/name@step')"
            )
        if self.base_url is not None and self.model in ("base", "policy"):
            raise ConfigError(
                f"Teacher(model={self.model!r}, base_url={self.base_url!r}): name the model that server serves; "
                "'base' and 'policy' are the trainer's own"
            )
        if self.model == "policy" and self.prompt is None:
            raise ConfigError(
                "Teacher(model='policy') without a prompt scores the student's tokens as the sampler did and teaches "
                "nothing: give it prompt=... (what the teacher sees that the student does not), or use model='base'"
            )
        if self.prompt is not None and not callable(self.prompt):
            raise ConfigError(
                f"Teacher(prompt=...) must be a function (scenario, messages) -> messages, got "
                f"{type(self.prompt).__name__}"
            )


def hint_question(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """``messages`` with ``hint`` appended to the last user message (the question): the building block of a privileged
    prompt that tells the teacher what the student must find. ``ConfigError`` when there is no user message."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise ConfigError("hint_question: the call's messages have no user message to append the hint to")
    last = users[-1]
    told = {**messages[last], "content": f"{messages[last].get('content', '')}{hint}"}
    return [*messages[:last], told, *messages[last + 1 :]]


def show_teacher(groups: Sequence[TrajectoryGroup], prompt: PrivilegedPrompt) -> None:
    """Set ``teacher_messages`` on every trainable turn of the groups' runs: ``prompt(group.scenario, messages)``.
    A prompt that returns something other than a list of messages is a ConfigError naming what it returned."""
    for group in groups:
        scenario = group.scenario if isinstance(group.scenario, Mapping) else {}
        for run in group.trajectories:
            for turn in run.trainable_turns():
                messages = prompt(scenario, [dict(m) for m in turn.messages])
                if not isinstance(messages, list) or not all(isinstance(m, Mapping) and "role" in m for m in messages):
                    raise ConfigError(
                        "Teacher(prompt=...) must return a list of messages ({'role': ..., 'content': ...} dicts); "
                        f"it returned {messages!r:.200}"
                    )
                turn.teacher_messages = [dict(m) for m in messages]
