"""``RolloutWorker``: the Ray actor that holds a graph and runs it, one run per call (``on_ray.RayRollouts`` drives
it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
from typing import Any

from langgraph_art.capture.rollout import arollout
from langgraph_art.rollouts.pickling import dumps
from langgraph_art.types import Trajectory


class RolloutWorker:
    """One Ray actor (``ray.remote(RolloutWorker)``, async): holds the graph and runs it once per ``run`` call."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.graph: Any = None
        self.threads = 0

    def pid(self) -> int:
        return os.getpid()

    async def load(self, key: str, blob: bytes, threads: int) -> int:
        """Hold graph ``key`` (pickled by ``dumps``); sync nodes get ``threads`` threads. Returns the pid."""
        self.graph, self.key = pickle.loads(blob), key
        if threads > self.threads:  # LangGraph runs sync nodes in the loop's default executor, one thread per run
            asyncio.get_running_loop().set_default_executor(
                concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="langgraph-art-node")
            )
            self.threads = threads
        return os.getpid()

    async def run(self, key: str, input: Any, metadata: dict[str, Any]) -> tuple[Trajectory, bytes | None, str | None]:
        """One run: its trajectory (without ``final_state``), the final state pickled (None: it did not pickle)
        and why it did not."""
        from langgraph_art.capture.chat_model import ChatART

        if key != self.key:  # the driver loads a graph before it sends runs of it
            raise RuntimeError(f"rollout worker holds graph {self.key}, not {key}")
        trajectory = await arollout(self.graph, input, metadata=metadata, recorders=[ChatART.unpickled_recorder()])
        state, trajectory.final_state = trajectory.final_state, None
        try:
            return trajectory, dumps(state), None
        except Exception as exc:  # noqa: BLE001 - the run is kept; rewards that take `state` abstain on it
            return trajectory, None, f"{type(exc).__name__}: {exc}"
