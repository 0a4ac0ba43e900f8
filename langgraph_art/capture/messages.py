"""The one place that converts LangChain messages (and graph state holding them) to OpenAI dicts / JSON."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages


def to_openai_messages(messages: Sequence[BaseMessage], cache: dict[int, dict[str, Any]] | None = None) -> list[dict]:
    """OpenAI chat dicts for LangChain messages. ``cache`` (keyed by object id, valid while the messages are
    alive) avoids converting the same state messages again for every turn of a long agent loop."""
    if cache is None:
        return [_clean(m) for m in convert_to_openai_messages(list(messages))]
    out = []
    for message in messages:
        hit = cache.get(id(message))
        if hit is None:
            hit = cache[id(message)] = _clean(convert_to_openai_messages(message))
        out.append(hit)
    return out


def to_openai_message(message: BaseMessage) -> dict[str, Any]:
    return _clean(convert_to_openai_messages(message))


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """Drop empty ``tool_calls`` lists so equal conversations compare equal."""
    if "tool_calls" in message and not message["tool_calls"]:
        message = {k: v for k, v in message.items() if k != "tool_calls"}
    return message


def to_jsonable(value: Any, depth: int = 0) -> Any:
    """Graph state (messages, pydantic models, dataclasses, ...) as JSON-compatible data, never raising."""
    if depth > 30:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, BaseMessage):
        return to_openai_message(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset) and not isinstance(value, bytes | bytearray):
        return [to_jsonable(v, depth + 1) for v in value]
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, depth + 1)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return to_jsonable(dump(), depth + 1)
        except Exception:  # noqa: BLE001 - fall through to repr: capture must never fail on odd state
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), depth + 1)
    return repr(value)
