"""The ./dev entry point offers every command that CI, the README and its own usage text call.

A review edit once dropped `./dev lint` from the script while `.ci/run` still called it: CI failed after 93 s
on the usage text. These checks read the files; they start no venv.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLERS = [".ci/run", "README.md", "benchmarks/README.md", "dev"]


def offered_commands() -> set[str]:
    """The case labels of dev's command switch (`  name)` or `  a|b)` lines)."""
    text = (ROOT / "dev").read_text()
    switch = text[text.index('case "$cmd" in') :]
    labels = re.findall(r"^  ([a-z][a-z|-]*)\)", switch, flags=re.MULTILINE)
    return {name for label in labels for name in label.split("|")}


def called_commands(path: str) -> set[str]:
    text = (ROOT / path).read_text()
    return set(re.findall(r"\./dev ([a-z][a-z-]*)\b", text)) - {"and", "does", "need"}


def test_every_called_command_is_offered() -> None:
    offered = offered_commands()
    assert {"lint", "test", "demo", "setup"} <= offered
    for path in CALLERS:
        missing = called_commands(path) - offered
        assert not missing, f"{path} calls ./dev {sorted(missing)}, which dev does not offer"


def test_unknown_command_prints_usage_and_fails() -> None:
    done = subprocess.run(["bash", str(ROOT / "dev"), "no-such-command"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "./dev lint" in done.stdout and "./dev test" in done.stdout
    assert "set -euo" not in done.stdout  # the usage text ends before the script does
