"""The ``Engine`` protocol that both the transformers+peft engine and the vLLM engine implement.

An engine works on token ids: the app renders chat messages to ``prompt_token_ids`` with the model's chat template
(so prompt ids are exact and identical across engines) and parses tool calls out of the sampled text. The engine
samples, and for every sampled token reports its id and its logprob under the distribution it was actually
sampled from (``log_softmax(logits / temperature)`` after top-p masking; raw ``log_softmax(logits)`` for greedy
``temperature=0``) -- the quantity the GRPO trainer recomputes.

Adapters are addressed by name (``"agent@12"``); a request names at most one adapter, ``None`` for the base model.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from langgraph_art.errors import AdapterError, ContextLengthError, RequestError
from langgraph_art.types import ModelRef

FinishReason = Literal["stop", "length"]
MAX_N = 64
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request. ``max_tokens=None`` means: up to the end of the context window."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False  # end only at max_tokens or a stop string (benchmarks: exact token counts)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise RequestError(f"temperature must be between 0 and 100, got {self.temperature}", "temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        if not (1 <= self.n <= MAX_N):
            raise RequestError(f"n must be between 1 and {MAX_N}, got {self.n}", "n")
        if not (0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise RequestError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.top_logprobs}",
                "top_logprobs",
            )
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty", "stop")


@dataclass
class GenerationRequest:
    """``grammar``: an llguidance Lark grammar the sample must follow (``serve/structured.py`` builds it): each token
    is sampled from the model's distribution masked to what the grammar allows, and its logprob is under that
    masked distribution."""

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None
    request_id: str = ""
    grammar: str | None = None


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of choice ``index``, as it is produced (used for streaming)."""

    index: int
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]


@dataclass
class Sample:
    """One finished choice: every sampled token (including a final EOS) with its logprob.

    ``text`` is the decoded completion without special tokens, cut before a matched stop string; the ids are
    everything sampled (as vLLM reports them), so training sees exactly what the policy produced.
    ``closing_tokens``: the last that many ids were not sampled but appended by the server to complete a structure
    that ``max_tokens`` cut short (``serve/closing.py``; logprob 0.0 each, never trained on).
    """

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: FinishReason
    closing_tokens: int = 0


@dataclass
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    samples: list[Sample]
    adapter: str | None


@dataclass(frozen=True)
class FinishedEvent:
    """The last event of a streamed request: the finished result."""

    result: GenerationResult


StreamEvent = TokenEvent | FinishedEvent


@dataclass(frozen=True)
class ScoreRequest:
    """Score ``token_ids``: the logprob of each of ``token_ids[start:]`` given the tokens before it, under ``adapter``
    (None: the base model), at ``temperature``: ``log_softmax(logits / T)``, the distribution the sampler draws from
    (a teacher's logprobs of a student's sampled tokens, at the student's temperature)."""

    token_ids: list[int]
    start: int = 1
    adapter: str | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.start < len(self.token_ids):
            raise RequestError(
                f"prompt_logprobs_start={self.start}: score from a position in 1..{len(self.token_ids) - 1} (the "
                f"first token has no logprob; {len(self.token_ids)} tokens were sent)",
                "prompt_logprobs_start",
            )
        if not (math.isfinite(self.temperature) and 0.0 < self.temperature <= 100.0):
            raise RequestError(f"temperature must be in (0, 100] to score, got {self.temperature}", "temperature")


@runtime_checkable
class Engine(Protocol):
    """What the app needs from an inference engine."""

    base_model: str
    max_model_len: int

    @property
    def tokenizer(self) -> Any: ...

    async def start(self) -> None:
        """Load weights; after it returns, ``generate`` works."""

    async def close(self) -> None:
        """Stop accepting work, fail pending requests, free memory."""

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """Token events as they are sampled, then one ``FinishedEvent``."""
        ...

    async def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) a peft LoRA adapter folder under ``name``."""

    async def unload_adapter(self, name: str) -> None: ...

    def adapters(self) -> dict[str, str]:
        """Loaded adapters: name -> folder."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters since start (``GET /metrics``, and each training step's record): at least ``prompt_tokens``
        (sent), ``prefill_tokens`` (computed), ``prefix_cache_queries`` and ``prefix_cache_hits`` (tokens); the HF
        engine adds ``prefill_seconds`` and ``decode_seconds``."""
        ...

    def grammars(self) -> Any:
        """``models.grammar.Grammars`` over this engine's tokenizer and vocabulary (built on first use): how the
        server checks a request's grammar and closes a structure ``max_tokens`` cut short."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """An engine that scores given token ids (``POST /v1/completions`` with ``prompt_logprobs``): how a teacher on
    a server gives its logprobs of a student's tokens."""

    async def score(self, request: ScoreRequest) -> list[float]:
        """The logprobs of ``request.token_ids[request.start:]`` (one per token)."""
        ...


def stop_position(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest stop string in ``text``, or -1."""
    positions = [p for p in (text.find(s) for s in stops) if p >= 0]
    return min(positions) if positions else -1


def token_budget(request: GenerationRequest, max_model_len: int) -> int:
    """How many tokens ``request`` may sample: its ``max_tokens``, or up to the end of the context window. Raises
    ``ContextLengthError`` (saying what to shorten) when the prompt leaves no room or ``max_tokens`` does not fit."""
    prompt_len = len(request.prompt_token_ids)
    if prompt_len == 0:
        raise ContextLengthError("the prompt is empty", param="messages")
    room = max_model_len - prompt_len
    if room < 1:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens; this model's context length is {max_model_len}. Shorten the messages."
        )
    wanted = request.params.max_tokens
    if wanted is not None and wanted > room:
        raise ContextLengthError(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the context length "
            f"{max_model_len}; ask for at most {room} tokens",
            param="max_tokens",
        )
    return wanted or room


def read_adapter_config(name: str, folder: Path) -> dict[str, Any]:
    """The checks every engine makes before loading ``folder`` as adapter ``name``; its ``adapter_config.json``."""
    config = folder / "adapter_config.json"
    if not config.is_file():
        raise AdapterError(f"{str(folder)!r} is not a peft adapter folder (no adapter_config.json in it)")
    if "@" in name and ModelRef.parse(name).latest:
        raise AdapterError(f"adapter name {name!r}: the part after '@' must be a step number, like 'agent@12'")
    try:
        data = json.loads(config.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{str(config)!r} is not valid JSON ({exc}); save the adapter again") from exc
    if not isinstance(data, dict):
        raise AdapterError(f"{str(config)!r} holds {type(data).__name__}, not a peft adapter config")
    return data
