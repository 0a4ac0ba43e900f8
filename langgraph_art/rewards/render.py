"""Render a group of runs as judge input: shared context once, tools once, then each run node by node."""

from __future__ import annotations

import json
from typing import Any

from langgraph_art.types import Trajectory


def shared_prefix(conversations: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The messages every conversation starts with (usually the system prompt and the user's request)."""
    if not conversations:
        return []
    prefix: list[dict[str, Any]] = []
    for messages in zip(*conversations, strict=False):
        if all(m == messages[0] for m in messages):
            prefix.append(messages[0])
        else:
            break
    return prefix


def render_message(message: dict[str, Any]) -> str:
    role = message.get("role", "?")
    content = message.get("content")
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False, default=str) if content else ""
    lines = [f"{role}: {content}".rstrip()]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        lines.append(f"  -> calls {function.get('name')}({function.get('arguments')})")
    return "\n".join(lines)


def render_group(runs: list[Trajectory], ids: list[str]) -> str:
    """``runs[i]`` is shown under ``ids[i]``; runs with several agents are shown one conversation per node."""
    per_run = [run.conversations() for run in runs]
    firsts = [conversations[0][1] for conversations in per_run if conversations]
    prefix = shared_prefix(firsts) if len(firsts) == len(runs) else []
    tools: dict[str, dict[str, Any]] = {}
    for run in runs:
        for turn in run.turns():
            for tool in turn.tools or []:
                function = tool.get("function", tool)
                tools.setdefault(str(function.get("name")), function)
    parts: list[str] = []
    if prefix:
        parts.append("Every run starts with this conversation:\n" + "\n".join(render_message(m) for m in prefix))
    if tools:
        listed = "\n".join(f"- {name}: {fn.get('description') or ''}".rstrip() for name, fn in tools.items())
        parts.append(f"Tools the agent could call:\n{listed}")
    for short, run, conversations in zip(ids, runs, per_run, strict=True):
        body: list[str] = []
        for index, (node, messages) in enumerate(conversations):
            shown = messages[len(prefix) :] if index == 0 else messages
            body.append(f"[node {node}]\n" + "\n".join(render_message(m) for m in shown))
        if not conversations:
            body.append(
                f"(no model calls; final output: {json.dumps(run.output, ensure_ascii=False, default=str)[:2000]})"
            )
        parts.append(f'<run id="{short}">\n' + "\n".join(body) + "\n</run>")
    return "\n\n".join(parts)


def render_transcript(run: Trajectory) -> str:
    """A run as a person reads it: each node's conversation (system prompts left out), tool calls inline."""
    lines = []
    for node, messages in run.conversations():
        lines.append(f"[{node}]")
        lines += ["  " + line for m in messages if m.get("role") != "system" for line in render_message(m).splitlines()]
    return "\n".join(lines)
