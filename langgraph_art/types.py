"""What a run of a graph leaves behind: ``Turn`` (one LLM call), ``ToolCallRecord``, ``NodeSpan`` (one node
invocation), ``Trajectory`` (one root run, a tree of spans) and ``TrajectoryGroup`` (runs of one scenario); and
``ModelRef``, the one place that reads and writes ``name@step``.

Plain pydantic models: JSON round-trip with ``model_dump_json()`` / ``model_validate_json()``. Messages are OpenAI
chat dicts (``{"role": ..., "content": ..., "tool_calls": [...]}``), so they render with any chat template.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr


@dataclass(frozen=True)
class ModelRef:
    """What a served model answers to: ``name`` (its latest checkpoint, or the base model before the first one) or
    ``name@step`` (checkpoint ``step``). ``str(ref)`` prints it; ``ModelRef.parse(text)`` reads it: a text whose part
    after the last ``@`` is not a step number is a plain name (``"org/model@main"`` has no step)."""

    name: str
    step: int | None = None

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        name, at, step = text.rpartition("@")
        if at and name and step.isdigit():
            return cls(name, int(step))
        return cls(text)

    @property
    def latest(self) -> bool:
        """True for a plain name: it follows the newest checkpoint."""
        return self.step is None

    def at(self, step: int | None) -> ModelRef:
        """The same model at checkpoint ``step`` (None: the latest)."""
        return ModelRef(self.name, step)

    def __str__(self) -> str:
        return self.name if self.step is None else f"{self.name}@{self.step}"


@dataclass
class StepResult:
    """What one training step did: the checkpoint ``step`` after it, whether the weights changed, its metrics,
    how many sequences were skipped and why (``reason`` when nothing was trained), and the advantage each run got
    (by trajectory id: computed once, by the trainer, with the config it trained with)."""

    step: int
    updated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    reason: str | None = None
    advantages: dict[str, float] = field(default_factory=dict)


SpanStatus = Literal["running", "ok", "error", "interrupted"]
TrajectoryStatus = Literal["running", "ok", "failed", "interrupted"]


class Turn(BaseModel):
    """One LLM call: what was asked, what was sampled (exact token ids and logprobs), where in the graph.

    ``grammar``: the llguidance grammar the server sampled under (structured output, a forced tool call), None for
    free text; the trainer recomputes the logprobs under the same mask. ``closing_tokens``: the last that many
    ``token_ids`` were chosen by the server to complete a structure ``max_tokens`` cut short (never trained on).
    ``unparsed_tool_calls``: places in the reply that looked like a tool call but that the server's tool-call parser
    could not read (they stayed in the content; a reward can penalise them).
    ``teacher_messages``: what a teacher sees in place of ``messages`` when it scores this turn's tokens (a
    privileged prompt, ``Teacher(prompt=...)``); None: the turn's own prompt. ``teacher_logprobs``: a served
    teacher's logprob of each of ``token_ids`` (``GRPOConfig.teacher_is_served``), written by the service before the
    step that trains on the turn.
    """

    id: str
    run_id: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    output: dict[str, Any] = Field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    grammar: str | None = None
    closing_tokens: int = 0
    unparsed_tool_calls: int = 0
    model: str | None = None
    policy_step: int | None = None
    call_id: str | None = None
    choice_index: int = 0
    node: str | None = None
    step: int | None = None
    namespace: str | None = None
    start_time: float = 0.0
    latency_s: float | None = None
    trainable: bool = True
    source: Literal["chat_art", "other"] = "chat_art"
    attribution: Literal["callback", "metadata", "time"] = "callback"
    error: str | None = None
    teacher_messages: list[dict[str, Any]] | None = None
    teacher_logprobs: list[float] | None = None

    @property
    def has_tokens(self) -> bool:
        """True when the turn carries sampled ids with one logprob each (what training needs)."""
        return bool(self.token_ids) and len(self.token_ids) == len(self.logprobs)

    def conversation(self) -> list[dict[str, Any]]:
        """The request messages followed by the sampled assistant message."""
        return [*self.messages, self.output] if self.output else list(self.messages)


class ToolCallRecord(BaseModel):
    id: str | None = None
    run_id: str | None = None
    name: str
    arguments: Any = None
    result: Any = None
    error: str | None = None
    start_time: float = 0.0
    end_time: float | None = None


class NodeSpan(BaseModel):
    """One invocation of a LangGraph node (``Send`` fan-out and parallel branches give one span each)."""

    id: str
    name: str
    step: int | None = None
    namespace: str = ""
    parent_id: str | None = None
    start_time: float = 0.0
    end_time: float | None = None
    status: SpanStatus = "running"
    error: str | None = None
    turns: list[Turn] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """Everything one root run did. ``spans`` is the node tree, flattened in start order (``parent_id`` links)."""

    id: str
    name: str | None = None
    spans: list[NodeSpan] = Field(default_factory=list)
    root_turns: list[Turn] = Field(default_factory=list)
    root_tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    input: Any = None
    output: Any = None
    status: TrajectoryStatus = "running"
    error: str | None = None
    start_time: float = 0.0
    end_time: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    explanations: dict[str, str] = Field(default_factory=dict)
    _final_state: Any = PrivateAttr(default=None)

    @property
    def final_state(self) -> Any:
        """The graph's output as Python objects (messages stay messages), for reward functions; not serialized."""
        return self._final_state

    @final_state.setter
    def final_state(self, value: Any) -> None:
        self._final_state = value

    @property
    def scenario_id(self) -> str | None:
        return self.metadata.get("scenario_id")

    @property
    def group_id(self) -> str | None:
        return self.metadata.get("group_id")

    def span(self, span_id: str) -> NodeSpan | None:
        return next((s for s in self.spans if s.id == span_id), None)

    def children(self, span_id: str | None) -> list[NodeSpan]:
        """Spans whose parent is ``span_id`` (``None``: the top-level nodes)."""
        return [s for s in self.spans if s.parent_id == span_id]

    def sampled_tokens(self) -> int:
        """Tokens this run's model calls sampled (what it cost, whether or not it is trained on)."""
        return sum(len(turn.token_ids) for turn in self.turns())

    def unparsed_tool_calls(self) -> int:
        """Places in this run's replies that looked like a tool call but were not read as one (``Turn``)."""
        return sum(turn.unparsed_tool_calls for turn in self.turns())

    def turns(self, nodes: Iterable[str] | None = None) -> list[Turn]:
        """Every turn in call order; only those made in the named nodes when ``nodes`` is given."""
        wanted = set(nodes) if nodes is not None else None
        found = [t for t in self.root_turns if wanted is None]
        for span in self.spans:
            if wanted is None or span.name in wanted:
                found.extend(span.turns)
        return sorted(found, key=lambda t: t.start_time)

    def trainable_turns(self, nodes: Iterable[str] | None = None) -> list[Turn]:
        """Turns sampled by ChatART with token ids and logprobs, optionally only from the named nodes."""
        return [t for t in self.turns(nodes) if t.trainable and t.has_tokens and t.error is None]

    def tool_calls(self) -> list[ToolCallRecord]:
        calls = list(self.root_tool_calls)
        for span in self.spans:
            calls.extend(span.tool_calls)
        return sorted(calls, key=lambda c: c.start_time)

    def conversations(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """One message list per agent: ``(node name, messages)``.

        Turns of the same node that continue one conversation (each call's messages start with the previous
        call's messages and answer) are merged into one list; a call that starts over begins a new one.
        """
        chains: list[tuple[str, list[dict[str, Any]]]] = []
        for turn in self.turns():
            node = turn.node or "__root__"
            for index in range(len(chains) - 1, -1, -1):
                name, messages = chains[index]
                if name == node and turn.messages[: len(messages)] == messages:
                    chains[index] = (name, turn.conversation())
                    break
            else:
                chains.append((node, turn.conversation()))
        return chains


class TrajectoryGroup(BaseModel):
    """The ``num_generations`` runs of one scenario, compared with each other by GRPO."""

    id: str
    scenario_id: str | None = None
    scenario: Any = None
    trajectories: list[Trajectory] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def completed(self) -> list[Trajectory]:
        """Runs that finished (``ok`` or ``interrupted``): failed runs are kept but not trained on."""
        return [t for t in self.trajectories if t.status in ("ok", "interrupted")]

    @property
    def failed(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.status == "failed"]
