"""Chat templates: the ``chat_template`` override (vLLM's option name: a file, a template string, or a bundled
template by name) and the one check that matters for agents, whether a template writes the tools into the prompt.

A model's own template may know nothing of tools (SmolLM2's). Then a request's tools never reach the model: it
answers in prose, and a forced call cannot follow a format the model was never shown. The service refuses such a
request (``tools_dropped``) instead of ignoring the tools; the fix is a template that renders them, such as the
bundled ``"chatml-tools"`` (ChatML with Hermes-style ``<tool_call>`` blocks, as Qwen2.5 writes them).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from langgraph_art.errors import ConfigError

BUNDLED = {"chatml-tools": "chatml_tools.jinja"}
_PROBE_TOOL = "__langgraph_art_tool_probe__"


def bundled_template(name: str, *, default_system: str | None = None) -> str:
    """A template shipped with the package; ``default_system``: the system prompt used when a conversation has none
    (the model's own default, e.g. SmolLM2's)."""
    if name not in BUNDLED:
        raise ConfigError(f"no bundled chat template {name!r}; bundled: {sorted(BUNDLED)}")
    text = resources.files("langgraph_art.models").joinpath(BUNDLED[name]).read_text()
    if default_system:
        import json

        text = "{%- set default_system = " + json.dumps(default_system) + " %}\n" + text
    return text


def read_chat_template(value: str | os.PathLike[str]) -> str:
    """The template text ``value`` means: a bundled name (``"chatml-tools"``), a path to a ``.jinja`` file, or the
    template itself (anything with ``{{`` or ``{%``), as vLLM's ``--chat-template`` reads it."""
    text = str(value)
    if text in BUNDLED:
        return bundled_template(text)
    if "{{" in text or "{%" in text:
        return text
    path = Path(text).expanduser()
    if path.is_file():
        return path.read_text()
    raise ConfigError(
        f"chat_template={text!r} is neither a file, a Jinja template string, nor a bundled template "
        f"({sorted(BUNDLED)}): pass the path of a .jinja file, the template text, or 'chatml-tools'"
    )


def apply_chat_template(tokenizer: Any, chat_template: str | os.PathLike[str] | None) -> Any:
    """``tokenizer`` with ``chat_template`` (see ``read_chat_template``) as its template; unchanged for None."""
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


def renders_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template writes a request's tools into the prompt (a probe tool's name
    appears in the rendered text)."""
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[tool], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return False
    return _PROBE_TOOL in str(text)
