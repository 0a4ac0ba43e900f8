"""The one place that converts LangChain messages (and graph state holding them) to OpenAI dicts / JSON."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages


def to_openai_messages(messages: Sequence[BaseMessage], cache: dict[int, dict[str, Any]] | None = None) -> list[dict]:
    """OpenAI chat dicts for LangChain messages. ``cache`` (keyed by object id, valid while the messages are
    alive) avoids converting the same state messages again for every turn of a long agent loop."""
    if cache is None:
        return [to_openai_message(m) for m in messages]
    out = []
    for message in messages:
        hit = cache.get(id(message))
        if hit is None:
            hit = cache[id(message)] = to_openai_message(message)
        out.append(hit)
    return out


def to_openai_message(message: BaseMessage) -> dict[str, Any]:
    """One message as an OpenAI dict: a direct fast path for the plain-text messages agents exchange (capture
    runs on every LLM call), LangChain's ``convert_to_openai_messages`` for everything else (content blocks,
    images, invalid tool calls). Both give the same dict for the same message (tested)."""
    fast = _plain(message)
    return fast if fast is not None else _clean(convert_to_openai_messages(message))


_ROLES = {"human": "user", "system": "system", "ai": "assistant", "tool": "tool"}


def _plain(message: BaseMessage) -> dict[str, Any] | None:
    content = message.content
    role = _ROLES.get(message.type)
    if role is None or not isinstance(content, str):
        return None
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name:
        out["name"] = message.name
    if role == "assistant":
        if getattr(message, "invalid_tool_calls", None):
            return None
        calls = getattr(message, "tool_calls", None)
        if calls:
            out["tool_calls"] = [
                {
                    "type": "function",
                    "id": call["id"],
                    "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)},
                }
                for call in calls
            ]
    elif role == "tool":
        out["tool_call_id"] = getattr(message, "tool_call_id", None)
    return out


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """Drop empty ``tool_calls`` lists so equal conversations compare equal."""
    if "tool_calls" in message and not message["tool_calls"]:
        message = {k: v for k, v in message.items() if k != "tool_calls"}
    return message


def to_jsonable(value: Any, depth: int = 0, cache: dict[int, dict[str, Any]] | None = None) -> Any:
    """Graph state (messages, pydantic models, dataclasses, ...) as JSON-compatible data, never raising.

    ``cache`` is the message-conversion cache of ``to_openai_messages`` (messages already converted for a turn
    are not converted again)."""
    if depth > 30:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, BaseMessage):
        if cache is None:
            return to_openai_message(value)
        hit = cache.get(id(value))
        if hit is None:
            hit = cache[id(value)] = to_openai_message(value)
        return hit
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, depth + 1, cache) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset) and not isinstance(value, bytes | bytearray):
        return [to_jsonable(v, depth + 1, cache) for v in value]
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
