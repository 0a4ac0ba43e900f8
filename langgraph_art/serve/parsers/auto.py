"""``"auto"``: the parsers a chat template implies, read from what it renders (a probe call) and what it says.

A template's rendering of a call shows its family's format: ``<tool_call>`` blocks (hermes), ``[TOOL_CALLS]``
(mistral), ``functools[`` (phi4_mini_json), harmony's ``to=functions.`` (openai), a JSON object with
``"parameters"`` (llama3_json), ``name(...)`` (pythonic). A hermes template gets ``xlam``, which reads hermes blocks
and also the fenced and bare JSON that Qwen2.5-Coder writes in that template; a template that cannot render calls
gets ``xlam`` too (it reads the common ways of writing one). Thinking: a template that writes ``</think>`` gets
``qwen3``, or ``deepseek_r1`` where its generation prompt opens ``<think>`` itself; harmony's gets
``openai_gptoss``; any other, none.
"""

from __future__ import annotations

from typing import Any

from langgraph_art.serve.structured import PROBE_NAME as PROBE
from langgraph_art.serve.structured import render_probe_calls


def detect_tool_call_parser(tokenizer: Any) -> tuple[str, str]:
    """``(parser name, why)`` for the tokenizer's chat template."""
    text = render_probe_calls(tokenizer, 1) or ""  # the probe the forced-call grammar is read from
    at = text.find(PROBE)
    if at < 0:
        return "xlam", "the chat template renders no tool calls; reading the common ways of writing one"
    around = text[max(0, at - 80) : at + 80]
    if "to=functions." in around or "<|channel|>" in around:
        return "openai", "the chat template writes harmony messages (gpt-oss)"
    if "[TOOL_CALLS]" in around:
        return "mistral", "the chat template writes [TOOL_CALLS]"
    if "functools[" in around:
        return "phi4_mini_json", "the chat template writes functools[...]"
    if "<tool_call>" in around:
        return "xlam", (
            "the chat template writes hermes <tool_call> blocks; xlam reads them, and also the fenced or bare JSON "
            "calls of a bound tool that Qwen2.5-Coder writes"
        )
    if '"parameters"' in text[at : at + 80]:
        return "llama3_json", 'the chat template writes {"name": ..., "parameters": ...} (Llama 3)'
    if text[at + len(PROBE) : at + len(PROBE) + 1] == "(":
        return "pythonic", "the chat template writes name(argument=...) calls"
    return "xlam", "the chat template's call format is not one we know; reading the common ways of writing one"


def detect_reasoning_parser(tokenizer: Any) -> tuple[str | None, str]:
    """``(parser name or None, why)`` for the tokenizer's chat template."""
    source = str(getattr(tokenizer, "chat_template", "") or "")
    if "<|channel|>" in source:
        return "openai_gptoss", "the chat template writes harmony channels (gpt-oss)"
    if "</think>" not in source:
        return None, "the chat template writes no thinking"
    try:
        prompt = str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
            )
        )
    except Exception:  # noqa: BLE001 - a template that cannot render a user turn has no generation prompt to read
        prompt = ""
    if prompt.rstrip().endswith("<think>"):
        return "deepseek_r1", "the chat template's generation prompt opens <think>"
    return "qwen3", "the chat template writes <think>...</think>"
