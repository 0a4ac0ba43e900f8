"""Every install command the README and the docs show works exactly as written in a fresh venv: each ```bash block
with a ``pip install`` runs, as it is, in a fresh copy of the working tree (the venv it makes, or a fresh
``python3 -m venv .venv`` when it makes none), with Python 3's own pip; then the package it installed imports.
Blocks that are the same command are run once, two at a time. Slow (minutes, from the package registries and pip's
cache)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
    assert '-e ".[dev,mcp]"' in ci_install() and "pip install torch==" in ci_install()
    assert "--upgrade pip" not in (ROOT / ".ci" / "run").read_text()  # Python's own pip, as a user has it


def test_the_docs_show_install_commands() -> None:
    blocks = install_blocks()
    assert any(".[train,serve]" in b for b in blocks.values()), blocks  # the library alone
    assert all("pip install torch==" in b for b in blocks.values()), blocks  # the pinned CPU torch first, always


def run_block(where: str, block: str, folder: Path) -> str | None:
    """Run ``block`` as written in a fresh copy of the tree under ``folder``; None, or what went wrong."""
    tree = fresh_tree(folder / "checkout")
    makes_venv = re.search(r"python3? -m venv", block) is not None
    script = block if makes_venv else f"python3 -m venv .venv && . .venv/bin/activate\n{block}"
    bare = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | {"PATH": bare}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tree, env=env, capture_output=True, text=True, timeout=1500
    )
    if done.returncode != 0:
        return f"{where}:\n{block}\n--- output ---\n{(done.stdout + done.stderr)[-4000:]}"
    venvs = [p for p in tree.glob("*/bin/python") if (p.parent / "activate").exists()]
    if not venvs:
        return f"{where}: no venv in the checkout after the block"
    imports = subprocess.run([str(venvs[0]), "-c", "import langgraph_art; print(langgraph_art.__version__)"],
                             cwd=folder, capture_output=True, text=True, timeout=120)  # fmt: skip
    if imports.returncode != 0 or not imports.stdout.strip():
        return f"{where}: the install does not import: {imports.stderr[-2000:]}"
    return None


def test_every_install_command_works_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    """Each block in its own fresh venv and copy of the tree; two at a time (pip mostly waits on the disk and
    unpacks; nothing else runs meanwhile), so CI pays about one install's time for two."""
    blocks = install_blocks()
    assert blocks
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda item: run_block(item[1][0], item[1][1], tmp_path / f"block{item[0]}"),
                           enumerate(blocks.items()))  # fmt: skip
        failures = [failure for failure in results if failure]
    assert not failures, "\n\n".join(failures)
