"""Pure assembly of ``Turn`` records from what LangChain hands over, and ``TurnRecorder``: ChatART's own log.

``build_turns`` is used by both the callback handler (primary path) and ChatART itself (the fallback for calls
that callbacks never see, such as calls made from a node's own raw thread pool).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.outputs import ChatGeneration, LLMResult

from langgraph_art.capture.messages import to_openai_message
from langgraph_art.types import ModelRef, Turn

log = logging.getLogger(__name__)

_PARAM_KEYS = (
    "model",
    "model_name",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
)
ART_LLM_TYPE = "langgraph-art-chat"


def policy_step(model: str | None) -> int | None:
    """``"agent@12"`` -> 12; a name without a step -> None."""
    return ModelRef.parse(model).step if model else None


def sampling_params(invocation: dict[str, Any]) -> dict[str, Any]:
    return {k: invocation[k] for k in _PARAM_KEYS if invocation.get(k) is not None}


def _logprob_entries(generation: ChatGeneration) -> list[dict[str, Any]]:
    info = generation.generation_info or {}
    logprobs = info.get("logprobs") or generation.message.response_metadata.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return list(content or [])


def _call_id(generation: ChatGeneration, llm_output: dict[str, Any] | None) -> str | None:
    streamed = (generation.generation_info or {}).get("call_id")
    if isinstance(streamed, str):
        return streamed
    for candidate in (
        generation.message.response_metadata.get("id"),
        (llm_output or {}).get("id"),
        generation.message.id,
    ):
        if isinstance(candidate, str) and candidate.startswith("chatcmpl-"):
            return candidate.removeprefix("chatcmpl-")
    return None


def call_id_of(result: LLMResult) -> str | None:
    """The service's call id of a chat-model call (from the response id ``chatcmpl-<call id>``)."""
    for generation in result.generations[0] if result.generations else []:
        if isinstance(generation, ChatGeneration):
            return _call_id(generation, result.llm_output)
    return None


@dataclass(slots=True)
class Choice:
    """What training keeps of one returned choice, taken from the LLMResult when the call ends. Token ids and
    logprobs are arrays (no per-token Python objects), and nothing refers back to the response: a handler that
    held every call's LLMResult (32 logprob dicts per 32-token answer) until its run ended made each garbage
    collection scan more live objects, so the per-event cost grew with the run's length."""

    output: dict[str, Any]
    token_ids: array  # 'q'; empty when the server sent no token ids
    logprobs: array  # 'd', one per token id
    prompt_token_ids: list[int] | None
    finish_reason: str | None
    model: str | None
    call_id: str | None
    grammar: str | None = None  # what the server sampled under (structured output, a forced tool call)
    closing_tokens: int = 0  # the last that many tokens were the server's, completing a structure cut short
    unparsed_tool_calls: int = 0  # call-like text in the reply that the server's tool-call parser could not read


def choices_of(result: LLMResult, invocation: dict[str, Any]) -> list[Choice]:
    """The chat choices of a call's result, compact (see ``Choice``)."""
    out = []
    for generation in result.generations[0] if result.generations else []:
        if not isinstance(generation, ChatGeneration):
            continue
        entries = _logprob_entries(generation)
        ids = [e.get("token_id") for e in entries]
        has_ids = bool(ids) and all(isinstance(i, int) for i in ids)
        info = generation.generation_info or {}
        meta = generation.message.response_metadata
        model = meta.get("model_name") or (result.llm_output or {}).get("model_name") or invocation.get("model")
        prompt_ids = info.get("prompt_token_ids")
        out.append(
            Choice(
                output=to_openai_message(generation.message),
                token_ids=array("q", ids if has_ids else ()),
                logprobs=array("d", (float(e["logprob"]) for e in entries) if has_ids else ()),
                prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
                finish_reason=info.get("finish_reason") or meta.get("finish_reason"),
                model=model,
                call_id=_call_id(generation, result.llm_output),
                grammar=info.get("grammar") if isinstance(info.get("grammar"), str) else None,
                closing_tokens=int(info.get("closing_tokens") or 0),
                unparsed_tool_calls=int(info.get("unparsed_tool_calls") or 0),
            )
        )
    return out


