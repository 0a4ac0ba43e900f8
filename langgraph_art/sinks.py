"""Where a training run's records go besides the store and ``metrics.jsonl``: one ``Sink`` per tool.

The loop knows three calls and no tool:

- ``start(info)``: at the start of each ``Trainer.train()``: the run's configuration (model, base model, GRPO
  config, ...);
- ``submit(record)``: once per record, returning at once: a training step's (``"split": "train"``) or an
  evaluation's (``"split": "eval"``), the same dict that was appended to ``metrics.jsonl``;
- ``finish(curve=, timeout=)``: at the end of each ``train()``: the reward curve PNG (or None), then a bounded
  wait for what is still being delivered, saying what did not arrive.

A sink never raises into training: a failing tool is logged and training goes on (``SafeSink`` enforces it for every
sink, ours and the user's ``Trainer(sinks=[...])``). Langfuse (``integrations/langfuse``) and W&B
(``integrations/wandb.py``) load only when asked for or configured.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from langgraph_art.errors import ConfigError

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """What ``Trainer`` hands a run's records to (see the module docstring)."""

    name: str

    def start(self, info: Mapping[str, Any]) -> None: ...

    def submit(self, record: Mapping[str, Any]) -> None: ...

    def finish(self, *, curve: Path | None, timeout: float) -> None: ...


class SafeSink:
    """A sink whose errors are logged, not raised; after one failure it is off for the rest of the process (a tool
    that failed once would fail every step, and each attempt could take its timeout)."""

    def __init__(self, sink: Sink) -> None:
        self.sink, self.name, self.failed = sink, str(getattr(sink, "name", type(sink).__name__)), False

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self.failed:
            return
        try:
            getattr(self.sink, method)(*args, **kwargs)
        except Exception as exc:  # a logging tool must never stop training: logged, then the sink is off
            self.failed = True
            log.warning("%s failed in %s (%s: %s); training goes on without it", self.name, method,
                        type(exc).__name__, exc, exc_info=True)  # fmt: skip

    def start(self, info: Mapping[str, Any]) -> None:
        self._call("start", info)

    def submit(self, record: Mapping[str, Any]) -> None:
        self._call("submit", record)

    def finish(self, *, curve: Path | None, timeout: float) -> None:
        self._call("finish", curve=curve, timeout=timeout)


def make_sinks(
    *, langfuse: Any, wandb: Any, extra: Sequence[Any], store: Any, project: str, home: str | Path
) -> list[SafeSink]:
    """The sinks ``Trainer(langfuse=, wandb=, sinks=)`` asks for, each wrapped in ``SafeSink``."""
    sinks: list[Any] = []
    exporter = langfuse_exporter(langfuse, store)
    if exporter is not None:
        sinks.append(LangfuseSink(exporter, project=project, home=home))
    wandb_sink = make_wandb_sink(wandb, project=project)
    if wandb_sink is not None:
        sinks.append(wandb_sink)
    for sink in extra:
        if not isinstance(sink, Sink):
            raise ConfigError(
                f"sinks= takes objects with name, start(info), submit(record) and finish(curve=, timeout=) "
                f"(langgraph_art.Sink); {sink!r} lacks some"
            )
        sinks.append(sink)
    return [SafeSink(sink) for sink in sinks]


# -- Langfuse ----------------------------------------------------------------------------------------------------
class LangfuseSink:
    """The Langfuse exporter as a sink: each record sends, in the background, the runs of its policy step (and
    anything earlier that did not arrive) and the record itself."""

    name = "Langfuse"

    def __init__(self, exporter: Any, *, project: str, home: str | Path) -> None:
        self.exporter, self.project, self.home = exporter, project, home

    def start(self, info: Mapping[str, Any]) -> None:
        pass  # Langfuse has no run configuration: each trace carries its own metadata

    def submit(self, record: Mapping[str, Any]) -> None:
        step = record.get("policy_step", record.get("step"))
        self.exporter.submit(step=None if step is None else int(step), record=record)

    def finish(self, *, curve: Path | None, timeout: float) -> None:
        flush_langfuse(self.exporter, timeout, project=self.project, home=self.home)


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


# -- Weights & Biases ----------------------------------------------------------------------------------------------
WANDB_VARIABLES = ("WANDB_API_KEY", "WANDB_PROJECT")


def make_wandb_sink(setting: Any, *, project: str) -> Any:
    """None (off), or the W&B sink that ``Trainer(wandb=...)`` asks for: None follows the environment (on when
    ``WANDB_API_KEY`` or ``WANDB_PROJECT`` is set, or ``WANDB_MODE`` is ``offline``/``online``; off when
    ``WANDB_MODE=disabled``), True requires it, False never, a dict is passed to ``wandb.init`` (``project``,
    ``entity``, ``name``, ``tags``, ...)."""
    if setting is False:
        return None
    mode = os.environ.get("WANDB_MODE", "").lower()
    configured = mode in ("offline", "online") or any(os.environ.get(v) for v in WANDB_VARIABLES)
    if setting is None and (not configured or mode == "disabled"):
        return None
    if setting is not None and setting is not True and not isinstance(setting, Mapping):
        raise ConfigError(f"wandb= takes True, False, None or a dict of wandb.init arguments, got {setting!r}")
    try:
        from langgraph_art.integrations.wandb import WandbSink
    except ImportError as exc:
        if setting is None:
            log.warning("WANDB_* is set but wandb is not installed (%s): pip install 'langgraph-art[wandb]'", exc)
            return None
        raise ConfigError(f"wandb={setting!r} needs wandb: pip install 'langgraph-art[wandb]' ({exc})") from exc
    return WandbSink(project=project, init=dict(setting) if isinstance(setting, Mapping) else {})
