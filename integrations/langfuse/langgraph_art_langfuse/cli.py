"""``langgraph-art export langfuse``: found by core's CLI through the ``langgraph_art.export`` entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_langfuse(
    project: Annotated[str, typer.Option(help="the project whose store to export")],
    home: Annotated[str, typer.Option(help="the folder holding the project (LANGGRAPH_ART_HOME)")] = ".art",
    since: Annotated[int | None, typer.Option(help="only runs sampled by this policy step and later")] = None,
) -> None:
    """Send to Langfuse every stored run, score and training step it does not have yet (LANGFUSE_* keys)."""
    from langgraph_art import ConfigError, TrajectoryStore
    from langgraph_art.runlog import read_records
    from langgraph_art_langfuse.exporter import LangfuseExporter

    folder = Path(home) / project
    if not (folder / "trajectories.sqlite").exists():
        typer.echo(f"No store at {folder / 'trajectories.sqlite'}: check --project and --home.", err=True)
        raise typer.Exit(2)
    records = read_records(folder, since_step=since)
    with TrajectoryStore.for_project(project, home) as store:
        try:
            exporter = LangfuseExporter(store)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from exc
        typer.echo(f"Exporting {folder} to {exporter.settings.base_url} ...")
        report = exporter.export(since_step=since, steps=records)
    typer.echo(f"Langfuse: {report}")
    if not report.ok:
        raise typer.Exit(1)
