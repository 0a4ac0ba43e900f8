"""The inference service: an OpenAI-compatible FastAPI app over an ``Engine`` (transformers+peft or vLLM).

Public here: ``HFEngine`` and ``VLLMEngine`` (the engines), ``build_engine`` (one by name, options checked),
``create_app`` (the app over an engine), ``EmbeddedServer`` / ``start_embedded_server`` (the app on a background
thread of this process: what ``LocalBackend`` runs). Heavy modules (torch, fastapi, vllm) load only when one of them
is used.

Layout: ``engines/`` (``base`` the protocol every engine meets, ``hf/`` and ``vllm/`` the engines and their private
parts, ``choose`` the name -> engine table), the app (``app``, ``http_errors``) and its ``routes/`` (completions,
catalog, training), the wire format (``protocol``, ``schemas``), grammars from ``response_format``/tools
(``structured``, ``closing``), prompts around any engine (``chat``), how a reply is read per model family
(``parsers/``: tool-call and reasoning parsers under vLLM's names), checkpoints into an engine
(``publish``), and how this process reaches the app without sockets (``embedded``, ``inprocess``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "HFEngine": "langgraph_art.serve.engines.hf.engine",
    "VLLMEngine": "langgraph_art.serve.engines.vllm.engine",
    "build_engine": "langgraph_art.serve.engines.choose",
    "create_app": "langgraph_art.serve.app",
    "EmbeddedServer": "langgraph_art.serve.embedded",
    "start_embedded_server": "langgraph_art.serve.embedded",
}

if TYPE_CHECKING:
    from langgraph_art.serve.app import create_app
    from langgraph_art.serve.embedded import EmbeddedServer, start_embedded_server
    from langgraph_art.serve.engines.choose import build_engine
    from langgraph_art.serve.engines.hf.engine import HFEngine
    from langgraph_art.serve.engines.vllm.engine import VLLMEngine


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_art.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["EmbeddedServer", "HFEngine", "VLLMEngine", "build_engine", "create_app", "start_embedded_server"]
