"""The Langfuse sink of ``Trainer``, found by core through the ``langgraph_art.sinks`` entry point (``langfuse``).

``Trainer(langfuse=...)`` hands its setting to ``make_sink``: None exports when ``LANGFUSE_PUBLIC_KEY`` and
``LANGFUSE_SECRET_KEY`` are set, True requires them, False never (core does not call), or your own
``LangfuseExporter``. Each record the trainer submits sends, in the background, the runs of its policy step (and
anything earlier that did not arrive) and the record itself; ``finish`` waits (bounded) and says what is left and
the command that sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langgraph_art import ConfigError, TrajectoryStore
from langgraph_art_langfuse.connection import LangfuseSettings
from langgraph_art_langfuse.exporter import LangfuseExporter

log = logging.getLogger(__name__)


def make_sink(setting: Any, *, store: TrajectoryStore, project: str, home: str | Path) -> LangfuseSink | None:
    """The sink ``Trainer(langfuse=setting)`` asks for, or None (off)."""
    if setting is False:
        return None
    if setting is not None and setting is not True and not isinstance(setting, LangfuseExporter):
        raise ConfigError(f"langfuse= takes True, False, None or a LangfuseExporter, got {setting!r}")
    if isinstance(setting, LangfuseExporter):
        exporter: LangfuseExporter | None = setting
    elif setting is True:
        exporter = LangfuseExporter(store)  # raises ConfigError naming the missing variable
    elif not LangfuseSettings.configured():
        return None  # nothing asked for
    elif not LangfuseSettings.sdk_installed():
        log.warning("LANGFUSE_* is set but the langfuse SDK is not installed: pip install 'langfuse>=5,<6'")
        return None
    else:
        exporter = LangfuseExporter.from_env(store)
    return None if exporter is None else LangfuseSink(exporter, project=project, home=home)


class LangfuseSink:
    """The Langfuse exporter as a ``langgraph_art.Sink`` (see the module docstring)."""

    name = "Langfuse"

    def __init__(self, exporter: LangfuseExporter, *, project: str, home: str | Path) -> None:
        self.exporter, self.project, self.home = exporter, project, home

    def start(self, info: Mapping[str, Any]) -> None:
        pass  # Langfuse has no run configuration: each trace carries its own metadata

    def submit(self, record: Mapping[str, Any]) -> None:
        step = record.get("policy_step", record.get("step"))
        self.exporter.submit(step=None if step is None else int(step), record=record)

    def finish(self, *, curve: Path | None, timeout: float) -> None:
        """Wait (bounded) for the background export; say what did not arrive and the command that sends it."""
        if not self.exporter.flush(timeout):
            log.warning("Langfuse export still running after %.0f s; it goes on in the background", timeout)
        if self.exporter.backlog:
            errors = self.exporter.last.errors
            log.warning(
                "Langfuse: %d item(s) not delivered yet (%s). Everything is in the store; send the rest with: "
                "langgraph-art export langfuse --project %s --home %s",
                self.exporter.backlog,
                errors[-1] if errors else "unknown error",
                self.project,
                self.home,
            )
        else:
            log.info("Langfuse: %s", self.exporter.total)
