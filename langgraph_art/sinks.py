"""Export sinks beside the loop: where each training step's runs, rewards and metrics go besides the store.

A sink has ``submit(step=, record=)`` (non-blocking, once per step) and ``flush(timeout) -> bool`` (at the end of a
training run). Langfuse is the one today (its integration is ``integrations/langfuse``, loaded only when asked
for or configured); W&B comes next behind the same two calls.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from langgraph_art.errors import ConfigError

log = logging.getLogger(__name__)


def langfuse_exporter(setting: Any, store: Any) -> Any:
    """None (off), or the exporter that ``Trainer(langfuse=...)`` asks for."""
    if setting is False:
        return None
    configured = bool(os.environ.get("LANGFUSE_PUBLIC_KEY") and os.environ.get("LANGFUSE_SECRET_KEY"))
    if setting is None and not configured:
        return None  # nothing asked for: the integration need not even be installed
    try:
        from langgraph_art.integrations.langfuse import LangfuseExporter, LangfuseSettings
    except ImportError as exc:
        if setting is None:
            log.warning("LANGFUSE_* is set but the Langfuse integration is not installed (%s): no export", exc)
            return None
        raise ConfigError(f"langfuse={setting!r} needs the Langfuse integration: {exc}") from exc
    if isinstance(setting, LangfuseExporter):
        return setting
    if setting is not None and setting is not True:
        raise ConfigError(f"langfuse= takes True, False, None or a LangfuseExporter, got {setting!r}")
    if setting is True:
        return LangfuseExporter(store)
    if LangfuseSettings.configured() and not LangfuseSettings.sdk_installed():
        log.warning("LANGFUSE_* is set but the langfuse SDK is not: pip install 'langgraph-art[langfuse]'")
        return None
    return LangfuseExporter.from_env(store)


def flush_langfuse(exporter: Any, timeout: float, *, project: str, home: str | Path) -> None:
    """Wait (bounded) for the background export; say what did not arrive and the command that sends it."""
    if not exporter.flush(timeout):
        log.warning("Langfuse export still running after %.0f s; it goes on in the background", timeout)
    if exporter.backlog:
        log.warning(
            "Langfuse: %d item(s) not delivered yet (%s). Everything is in the store; send the rest with: "
            "langgraph-art export langfuse --project %s --home %s",
            exporter.backlog,
            exporter.last.errors[-1] if exporter.last.errors else "unknown error",
            project,
            home,
        )
    else:
        log.info("Langfuse: %s", exporter.total)
