"""An earlier answer sent back with its sampled ``token_ids`` is continued as sampled in the next prompt
(``serve/continuation.py``): on each family's template, against a template that rewrites earlier turns, and through
the route (bad ids refused, counts in ``/metrics``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import transformers

from langgraph_art.errors import RequestError
from langgraph_art.serve.chat import PromptCache, render_prompt
from langgraph_art.serve.continuation import check_sampled, continue_sampled, render_text
from tests.family_templates import FAMILIES, Family, family_tokenizer

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a project up.",
          "parameters": {"type": "object", "properties": {"project": {"type": "string"}}}}}]  # fmt: skip
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": {"project": "Onyx"}}}


def conversation(family: Family) -> list[dict[str, Any]]:
    call = {**CALL, "id": "abcdefghi"} if family.name == "mistral" else CALL  # Mistral's template checks 9 chars
    return [
        {"role": "user", "content": "Who owns Onyx?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"owner": "Mara"}', "tool_call_id": call["id"]},
    ]


@pytest.fixture(scope="module")
def base_tokenizer() -> Any:
    from langgraph_art.models.tiny import tiny_model

    return transformers.AutoTokenizer.from_pretrained(tiny_model())


def end_token(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The last special token of the template's rendering of the answer (messages[1])."""
    answer = render_text(tokenizer, messages[:2], TOOLS, None, False)[
        len(render_text(tokenizer, messages[:1], TOOLS, None, True)) :
    ]
    found = [(answer.rfind(t), t) for t in tokenizer.all_special_tokens if t and answer.rfind(t) >= 0]
    return max(found)[1]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_next_prompt_continues_the_sampled_ids_on_every_family(base_tokenizer: Any, family: Family) -> None:
    """The answer was sampled as a fenced call (not the family's format): the next prompt is the earlier prompt,
    then exactly those ids, then the template's text after its own rendering of the answer (tool result, generation
    prompt); the template's own prompt does not start with the earlier prompt and answer."""
    tokenizer = family_tokenizer(base_tokenizer, family)
    messages = conversation(family)
    first = render_prompt(tokenizer, messages[:1], TOOLS)
    end = end_token(tokenizer, messages)
    written = '```json\n{"name": "lookup", "arguments": {"project": "Onyx"}}\n```'
    sampled = tokenizer(written, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids(end)]
    prompt = continue_sampled(tokenizer, messages, TOOLS, None, {1: sampled})
    assert prompt is not None, family.name
    assert prompt[: len(first) + len(sampled)] == first + sampled
    full = render_text(tokenizer, messages, TOOLS, None, True)
    upto = render_text(tokenizer, messages[:2], TOOLS, None, False)
    trailer = upto[upto.rfind(end) + len(end) :]
    assert tokenizer.decode(prompt[len(first) + len(sampled) :]) == trailer + full[len(upto) :]
    rendered = render_prompt(tokenizer, messages, TOOLS)
    assert rendered[: len(first) + len(sampled)] != first + sampled  # re-rendered, the turns would not join


def test_an_answer_cut_short_is_closed_as_the_template_closes_it(base_tokenizer: Any) -> None:
    """Sampled ids that do not end on a special token (max_tokens, a stop string) get the template's end of turn."""
    family = FAMILIES[0]
    tokenizer = family_tokenizer(base_tokenizer, family)
    messages = conversation(family)
    first = render_prompt(tokenizer, messages[:1], TOOLS)
    cut = tokenizer('{"name": "lookup", "argu', add_special_tokens=False)["input_ids"]
    prompt = continue_sampled(tokenizer, messages, TOOLS, None, {1: cut})
    assert prompt is not None
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert prompt[: len(first) + len(cut) + 1] == first + cut + [end]


def test_two_sampled_answers_are_both_continued(base_tokenizer: Any) -> None:
    tokenizer = family_tokenizer(base_tokenizer, FAMILIES[0])
    messages = conversation(FAMILIES[0])
    messages += [messages[1], {**messages[2], "content": '{"status": "ok"}'}]
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    one = tokenizer("call one", add_special_tokens=False)["input_ids"] + end
    two = tokenizer("call two", add_special_tokens=False)["input_ids"] + end
    prompt = continue_sampled(tokenizer, messages, TOOLS, None, {1: one, 3: two})
    assert prompt is not None
    second = continue_sampled(tokenizer, messages[:3], TOOLS, None, {1: one})
    assert second is not None and prompt[: len(second) + len(two)] == second + two  # the third turn continues both
    assert tokenizer.decode(prompt).count("call one") == 1 and "<tool_call>" not in tokenizer.decode(prompt)


