"""Serving a new checkpoint: the one path from a checkpoint folder to ``name@step`` in an engine, used by the local
backend and the service's training routes alike."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any

from langgraph_art.types import ModelRef


async def publish(engine: Any, ref: ModelRef, folder: str | Path, keep_loaded: int) -> None:
    """Load ``folder`` into ``engine`` as ``ref`` (``name@step``), then unload that policy's older steps beyond the
    newest ``keep_loaded`` (they stay on disk and can be loaded again)."""
    await engine.load_adapter(str(ref), str(folder))
    for name in stale_adapters(engine.adapters(), ref.name, keep_loaded):
        await engine.unload_adapter(name)


def stale_adapters(loaded: Iterable[str], policy: str, keep: int) -> list[str]:
    """The loaded ``policy@step`` adapters beyond the newest ``keep``, oldest first (to unload)."""
    refs = sorted((ref for ref in map(ModelRef.parse, loaded) if ref.name == policy and ref.step is not None),
                  key=lambda ref: ref.step or 0)  # fmt: skip
    return [str(ref) for ref in refs[: max(0, len(refs) - keep)]]


@contextlib.contextmanager
def trainer_turn(engine: Any, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> Iterator[None]:
    """Hand the accelerator to the trainer for the block: an engine that can sleep (vLLM in sleep mode, sharing a
    GPU with the trainer) sleeps and wakes after, even when the step fails; any other engine is left alone.
    ``run`` runs a coroutine on the engine's event loop (``EmbeddedServer.run``)."""
    if not getattr(engine, "can_sleep", False):
        yield
        return
    run(engine.sleep())
    try:
        yield
    finally:
        run(engine.wake_up())


@contextlib.asynccontextmanager
async def trainer_turn_async(engine: Any) -> Any:
    """``trainer_turn`` from code already on the engine's event loop (the training routes)."""
    if not getattr(engine, "can_sleep", False):
        yield
        return
    await engine.sleep()
    try:
        yield
    finally:
        await engine.wake_up()
