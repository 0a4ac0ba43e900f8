"""langgraph_art.cache.wheel_files: files out of a wheel, unpacked once, never installed."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from langgraph_art.cache import wheel_files
from langgraph_art.errors import ConfigError


@pytest.fixture()
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hand-made wheel ``demo-pkg==1.0`` in a LANGGRAPH_ART_WHEELS folder, and a fresh cache."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "demo_pkg-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("demo_pkg/__init__.py", "import something_missing\n")
        archive.writestr("demo_pkg/data/a.json", '{"a": 1}')
        archive.writestr("demo_pkg/data/sub/b.json", '{"b": 2}')
        archive.writestr("demo_pkg/model.gguf", b"GGUF")
    monkeypatch.setenv("LANGGRAPH_ART_WHEELS", str(folder))
    monkeypatch.setenv("LANGGRAPH_ART_CACHE", str(tmp_path / "cache"))
    return folder


def test_files_of_a_pattern_come_out_once_laid_out_as_in_the_wheel(wheels: Path, tmp_path: Path) -> None:
    root = wheel_files("demo-pkg==1.0", "demo_pkg/data/*")
    assert root == tmp_path / "cache" / "wheels" / "demo-pkg-1.0"
    assert (root / "demo_pkg/data/a.json").read_text() == '{"a": 1}'
    assert (root / "demo_pkg/data/sub/b.json").exists()  # fnmatch's * crosses folders
    assert not (root / "demo_pkg/__init__.py").exists() and not (root / "demo_pkg/model.gguf").exists()
    (root / "demo_pkg/data/a.json").write_text("changed")  # a second call unpacks nothing
    os.remove(wheels / "demo_pkg-1.0-py3-none-any.whl")
    assert (wheel_files("demo-pkg==1.0", "demo_pkg/data/*") / "demo_pkg/data/a.json").read_text() == "changed"


def test_another_pattern_adds_its_files_beside_the_first(wheels: Path) -> None:
    wheel_files("demo-pkg==1.0", "demo_pkg/data/*")
    root = wheel_files("demo-pkg==1.0", "demo_pkg/*.gguf")
    assert (root / "demo_pkg/model.gguf").read_bytes() == b"GGUF" and (root / "demo_pkg/data/a.json").exists()


def test_errors_say_what_to_change(wheels: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name==version"):
        wheel_files("demo-pkg", "*")
    with pytest.raises(ConfigError, match="no file matching 'nothing/\\*'"):
        wheel_files("demo-pkg==1.0", "nothing/*")
    # not in the folder and not on the index: the message says how to fetch it by hand
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(ConfigError, match=r"pip download --no-deps demo-pkg==2\.0 -d wheels/.*LANGGRAPH_ART_WHEELS"):
        wheel_files("demo-pkg==2.0", "demo_pkg/data/*")
    assert not list((tmp_path / "cache" / "wheels").glob("demo-pkg-2.0/*"))  # nothing half-unpacked
