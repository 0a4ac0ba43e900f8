"""The integration is its own distribution on langgraph-art's public API only."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]


# What an integration may import from core: the top-level workflow names, the parts of a trajectory, the errors and
# the run log's format (``metrics.jsonl``, which ``export langfuse`` sends).
PUBLIC = {
    "langgraph_art": None,
    "langgraph_art.types": None,
    "langgraph_art.errors": None,
    "langgraph_art.runlog": None,
}


def test_it_imports_only_the_public_api_of_langgraph_art() -> None:
    import importlib

    import langgraph_art

    for module in sorted((PACKAGE / "langgraph_art_langfuse").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("langgraph_art"):
                if node.module == "langgraph_art_langfuse" or node.module.startswith("langgraph_art_langfuse."):
                    continue
                assert node.module in PUBLIC, f"{module.name} imports {node.module}: use {sorted(PUBLIC)}"
                public = importlib.import_module(node.module)
                names = langgraph_art.__all__ if node.module == "langgraph_art" else vars(public)
                assert all(alias.name in names for alias in node.names), (module.name, node.names)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("langgraph_art.") for a in node.names), module.name


@pytest.mark.slow
def test_it_builds_as_its_own_wheel(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("langgraph_art_langfuse-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {"langgraph_art_langfuse/exporter.py", "langgraph_art_langfuse/traces.py"} <= set(names)
    assert not any(n.startswith("langgraph_art/") for n in names)  # nothing of the core package
    assert "Requires-Dist: langgraph-art<0.2,>=0.1" in metadata and "Requires-Dist: langfuse" in metadata
