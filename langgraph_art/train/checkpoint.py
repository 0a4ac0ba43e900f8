"""Per-step checkpoints, written atomically: a temporary folder renamed into place, so a folder named
``step-000012`` is always complete. Each holds the LoRA adapter in standard peft format (loadable by peft and by
vLLM's LoRA loader), the optimizer state and the trainer state. The last ``keep`` are kept, plus any pinned.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

_STEP = re.compile(r"^step-(\d{6,})$")
PIN = "PINNED"
log = logging.getLogger(__name__)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def list_steps(root: Path) -> list[int]:
    """Complete checkpoints, oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())


def latest_step(root: Path) -> int | None:
    steps = list_steps(root)
    return steps[-1] if steps else None


def save(root: Path, step: int, write: Any, state: dict[str, Any], keep: int = 3) -> Path:
    """``write(folder)`` writes the adapter and optimizer files into a fresh folder; then ``trainer_state.json``;
    then the folder is renamed to ``step-NNNNNN`` (atomic on one file system) and old checkpoints are pruned."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        tmp.mkdir()
        write(tmp)
        (tmp / "trainer_state.json").write_text(json.dumps({**state, "step": step, "saved_at": time.time()}))
        if final.exists():  # re-saving a step (e.g. after a resume): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    prune(root, keep)
    return final


def load_state(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "trainer_state.json").read_text()))


def pin(root: Path, step: int) -> None:
    """Keep this checkpoint whatever ``keep`` says."""
    folder = step_dir(root, step)
    if not folder.is_dir():
        raise FileNotFoundError(f"no checkpoint for step {step} in {root}")
    (folder / PIN).touch()


def prune(root: Path, keep: int) -> list[int]:
    """Delete all but the last ``keep`` checkpoints (pinned ones stay); also leftovers of interrupted saves."""
    for leftover in root.glob(".step-*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    steps = list_steps(root)
    removed = []
    for step in steps[: max(0, len(steps) - keep)]:
        folder = step_dir(root, step)
        if not (folder / PIN).exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(step)
    return removed


def load_latest(root: Path, params: dict[str, Any], optimizer: Any, config: Any) -> int | None:
    """Load the latest checkpoint under ``root`` into a trainer's LoRA ``params`` (by peft's tensor names) and its
    ``optimizer``; its step, or None when there is none. ConfigError when it holds a LoRA on other layers."""
    step = latest_step(root)
    if step is None:
        return None
    import torch
    from safetensors.torch import load_file

    from langgraph_art.errors import ConfigError

    folder = step_dir(root, step)
    saved = load_file(folder / "adapter_model.safetensors")
    if set(saved) != set(params):
        raise ConfigError(
            f"{folder} holds a LoRA on other layers than target_modules={config.target_modules!r} "
            "selects; train under another name, or use the target_modules it was trained with"
        )
    with torch.no_grad():
        for key, param in params.items():
            param.copy_(saved[key])
    optimizer_state = folder / "optimizer.pt"
    if optimizer_state.exists():
        device = next(iter(params.values())).device
        optimizer.load_state_dict(torch.load(optimizer_state, map_location=device))
    log.info("resumed from checkpoint %s", folder)
    return step
