"""Prompts that continue what was sampled: an earlier answer sent back with its ``token_ids`` is written into the next
prompt as those tokens, not as the chat template renders the message.

Why: a model's own writing of a call and its template's rendering of it differ (Qwen2.5-Coder writes a fenced JSON
object; its template renders ``<tool_call>`` tags). Re-rendered, the next prompt does not start with the earlier
prompt and answer, so the trainer cannot join the two turns: each is trained as its own sequence and the second one
forwards the whole conversation again. With the sampled tokens in
the prompt the model sees what it wrote, and the turns of a run train as one sequence, on the tokens sampled.

How, for an assistant message ``i`` with ids (text from the template, ids from the sampler)::

    before_i = render(messages[:i], generation prompt)     # the prompt that answer was sampled after
    with_i   = render(messages[:i + 1])                    # ... and the template's rendering of the answer
    full     = render(messages, generation prompt)         # the prompt the template would give
    prompt   = tokens(full[:len(before_i)]) + ids_i + [end of turn, if ids_i lack it]
               + tokens(trailer_i + full[len(with_i):len(before_next)]) + ...

``trailer_i``: what the template writes after the answer's end-of-turn token (Qwen: a newline). This needs a
template whose rendering of a conversation starts with its rendering of every earlier part of it; one that rewrites
earlier messages (dropping an earlier turn's thinking, say) gets the template's own prompt instead, counted as
``prompts_rerendered`` and warned about once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_art.errors import RequestError


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False,
        **(template_kwargs or {}),
    )  # fmt: skip
    return str(text)


def check_sampled(sampled: Mapping[int, Sequence[int]], roles: Sequence[str], vocabulary: int) -> None:
    """Ids only on assistant messages, each one an id of this model's vocabulary; a ``RequestError`` says where."""
    for index, ids in sampled.items():
        where = f"messages[{index}].token_ids"
        if roles[index] != "assistant":
            raise RequestError("only assistant messages carry token_ids (the ids sampled for that answer)", where)
        bad = next((t for t in ids if not 0 <= t < vocabulary), None)
        if bad is not None:
            raise RequestError(
                f"token id {bad} is not in this model's vocabulary of {vocabulary}: send the ids this model "
                "returned for that answer, or none (the message is then rendered by the chat template)",
                where,
            )


def continue_sampled(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    sampled: Mapping[int, Sequence[int]],
) -> list[int] | None:
    """The prompt ids with each answer in ``sampled`` (message index -> its sampled ids) written as sampled; None
    where the template does not render the conversation as a continuation of its parts (use its own prompt).

    An answer's end of turn is the last special token in the template's rendering of it (``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``); sampled ids that end on a special token (the sampler stopped on one) are not closed
    again, others (cut by ``max_tokens`` or a stop string) get that token after them, as the template would write."""

    def tokens(text: str) -> list[int]:
        return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]

    full = render_text(tokenizer, messages, tools, template_kwargs, True)
    ends = {text: int(tokenizer.convert_tokens_to_ids(text)) for text in tokenizer.all_special_tokens if text}
    special = set(tokenizer.all_special_ids)
    prompt: list[int] = []
    done = 0  # how much of ``full`` is in ``prompt``
    carry = ""  # text to put before the next piece of ``full`` (the trailer after an answer's end of turn)
    for index in sorted(sampled):
        before = render_text(tokenizer, messages[:index], tools, template_kwargs, True)
        upto = render_text(tokenizer, messages[: index + 1], tools, template_kwargs, False)
        if not (upto.startswith(before) and full.startswith(upto) and len(before) >= done):
            return None
        prompt += tokens(carry + full[done : len(before)])
        answer = upto[len(before) :]  # the template's rendering of the answer, its end of turn and trailer
        found = max(((answer.rfind(text), text) for text in ends if text), default=(-1, ""))
        ids = list(sampled[index])
        prompt += ids
        carry = ""
        if found[0] >= 0:
            position, text = found
            if not ids or ids[-1] not in special:
                prompt.append(ends[text])  # the answer was cut (a stop string, max_tokens): close it as rendered
            carry = answer[position + len(text) :]
        done = len(upto)
    return prompt + tokens(carry + full[done:])
