"""The shared test helpers live in ``langgraph_art.testing`` (the integrations' tests use them too); waiting on a
condition is here."""

import asyncio
import time
from collections.abc import Callable

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
    "get_weather",
    "one_agent_graph",
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
