"""The server's rendered-prompt cache gives exactly what rendering gives, never shares its lists, and stays bounded."""

from __future__ import annotations

from typing import Any

from langgraph_art.serve.chat import PromptCache, render_prompt
from langgraph_art.testing import WEATHER_TOOL


def test_cached_prompts_are_the_rendered_ones_and_bounded(tokenizer: Any) -> None:
    cache = PromptCache(size=2)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = cache.render(tokenizer, question, [WEATHER_TOOL])
    assert first == render_prompt(tokenizer, question, [WEATHER_TOOL])
    first.append(-1)  # the caller's list is its own
    again = cache.render(tokenizer, question, [WEATHER_TOOL])
    assert again == render_prompt(tokenizer, question, [WEATHER_TOOL]) and again is not first
    assert cache.render(tokenizer, question, None) == render_prompt(
        tokenizer, question, None
    )  # tools are part of the key
    other = [{"role": "user", "content": "hi"}]
    cache.render(tokenizer, other, None)
    assert len(cache._ids) == 2  # the least recently used entry went
    odd = [{"role": "user", "content": "hi", "extra": object()}]  # not JSON: rendered, not cached under a guess
    assert cache.render(tokenizer, odd, None) == render_prompt(tokenizer, odd, None) and len(cache._ids) == 2
