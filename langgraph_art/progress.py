"""A rich progress bar (done / total, elapsed, one line of live info), or nothing when disabled."""

from __future__ import annotations

from typing import Any


class ProgressBar:
    def __init__(self, label: str, total: int, enabled: bool, *, transient: bool = False) -> None:
        self._bar: Any = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                transient=transient,
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
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)