def test_a_template_that_rewrites_earlier_turns_gets_its_own_prompt_counted(base_tokenizer: Any) -> None:
    """A template that renders an earlier answer differently once later messages follow (here: only the last
    answer keeps its text) is not a continuation: the template's own prompt, counted as rerendered."""
    tokenizer = family_tokenizer(base_tokenizer, FAMILIES[0])
    tokenizer.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}{{- '<|im_start|>assistant\\n"
        "(earlier)<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or 'call') + "
        "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- endif %}"
    )
    messages = conversation(FAMILIES[0])
    sampled = tokenizer("call", add_special_tokens=False)["input_ids"]
    assert continue_sampled(tokenizer, messages, TOOLS, None, {1: sampled}) is None
    cache = PromptCache()
    assert cache.render(tokenizer, messages, TOOLS, None, {1: sampled}) == render_prompt(tokenizer, messages, TOOLS)
    assert cache.counts == {"prompts_continued": 0, "prompts_rerendered": 1}
    cache.render(tokenizer, messages, TOOLS, None, {1: sampled})  # remembered: rendered and counted once
    assert cache.counts["prompts_rerendered"] == 1


def test_ids_on_another_role_or_outside_the_vocabulary_are_refused() -> None:
    with pytest.raises(RequestError, match="only assistant messages carry token_ids") as caught:
        check_sampled({0: [1, 2]}, ["user", "assistant"], 100)
    assert caught.value.param == "messages[0].token_ids"
    with pytest.raises(RequestError, match="token id 100 is not in this model's vocabulary of 100"):
        check_sampled({1: [1, 100]}, ["user", "assistant"], 100)


async def test_the_route_continues_sampled_ids_and_counts_it(server: Any) -> None:
    """Over HTTP: a second call that sends the first answer back with its ids gets a prompt that starts with the
    first prompt and those ids (``prompt_token_ids``), ``/metrics`` counts it; ids on a user message are a 400."""
    import httpx

    base = server.base_url
    async with httpx.AsyncClient(timeout=60) as client:
        question = [{"role": "user", "content": "hi"}]
        body = {"model": "tiny", "messages": question, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
        first = (await client.post(f"{base}/chat/completions", json=body)).json()
        answer = first["choices"][0]
        sent_back = {"role": "assistant", "content": answer["message"]["content"], "token_ids": answer["token_ids"]}
        follow = [*question, sent_back, {"role": "user", "content": "and?"}]
        second = (await client.post(f"{base}/chat/completions", json={**body, "messages": follow})).json()
        joined = first["prompt_token_ids"] + answer["token_ids"]
        assert second["prompt_token_ids"][: len(joined)] == joined
        metrics = (await client.get(base.removesuffix("/v1") + "/metrics")).text
        counted = next(line for line in metrics.splitlines() if line.startswith("langgraph_art:prompts_continued"))
        assert float(counted.split()[-1]) >= 1, counted
        bad = [{"role": "user", "content": "hi", "token_ids": [1]}]
        refused = await client.post(f"{base}/chat/completions", json={**body, "messages": bad})
        assert refused.status_code == 400 and "messages[0].token_ids" in json.dumps(refused.json())


def test_chat_art_sends_back_the_ids_of_its_own_model_s_answers_only() -> None:
    """With ``resend_token_ids=True``, an answer of this served model (any checkpoint) goes back with its ids;
    another model's answer, a message without ids, or ``resend_token_ids=False`` (the default) sends text only."""
    from langchain_core.messages import AIMessage, HumanMessage

    from langgraph_art.capture.chat_model import PROVIDER, ChatART

    def answer(model_name: str) -> AIMessage:
        logprobs = {"content": [{"token": "a", "logprob": -0.1, "token_id": 5}, {"token": "b", "logprob": -0.2,
                                                                                  "token_id": 7}]}  # fmt: skip
        meta = {"model_provider": PROVIDER, "model_name": model_name, "logprobs": logprobs}
        return AIMessage(content="ab", response_metadata=meta)

    def sent(llm: ChatART, message: AIMessage) -> Any:
        payload = llm._get_request_payload([HumanMessage("q"), message, HumanMessage("more")])
        return payload["messages"][1].get("token_ids")

    llm = ChatART(model="team/agent", base_url="http://127.0.0.1:9/v1", api_key="k", resend_token_ids=True)
    assert sent(llm, answer("team/agent@3")) == [5, 7]
    assert sent(llm.with_step(2), answer("team/agent")) == [5, 7]
    assert sent(llm, answer("team/judge")) is None
    assert sent(llm, AIMessage(content="ab")) is None
    assert sent(llm.model_copy(update={"resend_token_ids": False}), answer("team/agent")) is None
    assert (
        sent(ChatART(model="team/agent", base_url="http://127.0.0.1:9/v1", api_key="k"), answer("team/agent")) is None
    )
