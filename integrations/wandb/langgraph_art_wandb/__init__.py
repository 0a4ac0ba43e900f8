"""Weights & Biases for langgraph-art's ``Trainer``, as its own distribution (``langgraph-art-wandb``). Core finds
it through the ``langgraph_art.sinks`` entry point ``wandb``; nothing here is imported until a ``Trainer`` is made,
and ``wandb`` itself only when the sink is on.

``make_sink(setting, ...)``: ``Trainer(wandb=setting)``. None follows the environment (on when ``WANDB_API_KEY`` or
``WANDB_PROJECT`` is set, or ``WANDB_MODE`` is ``offline``/``online``; off when ``WANDB_MODE=disabled``), True
requires it, False never (core does not call), a dict is passed to ``wandb.init`` (``project``, ``entity``, ``name``,
``tags``, ...). The W&B step is the training iteration (1, 2, ... in this Trainer; 0 is the evaluation before the
first step), so train and eval curves share the x axis.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph_art import ConfigError

if TYPE_CHECKING:
    from langgraph_art_wandb.sink import WandbSink

WANDB_VARIABLES = ("WANDB_API_KEY", "WANDB_PROJECT")


def make_sink(setting: Any, *, store: Any, project: str, home: str | Path) -> WandbSink | None:
    """The W&B sink ``Trainer(wandb=setting)`` asks for, or None (see the module docstring)."""
    if setting is False:
        return None
    if setting is not None and setting is not True and not isinstance(setting, Mapping):
        raise ConfigError(f"wandb= takes True, False, None or a dict of wandb.init arguments, got {setting!r}")
    mode = os.environ.get("WANDB_MODE", "").lower()
    configured = mode in ("offline", "online") or any(os.environ.get(v) for v in WANDB_VARIABLES)
    if setting is None and (not configured or mode == "disabled"):
        return None
    from langgraph_art_wandb.sink import WandbSink

    return WandbSink(project=project, init=dict(setting) if isinstance(setting, Mapping) else {})


__all__ = ["make_sink"]
