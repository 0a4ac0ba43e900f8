"""Chat <-> tokens around an engine: render prompts, logprob entries, stream text safely (samples become messages
in ``parsers/reply.py``).

Shared by every engine, so prompt ids, tool-call parsing and logprob entries are identical whatever samples.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from langgraph_art.errors import RequestError
from langgraph_art.serve.continuation import check_sampled, continue_sampled
from langgraph_art.serve.parsers.reply import ReplyReader

log = logging.getLogger(__name__)


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant generation header; ``template_kwargs``:
    a request's ``chat_template_kwargs`` (``enable_thinking``, ...), given to the template as variables."""
    try:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False,
            **(template_kwargs or {}),
        )  # fmt: skip
    except Exception as exc:
        raise RequestError(
            f"the messages cannot be rendered with this model's chat template: {exc}", "messages"
        ) from exc
    return [int(i) for i in ids]


class PromptCache:
    """``render_prompt`` remembered for the last ``size`` distinct (messages, tools) of one engine's tokenizer: the
    runs of a GRPO group all send the same first prompt, and rendering the chat template is ~5% of a call's CPU in
    the server. With ``sampled`` (earlier answers' ids, by message index) the prompt continues them
    (``continuation.continue_sampled``); ``counts`` says how often it did and how often the template did not allow
    it (``prompts_continued``, ``prompts_rerendered``: ``GET /metrics``)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._ids: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.counts = {"prompts_continued": 0, "prompts_rerendered": 0}

    def render(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
        sampled: dict[int, list[int]] | None = None,
    ) -> list[int]:
        try:
            key = json.dumps([messages, tools, template_kwargs or {}, sorted((sampled or {}).items())], sort_keys=True)
        except (TypeError, ValueError):  # not plain JSON: render it, do not guess a key
            return self._render(tokenizer, messages, tools, template_kwargs, sampled)
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return list(ids)
        rendered = self._render(tokenizer, messages, tools, template_kwargs, sampled)
        with self._lock:
            self._ids[key] = tuple(rendered)
            while len(self._ids) > self.size:
                self._ids.popitem(last=False)
        return rendered

    def _render(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None,
        sampled: dict[int, list[int]] | None,
    ) -> list[int]:
        if not sampled:
            return render_prompt(tokenizer, messages, tools, template_kwargs)
        check_sampled(sampled, [m["role"] for m in messages], len(tokenizer))
        try:
            ids = continue_sampled(tokenizer, messages, tools, template_kwargs, sampled)
        except Exception as exc:
            raise RequestError(
                f"the messages cannot be rendered with this model's chat template: {exc}", "messages"
            ) from exc
        with self._lock:
            self.counts["prompts_continued" if ids is not None else "prompts_rerendered"] += 1
            first = ids is None and self.counts["prompts_rerendered"] == 1
        if first:
            log.warning(
                "this chat template does not render a conversation as a continuation of its earlier parts: prompts "
                "with earlier answers' token_ids are rendered by the template (their turns train as separate "
                "sequences); counted in /metrics as prompts_rerendered"
            )
        return ids if ids is not None else render_prompt(tokenizer, messages, tools, template_kwargs)


class TokenText:
    """Per-token text and UTF-8 bytes for logprob entries (byte-level BPE aware), cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._byte_of = {ch: b for b, ch in _byte_level_alphabet().items()}
        self._added = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if token_id not in self._added and piece and all(ch in self._byte_of for ch in piece):
            raw = bytes(self._byte_of[ch] for ch in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode())


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies (Qwen, Llama 3, GPT-2)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def logprob_content(
    sample_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    token_text: TokenText,
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries, each also carrying ``token_id`` (kept by langchain-openai)."""
    entries = []
    for token_id, logprob, top in zip(sample_ids, logprobs, tops, strict=True):
        text, raw = token_text(token_id)
        entries.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": raw,
                "token_id": token_id,
                "top_logprobs": [
                    {"token": token_text(i)[0], "logprob": lp, "bytes": token_text(i)[1], "token_id": i}
                    for i, lp in top
                ],
            }
        )
    return entries


class StreamedText:
    """Releases streamed content that can no longer change. Held back: a partial UTF-8 character, a suffix that
    could begin a stop string, anything from where a tool call may begin (sent as tool-call deltas at the end),
    thinking (sent as ``reasoning_content`` at the end), and all of a reply whose format is made of special tokens
    (harmony: its content is known at the end)."""

    def __init__(self, reader: ReplyReader, stops: Sequence[str], tools: bool) -> None:
        self._reader = reader
        self._markers = list(stops) + (list(reader.tool_parser.markers) if tools else [])
        self._hold_all = reader.keeps_tokens
        self._ids: list[int] = []
        self.sent = ""

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        if self._hold_all:
            return ""
        text = self._reader.tokenizer.decode(self._ids, skip_special_tokens=True)
        text = self._reader.visible(text)
        safe = len(text)
        for marker in self._markers:
            found = text.find(marker)
            if found >= 0:
                safe = min(safe, found)
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    safe = min(safe, len(text) - k)
                    break
        while safe > 0 and text[safe - 1] == "\ufffd":
            safe -= 1
        if safe <= len(self.sent):
            return ""
        delta = text[len(self.sent) : safe]
        self.sent = text[:safe]
        return delta

    def rest(self, final_content: str | None) -> str:
        """What is left of the final content after what was already sent."""
        final = final_content or ""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""
