"""``WandbSink``: the run's configuration, every training step's and evaluation's metrics, and the reward curve, as
one W&B run per ``Trainer`` (made by ``langgraph_art_wandb.make_sink``, which says when it is on). Each ``train()``
call ends the W&B run (its files complete, the curve uploaded) and the next one resumes it under the same id. W&B
failures are logged, never raised into training (core's ``SafeSink``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import wandb

log = logging.getLogger(__name__)
_RESUME_WAIT_S = 120.0
_NOT_METRICS = {"run", "iteration", "model", "split", "started", "finished", "step"}


class WandbSink:
    """One W&B run for one ``Trainer`` (see the module docstring)."""

    name = "W&B"

    def __init__(self, *, project: str, init: Mapping[str, Any] | None = None) -> None:
        self.project, self.init = project, dict(init or {})
        self.run: Any = None
        self.run_id: str | None = None
        self._lock = threading.Lock()  # submit comes from the loop's worker threads
        self._finishing: threading.Thread | None = None  # the last train()'s run.finish, if it outlived its wait

    def start(self, info: Mapping[str, Any]) -> None:
        if self._finishing is not None:  # resuming a run whose finish is still writing would interleave the two
            self._finishing.join(_RESUME_WAIT_S)
            if self._finishing.is_alive():
                log.warning("W&B: the last run still finishing after %.0f s; resuming it anyway", _RESUME_WAIT_S)
            self._finishing = None
        with self._lock:
            if self.run is not None:
                return
            kwargs: dict[str, Any] = {
                "project": os.environ.get("WANDB_PROJECT") or self.project,
                "name": info.get("model"),
                "config": dict(info),
                "reinit": "create_new",  # never take over (or end) a run the user has open
                **self.init,
            }
            if self.run_id is not None:  # a later train() call of the same Trainer continues its run
                kwargs.update(id=self.run_id, resume="allow")
            self.run = wandb.init(**kwargs)
            self.run_id = self.run.id

    def submit(self, record: Mapping[str, Any]) -> None:
        """Log a record's numbers at its iteration (an evaluation's policy step as ``eval/policy_step``: the
        training step's record at that iteration has its own)."""
        prefix = "eval/" if record.get("split") == "eval" else ""
        metrics = {
            (prefix + key if key == "policy_step" else key): value
            for key, value in record.items()
            if key not in _NOT_METRICS and isinstance(value, int | float) and not isinstance(value, bool)
        }
        with self._lock:
            if self.run is not None:
                self.run.log(metrics, step=int(record.get("iteration", 0)))

    def finish(self, *, curve: Path | None, timeout: float) -> None:
        with self._lock:
            run, self.run = self.run, None
        if run is None:
            return
        if curve is not None and Path(curve).exists():
            run.log({"reward_curve": wandb.Image(str(curve))})
        done = threading.Thread(target=run.finish, name="langgraph-art-wandb-finish", daemon=True)
        done.start()
        done.join(timeout)
        self._finishing = done
        if done.is_alive():
            log.warning("W&B: still finishing the run after %.0f s; it goes on in the background", timeout)
