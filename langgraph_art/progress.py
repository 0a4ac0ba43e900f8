"""Progress of a long run: a rich bar (done / total, one line of live info, elapsed) on a terminal or in a notebook;
where the output is not a terminal (a log file, CI, nohup, Slurm) one plain line per advance instead, so a log shows
each step as it ends; nothing when disabled."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def is_live(stream: TextIO) -> bool:
    """True where a live bar renders: a terminal or a notebook (rich's own detection)."""
    from rich.console import Console

    console = Console(file=stream)
    return (console.is_terminal and not console.is_dumb_terminal) or console.is_jupyter


class ProgressBar:
    """``with ProgressBar("training", steps, enabled) as bar: ... bar.advance(info)``. A ``transient`` bar (one tick
    per rollout) shows only live: as plain lines it would drown the steps' lines."""

    def __init__(
        self, label: str, total: int, enabled: bool, *, transient: bool = False, stream: TextIO | None = None
    ) -> None:
        self._bar: Any = None
        self._plain: TextIO | None = None
        self.label, self.total, self.done = label, total, 0
        self._started = time.monotonic()
        if not enabled:
            return
        stream = stream or sys.stdout
        if not is_live(stream):
            self._plain = None if transient else stream
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            transient=transient,
            console=Console(file=stream),
        )
        self._task = self._bar.add_task(label, total=total, info="")

    def __enter__(self) -> ProgressBar:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, info: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)
        elif self._plain is not None:
            elapsed = time.monotonic() - self._started
            print(f"{self.label} {self.done}/{self.total}  {info}  elapsed {elapsed:.0f}s".rstrip(), file=self._plain,
                  flush=True)  # fmt: skip
