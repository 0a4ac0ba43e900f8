"""The shared test helpers live in ``langgraph_art.testing`` (the integrations' tests use them too); waiting on a
condition and loading an example are here."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_tests.integration_tests import ChatModelIntegrationTests

from langgraph_art.capture.chat_model import ChatART
from langgraph_art.testing import (
    WEATHER_ANSWER,
    WEATHER_CALL,
    WEATHER_PROMPTS,
    WEATHER_RESULT,
    WEATHER_TOOL,
    digit_share,
    get_weather,
    one_agent_graph,
    tool_call_adapter,
    tool_loop_graph,
    train_tool_call_adapter,
)

__all__ = [
    "WEATHER_ANSWER",
    "WEATHER_CALL",
    "WEATHER_PROMPTS",
    "WEATHER_RESULT",
    "WEATHER_TOOL",
    "async_wait_until",
    "digit_share",
    "example",
    "get_weather",
    "one_agent_graph",
    "records",
    "tool_call_adapter",
    "tool_loop_graph",
    "train_tool_call_adapter",
    "wait_until",
]

# Waiting on a condition instead of sleeping: the deadline only bounds a hang (it is generous and never measures
# anything), and the test goes on as soon as the condition holds, on a slow machine or a fast one.
WAIT_S = 60.0


def wait_until(condition: Callable[[], object], what: str, seconds: float = WAIT_S) -> None:
    """Poll ``condition()`` until it is true; after ``seconds``, fail saying what never happened."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.01)


async def async_wait_until(condition: Callable[[], object], what: str, seconds: float = WAIT_S) -> None:
    """``wait_until`` inside an event loop (the loop runs meanwhile: the first polls only yield to it, so what
    another task does at once is seen at once)."""
    deadline, polls = time.monotonic() + seconds, 0
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:.0f} s for {what}")
        await asyncio.sleep(0 if polls < 100 else 0.01)
        polls += 1


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(argv: list[str], port: int, what: str, seconds: float = 180) -> Iterator[str]:
    """Run ``argv`` (a ``langgraph-art serve`` on ``port``, with OMP_NUM_THREADS=1) until it answers /health; yields
    its ``http://127.0.0.1:port``, then terminates it. If it exits first, its output is the failure."""
    import httpx

    proc = subprocess.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            return httpx.get(f"{url}/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, f"{what} to answer /health", seconds)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if TYPE_CHECKING:
    from langgraph_art.serve.engines.base import GenerationResult


def assert_same_samples(
    got: Sequence[GenerationResult], want: Sequence[GenerationResult], tolerance: float = 1e-4
) -> None:
    """Two engines' results for the same requests: the same token ids, logprobs within ``tolerance``."""
    for result, expected in zip(got, want, strict=True):
        for sample, reference in zip(result.samples, expected.samples, strict=True):
            assert sample.token_ids == reference.token_ids
            assert max(abs(a - b) for a, b in zip(sample.logprobs, reference.logprobs, strict=True)) < tolerance


class ServedChatModelSuite(ChatModelIntegrationTests):
    """LangChain's standard integration suite, set for a ChatART in front of our service: forced tool choice,
    structured output and JSON mode (all enforced by the service's grammar), usage metadata. A suite class of a
    test module subclasses it and says where the service is (``chat_model_params``)."""

    @property
    def chat_model_class(self) -> type[ChatART]:
        return ChatART

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str) -> Any:
    """An example module, imported the way ``python examples/<name>.py`` finds its neighbours."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def records(run_dir: Path) -> list[dict[str, Any]]:
    """A training run's ``metrics.jsonl``, one dict per step or evaluation."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def recorded_gradients(trainer: Any) -> list[Any]:
    """The LoRA gradients ``trainer``'s next optimizer steps see, appended to the returned list (Adam's first update
    is ~lr * sign(grad), too coarse to compare updates by)."""
    grads: list[Any] = []
    step = trainer.optimizer.step

    def record(*args: object, **kwargs: object) -> object:
        grads.extend(p.grad.detach().clone() for p in trainer.trainable_parameters() if p.grad is not None)
        return step(*args, **kwargs)

    trainer.optimizer.step = record
    return grads