def build_turns(
    *,
    messages: list[dict[str, Any]],
    invocation: dict[str, Any],
    choices: list[Choice],
    metadata: dict[str, Any],
    start_time: float,
    end_time: float,
    trainable: bool,
    run_id: str | None,
) -> list[Turn]:
    """One ``Turn`` per returned choice of one chat-model call."""
    turns = []
    for index, choice in enumerate(choices):
        has_ids = bool(choice.token_ids)
        turns.append(
            Turn.model_construct(  # values built here from trusted parts; validation would copy every message
                id=f"{run_id}:{index}" if run_id else uuid.uuid4().hex,
                run_id=run_id,
                messages=messages,
                tools=invocation.get("tools"),
                params=sampling_params(invocation),
                output=choice.output,
                prompt_token_ids=choice.prompt_token_ids,
                token_ids=choice.token_ids.tolist(),
                logprobs=choice.logprobs.tolist(),
                finish_reason=choice.finish_reason,
                grammar=choice.grammar,
                closing_tokens=choice.closing_tokens,
                unparsed_tool_calls=choice.unparsed_tool_calls,
                model=choice.model,
                policy_step=policy_step(choice.model),
                call_id=choice.call_id,
                choice_index=index,
                node=metadata.get("langgraph_node"),
                step=metadata.get("langgraph_step"),
                namespace=metadata.get("langgraph_checkpoint_ns"),
                start_time=start_time,
                latency_s=end_time - start_time,
                trainable=trainable and has_ids,
                source="chat_art" if trainable else "other",
                attribution="callback",
                error=None,
            )
        )
    return turns


class TurnRecorder:
    """ChatART's own, bounded log of the calls it made, keyed by the service's call id.

    (The call id, not LangChain's run id: in the streaming path LangChain does not hand the run manager to the
    model, so the call id in the response is the one key both sides always see.)

    Entries are cheap until needed: the turns are built only when adopted. A ``TrajectoryCallbackHandler`` given
    this recorder claims (removes) the calls it also saw through callbacks; when a run's trajectory is assembled
    it adopts the unclaimed calls that belong to that run (by run metadata, else by time when no other run
    overlapped). Nothing is dropped silently: calls evicted unclaimed (beyond ``capacity``) are logged and counted.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, _Recorded] = OrderedDict()
        self.evicted_unclaimed = 0

    def record(
        self, run_id: str | None, metadata: dict[str, Any], start: float, build: Callable[[], list[Turn]]
    ) -> None:
        key = run_id or uuid.uuid4().hex
        with self._lock:
            self._calls[key] = _Recorded(metadata.get("langgraph_art_run"), start, build)
            while len(self._calls) > self.capacity:  # everything still here is unclaimed
                self._calls.popitem(last=False)
                self.evicted_unclaimed += 1
                if math.log10(self.evicted_unclaimed).is_integer():  # 1, 10, 100...: said, not spammed
                    log.warning(
                        "TurnRecorder full (capacity %d): %d unclaimed call(s) dropped so far; give "
                        "llm.recorder to a TrajectoryCallbackHandler to keep them",
                        self.capacity,
                        self.evicted_unclaimed,
                    )

    def claim(self, call_id: str) -> None:
        """A handler saw this call through callbacks: forget it (the handler has it)."""
        with self._lock:
            self._calls.pop(call_id, None)

    def take_unclaimed(self, run_key: str | None, start: float, end: float) -> list[tuple[Turn, bool]]:
        """Unclaimed calls of one root run, built: ``(turn, matched_by_metadata)``.

        A call matches by metadata when its ``langgraph_art_run`` equals ``run_key``; a call without that key
        matches when it started inside ``[start, end]`` (pass an empty window when other runs overlapped).
        """
        chosen: list[tuple[_Recorded, bool]] = []
        with self._lock:
            for key, entry in list(self._calls.items()):
                by_metadata = entry.owner is not None and entry.owner == run_key
                by_time = entry.owner is None and start <= entry.start <= end
                if by_metadata or by_time:
                    del self._calls[key]
                    chosen.append((entry, by_metadata))
        return [(turn, by_metadata) for entry, by_metadata in chosen for turn in entry.build()]

    def unclaimed(self) -> list[Turn]:
        """Calls no handler has claimed or adopted (yet)."""
        with self._lock:
            entries = list(self._calls.values())
        return [turn for entry in entries for turn in entry.build()]


@dataclass
class _Recorded:
    owner: str | None
    start: float
    build: Callable[[], list[Turn]]


def now() -> float:
    return time.time()
