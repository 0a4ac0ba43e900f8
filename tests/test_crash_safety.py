"""SIGKILL the trainer during a step and during a checkpoint write: a restart resumes from the last good step
and the store has lost no trajectory, and the run ends where an uninterrupted one ends: the same LoRA and the same
AdamW moments (a resume that restarted the optimizer, or lost its step count, would not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from langgraph_art.store import TrajectoryStore
from langgraph_art.train import checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def run_until(folder: Path, steps: int, marker: str, *flags: str) -> list[str]:
    """Start the worker, SIGKILL it as soon as it prints ``marker``; return what it printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", str(folder), str(steps), *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == marker:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert lines[-1] == marker, lines
    return lines


def finish(folder: Path, steps: int) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.crash_worker", str(folder), str(steps)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return out.stdout.split("\n")


def assert_same_training_state(resumed: Path, uninterrupted: Path) -> None:
    """The workers' ``final.pt``: per LoRA parameter, the tensor and AdamW's exp_avg, exp_avg_sq and step."""
    got, want = torch.load(resumed / "final.pt"), torch.load(uninterrupted / "final.pt")
    assert len(got) == len(want) > 0
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys() == {"param", "exp_avg", "exp_avg_sq", "step"}, (i, a.keys())
        assert float(a["step"]) == float(b["step"]) == 6, (i, a["step"], b["step"])
        assert b["exp_avg_sq"].abs().max() > 0, i  # the moments compared are not trivially zero
        for key in ("param", "exp_avg", "exp_avg_sq"):
            # the same ops on the same numbers: equal up to float noise (a restarted optimizer is off by ~100%)
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-8, msg=f"parameter {i}: {key} differs")


def test_kill_during_a_step_and_during_a_checkpoint_write(tmp_path: Path) -> None:
    printed = run_until(tmp_path, 6, "in-step 3", "--slow-step", "3")
    assert "saved 2" in printed and checkpoint.list_steps(tmp_path / "ckpt") == [1, 2]
    stored = TrajectoryStore(tmp_path / "store.sqlite")
    assert stored.count() == 4 * 3  # groups 0, 1, 2 were stored before the kill (group 2 mid-training)

    printed = run_until(tmp_path, 6, "writing 4", "--slow-save", "4")
    assert printed[0] == "resumed 2" and "saved 3" in printed
    assert checkpoint.list_steps(tmp_path / "ckpt") == [1, 2, 3]  # the half-written step 4 is not a checkpoint
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".step-000004")]  # leftover

    printed = finish(tmp_path, 6)
    assert printed[0] == "resumed 3" and "saved 6" in printed
    assert checkpoint.list_steps(tmp_path / "ckpt") == [4, 5, 6]  # save_total_limit=3
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]  # leftovers cleaned
    store = TrajectoryStore(tmp_path / "store.sqlite")
    # every group ever stored is there once: re-run steps upsert the same ids instead of duplicating
    assert store.count() == 4 * 6
    assert sorted({t.group_id for t in store.trajectories()}) == [f"g{i}" for i in range(6)]

    (tmp_path / "uninterrupted").mkdir()
    assert "saved 6" in finish(tmp_path / "uninterrupted", 6)
    assert_same_training_state(tmp_path, tmp_path / "uninterrupted")
