"""The shared test helpers live in ``langgraph_art.testing`` (the integrations' tests use them too)."""

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
    "digit_share",
    "get_weather",
    "one_agent_graph",
    "tool_call_adapter",
    "tool_loop_graph",
    "train_tool_call_adapter",
]
