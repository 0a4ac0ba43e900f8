"""The run log beside the loop: one ``metrics.jsonl`` line per training step (written here, read here) and the reward
curve drawn from it.

A record is a training step's metrics (``"split": "train"``) or an evaluation's (``"split": "eval"``, metrics
``eval/...``), plus ``run`` (the training run's id), ``iteration`` (1, 2, ... in that run: the steps done; an
evaluation's is the number of steps before it, 0 = before the first; ``step`` is the checkpoint, which does not move
on a skipped step), ``model``, ``started`` and ``finished`` (epoch seconds).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"


def append_record(run_dir: str | Path, record: Mapping[str, Any]) -> None:
    """Add one step's record to ``<run_dir>/metrics.jsonl``."""
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / METRICS_FILE).open("a") as out:
        out.write(json.dumps(dict(record)) + "\n")


def read_records(project_dir: str | Path, *, since_step: int | None = None) -> list[dict[str, Any]]:
    """Every step record of every model of a project (``<project_dir>/runs/*/metrics.jsonl``), optionally only
    those whose runs were sampled by policy step ``since_step`` or later."""
    records = []
    for path in sorted(Path(project_dir).glob(f"runs/*/{METRICS_FILE}")):
        for line in path.read_text().splitlines():
            record = json.loads(line) if line.strip() else None
            if record and "run" in record and (since_step is None or record.get("policy_step", 0) >= since_step):
                records.append(record)
    return records


def plot_rewards(
    history: Sequence[Mapping[str, float]],
    target: str | Path,
    title: str,
    *,
    evals: Sequence[Mapping[str, Any]] = (),
) -> Path | None:
    """Write the reward curve (train: mean and std per step, 5-step average; eval: each evaluation's mean at the
    iteration it followed, 0 = before training) as a PNG; needs matplotlib."""
    try:  # a Figure with its own Agg canvas: no pyplot, so the process's matplotlib backend is left alone
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed: no reward curve PNG (pip install matplotlib)")
        return None
    target = Path(target)
    xs = list(range(1, len(history) + 1))
    mean = [m["reward/mean"] for m in history]
    std = [m["reward/std"] for m in history]
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(xs, mean, label="mean reward", color="tab:blue", alpha=0.6)
    window = [statistics.fmean(mean[max(0, i - 4) : i + 1]) for i in range(len(mean))]
    ax.plot(xs, window, label="5-step average", color="tab:red", linewidth=2)
    ax.fill_between(
        xs,
        [m - s for m, s in zip(mean, std, strict=True)],
        [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2,
        color="tab:blue",
    )
    if evals:
        ax.plot(
            [e["iteration"] for e in evals],
            [e["eval/reward/mean"] for e in evals],
            label="eval reward (held out)",
            color="tab:green",
            marker="o",
            linewidth=2,
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100, bbox_inches="tight")
    return target
