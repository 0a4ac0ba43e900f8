"""Where a training run's records go besides the store and ``metrics.jsonl``: one ``Sink`` per tool.

The loop knows three calls and no tool:

- ``start(info)``: at the start of each ``Trainer.train()``: the run's configuration (model, base model, GRPO
  config, ...);
- ``submit(record)``: once per record, returning at once: a training step's (``"split": "train"``) or an
  evaluation's (``"split": "eval"``), the same dict that was appended to ``metrics.jsonl``;
- ``finish(curve=, timeout=)``: at the end of each ``train()``: the reward curve PNG (or None), then a bounded
  wait for what is still being delivered, saying what did not arrive.

A sink never raises into training: a failing tool is logged and training goes on (``SafeSink`` enforces it for every
sink, the integrations' and the user's ``Trainer(sinks=[...])``).

Integrations plug in through the ``langgraph_art.sinks`` entry point group; core names none of them. An entry point
``name = "package.module:make_sink"`` is called once per ``Trainer`` as ``make_sink(setting, *, store, project,
home)`` and returns a ``Sink`` or None (off). ``setting`` is what the user gave as ``Trainer(name=...)``
(``langfuse=``, ``wandb=``), None when not given: the integration then follows its own environment variables. An
integration that is asked for (a setting other than None/False) but not installed is a ``ConfigError`` naming the
package. Langfuse is ``langgraph-art-langfuse`` (``integrations/langfuse``), W&B ``langgraph-art-wandb``
(``integrations/wandb``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
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


SINK_ENTRY_POINTS = "langgraph_art.sinks"


def installed_sinks() -> dict[str, EntryPoint]:
    """The sink integrations installed in this environment, by name (``langfuse``, ``wandb``, ...)."""
    return {ep.name: ep for ep in entry_points(group=SINK_ENTRY_POINTS)}


def make_sinks(
    *, settings: Mapping[str, Any], extra: Sequence[Any], store: Any, project: str, home: str | Path
) -> list[SafeSink]:
    """The sinks ``Trainer(langfuse=, wandb=, sinks=)`` asks for, each wrapped in ``SafeSink``: every installed
    integration with its setting (``settings[name]``, None when not given), then the user's own."""
    installed = installed_sinks()
    for name, setting in settings.items():
        if setting is not None and setting is not False and name not in installed:
            raise ConfigError(
                f"{name}={setting!r} needs the {name} integration, langgraph-art-{name}: install it beside the "
                f"library (from a checkout: pip install -e integrations/{name})"
            )
    sinks: list[Any] = []
    for name, entry in sorted(installed.items()):
        setting = settings.get(name)
        if setting is False:
            continue
        try:
            factory = entry.load()
        except Exception as exc:  # a broken plugin must not stop training it was not asked for
            if setting is not None:
                raise ConfigError(f"{name}={setting!r}: the {name} integration failed to load: {exc}") from exc
            log.warning("the %s sink integration failed to load (%s: %s); training goes on without it",
                        name, type(exc).__name__, exc)  # fmt: skip
            continue
        sink = factory(setting, store=store, project=project, home=home)
        if sink is not None:
            sinks.append(sink)
    for sink in extra:
        if not isinstance(sink, Sink):
            raise ConfigError(
                f"sinks= takes objects with name, start(info), submit(record) and finish(curve=, timeout=) "
                f"(langgraph_art.Sink); {sink!r} lacks some"
            )
        sinks.append(sink)
    return [SafeSink(sink) for sink in sinks]
