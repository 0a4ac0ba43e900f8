"""mkdocs hooks (``hooks:`` in mkdocs.yml): reference tables generated from the code, and the example curves.

- ``<!-- generated: grpo-config -->`` becomes a table of ``GRPOConfig``'s fields: name, type and default from the
  pydantic model, help from its ``Field(description=...)``. A field with no help fails the build.
- ``<!-- generated: cli -->`` becomes the ``langgraph-art`` commands with their options, walked from the Typer app
  (``typer.main.get_command``: click objects).
- ``<!-- generated: http-errors -->`` becomes the service's error table, from ``langgraph_art.errors.HTTP_ERRORS``
  (status, class, OpenAI error type and code; the class's docstring says when).
- The curves in ``examples/curves/`` are added to the site as ``examples/curves/*.png`` (they live outside
  ``docs/``, beside the examples that draw them), so pages show them and strict mode checks the links.

``python docs/hooks.py grpo-config|cli|http-errors`` prints a table, to look at without building.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*generated:\s*([a-z0-9-]+)\s*-->")


# -- GRPOConfig ----------------------------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return text.replace("typing.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def grpo_config_table() -> str:
    from langgraph_art import config as module

    cls = module.GRPOConfig
    rows = ["| field | type | default | what it does |", "|---|---|---|---|"]
    missing = []
    for name, field in cls.model_fields.items():
        help_text = field.description
        if not help_text:
            missing.append(name)
            continue
        default = field.get_default()
        kind = _type_name(field.annotation)  # a pipe inside a code span is the table extension's literal pipe
        rows.append(f"| `{name}` | `{kind}` | `{default!r}` | {_cell(help_text)} |")
    if missing:
        raise ValueError(f"GRPOConfig fields without help (give them Field(description=...) in config.py): {missing}")
    return "\n".join(rows)


# -- CLI -----------------------------------------------------------------------------------------------------------
def _param_type(param: Any) -> str:
    bare = getattr(param, "bare_type", None)  # typer's own click (typer >= 0.26)
    if callable(bare):
        try:
            return str(bare())
        except TypeError:
            pass
    kind = getattr(param, "type", None)  # click
    return str(getattr(kind, "name", kind or ""))


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        return [(path, command)]
    out = [(path, command)] if path else []
    for name in sorted(subcommands):
        out += _commands(subcommands[name], [*path, name])
    return out


def cli_reference() -> str:
    import typer.main

    from langgraph_art.cli import app

    root = typer.main.get_command(app)
    out = []
    for path, command in _commands(root, []):
        out.append(f"### `langgraph-art {' '.join(path)}`\n")
        if command.help:
            out.append(" ".join(command.help.split()) + "\n")
        if getattr(command, "commands", None):
            out.append("Commands: " + ", ".join(f"`{name}`" for name in sorted(command.commands)) + ".\n")
            continue
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if not params:
            continue
        out += ["| option | type | default | what it does |", "|---|---|---|---|"]
        for p in params:
            names = " / ".join(f"`{o}`" for o in [*p.opts, *(p.secondary_opts or [])])
            if getattr(p, "multiple", False):
                names += " (repeatable)"
            if getattr(p, "required", False):
                default = "required"
            elif p.default is None:
                default = ""
            else:
                default = f"`{p.default}`"
            help_text = " ".join((p.help or "").split())
            if getattr(p, "envvar", None):
                help_text += f" (env `{p.envvar}`)"
            kind = "flag" if getattr(p, "is_flag", False) else _param_type(p)
            out.append(f"| {names} | {_cell(kind)} | {_cell(default)} | {_cell(help_text)} |")
        out.append("")
    return "\n".join(out)


# -- HTTP errors ---------------------------------------------------------------------------------------------------
def http_errors_table() -> str:
    from langgraph_art import errors

    rows = ["| status | error class | OpenAI `type` | `code` | when |", "|---|---|---|---|---|"]
    for cls, status, kind, code in errors.HTTP_ERRORS:
        when = re.sub(r"``([^`]+)``", r"`\1`", " ".join((cls.__doc__ or "").split()))  # reST -> Markdown
        retry = errors.RETRY_AFTER.get(status)
        if retry is not None:
            when += f" The answer carries `retry-after: {retry}`."
        shown = f"`{code}`" if code is not None else "the error's own (`invalid_request` by default)"
        rows.append(f"| `{status}` | `{cls.__name__}` | `{kind}` | {shown} | {_cell(when)} |")
    return "\n".join(rows)


GENERATORS = {"grpo-config": grpo_config_table, "cli": cli_reference, "http-errors": http_errors_table}


# -- mkdocs events -------------------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown marker 'generated: {name}' (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "examples" / "curves").glob("*.png")):
        files.append(
            File(
                png.relative_to(ROOT).as_posix(),
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(GENERATORS[sys.argv[1]]())
