"""Every install command the README and the docs show works exactly as written in a fresh venv: each ```bash block
with a ``pip install`` runs, as it is, in a fresh copy of the working tree (the venv it makes, or a fresh
``python3 -m venv .venv`` when it makes none), with Python 3's own pip; then the package it installed imports.
Blocks that are the same command are run once. Slow (minutes, from the package registries and pip's cache)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.S | re.M)
pytestmark = [pytest.mark.slow]


def documents() -> list[Path]:
    """The README, the docs site's pages (benchmarks/README.md is one of them) and the integrations' READMEs."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "benchmarks" / "README.md",
        *sorted(ROOT.glob("integrations/*/README.md")),
    ]


def ci_install() -> str:
    """The install ``.ci/run`` runs (between its BEGIN and END lines): CI itself tests that block."""
    text = (ROOT / ".ci" / "run").read_text()
    return "\n".join(
        line for line in text.split("# BEGIN", 1)[1].split("# END", 1)[0].splitlines()[1:] if not line.startswith("#")
    ).strip()


def install_blocks() -> dict[str, str]:
    """Each distinct ```bash block that runs ``pip install``, by where it first appears; not the one ``.ci/run``
    runs itself on every CI run."""
    found: dict[str, str] = {"ci": ci_install()}
    for doc in documents():
        for number, match in enumerate(BLOCK.finditer(doc.read_text()), 1):
            block = match.group(1).strip()
            if re.search(r"^\s*(?:\S+/)?(?:pip|python3? -m pip) install", block, re.M) and block not in found.values():
                found[f"{doc.relative_to(ROOT)}#{number}"] = block
    return {where: block for where, block in found.items() if where != "ci" and block != found["ci"]}


def fresh_tree(target: Path) -> Path:
    """The working tree as ``git`` sees it (tracked and untracked, not ignored): what a clone of it would hold."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_ci_installs_with_the_readmes_development_block_exactly() -> None:
    readme = [m.group(1).strip() for m in BLOCK.finditer((ROOT / "README.md").read_text())]
    assert ci_install() in readme, ci_install()
    assert '-e ".[dev]"' in ci_install() and "pip install torch==" in ci_install()
    assert "--upgrade pip" not in (ROOT / ".ci" / "run").read_text()  # Python's own pip, as a user has it


def test_the_docs_show_install_commands() -> None:
    blocks = install_blocks()
    assert any(".[train,serve]" in b for b in blocks.values()), blocks  # the library alone
    assert all("pip install torch==" in b for b in blocks.values()), blocks  # the pinned CPU torch first, always


@pytest.mark.parametrize("where", sorted(install_blocks()))
def test_each_install_command_works_as_written_in_a_fresh_venv(where: str, tmp_path: Path) -> None:
    block = install_blocks()[where]
    tree = fresh_tree(tmp_path / "checkout")
    makes_venv = re.search(r"python3? -m venv", block) is not None
    script = block if makes_venv else f"python3 -m venv .venv && . .venv/bin/activate\n{block}"
    bare = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | {"PATH": bare}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tree, env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, f"{where}:\n{block}\n--- output ---\n{(done.stdout + done.stderr)[-4000:]}"
    venvs = [p for p in tree.glob("*/bin/python") if (p.parent / "activate").exists()]
    assert venvs, f"{where}: no venv in the checkout after the block"
    imports = subprocess.run([str(venvs[0]), "-c", "import langgraph_art; print(langgraph_art.__version__)"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert imports.returncode == 0 and imports.stdout.strip(), imports.stderr[-2000:]
