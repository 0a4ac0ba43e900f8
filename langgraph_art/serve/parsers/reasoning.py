"""Reasoning parsers, named as vLLM's ``--reasoning-parser`` names them: they split a reply's thinking from its
answer. The thinking goes to the message's ``reasoning_content`` (LangChain shows it as a ``reasoning`` content
block), never into its text; the sampled thinking tokens stay in the trajectory and are trained as sampled.

- ``qwen3``: ``<think>...</think>`` at the start of the reply (Qwen3, SmolLM3, QwQ). No ``<think>``: no thinking
  (``enable_thinking=False`` renders an empty think block into the prompt itself). Cut off before ``</think>``:
  everything after ``<think>`` is thinking.
- ``deepseek_r1``: the prompt opened ``<think>`` already (DeepSeek-R1, Qwen3 thinking-2507 templates): everything
  up to ``</think>`` is thinking; a reply with no ``</think>`` is all thinking (the budget ended it first).
- ``openai_gptoss``: harmony's ``analysis`` channel (gpt-oss): each analysis message is thinking, the rest of the
  reply is left for the tool-call parser (``openai``) or as content.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from langgraph_art.serve.parsers.tool_calls import Harmony


class ReasoningParser:
    """The base of every reasoning parser: ``split`` returns ``(thinking or None, the rest of the text)``."""

    name: ClassVar[str] = ""
    kept_tokens: ClassVar[tuple[str, ...]] = ()
    opens: ClassVar[str] = ""  # what a thinking block begins with: streamed content waits while a reply may open one

    def split(self, text: str) -> tuple[str | None, str]:  # pragma: no cover - every parser has one
        raise NotImplementedError


class Qwen3(ReasoningParser):
    name = "qwen3"
    START, END = "<think>", "</think>"
    kept_tokens = (START, END)
    opens = START
    prompt_opens = False  # True: the generation prompt opened <think>, so a reply starts inside its thinking

    def split(self, text: str) -> tuple[str | None, str]:
        stripped = text.lstrip()
        if stripped.startswith(self.START):
            stripped = stripped[len(self.START) :]
        elif not self.prompt_opens:
            return None, text
        thinking, closed, rest = stripped.partition(self.END)
        return thinking.strip("\n"), rest.lstrip("\n") if closed else ""


class DeepSeekR1(Qwen3):
    name = "deepseek_r1"
    prompt_opens = True


class GptOss(ReasoningParser):
    name = "openai_gptoss"
    kept_tokens = Harmony.kept_tokens
    _harmony = Harmony()

    def split(self, text: str) -> tuple[str | None, str]:
        thinking, kept = [], []
        for header, body, start, end in self._harmony.messages(text):
            if self._harmony.channel(header) == "analysis":
                thinking.append(body)
            else:
                kept.append(text[start:end])
        if not thinking:
            return None, text
        return "\n".join(thinking), "".join(kept)


REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    parser.name: parser for parser in (Qwen3, DeepSeekR1, GptOss)
}
