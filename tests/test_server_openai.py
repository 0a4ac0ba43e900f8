"""The HTTP service through real clients: the official ``openai`` SDK and LangChain's ``ChatOpenAI``."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")

from langgraph_art.serve.app import CALL_ID_HEADER  # noqa: E402
from tests.helpers import WEATHER_PROMPTS, WEATHER_TOOL  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def assert_ids_decode_to_text(tokenizer, entries: list, text: str) -> None:
    ids = [e.token_id if hasattr(e, "token_id") else e["token_id"] for e in entries]
    logprobs = [e.logprob if hasattr(e, "logprob") else e["logprob"] for e in entries]
    assert len(ids) == len(logprobs) > 0 and all(lp <= 0 for lp in logprobs)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_plain_chat_n2_every_token_has_id_and_logprob(client, tokenizer) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}],
        max_tokens=12,
        n=2,
        logprobs=True,
        top_logprobs=3,
        seed=5,
    )
    assert len(raw.headers[CALL_ID_HEADER]) == 32
    response = raw.parse()
    assert response.id == f"chatcmpl-{raw.headers[CALL_ID_HEADER]}"
    assert len(response.choices) == 2 and response.usage.completion_tokens == 24
    for choice in response.choices:
        assert choice.finish_reason == "length"
        assert_ids_decode_to_text(tokenizer, choice.logprobs.content, choice.message.content)
        for entry in choice.logprobs.content:
            assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
            assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_tool_call_through_adapter(client, tokenizer) -> None:
    response = client.chat.completions.create(
        model="weather@1",
        messages=[{"role": "user", "content": WEATHER_PROMPTS[0]}],
        tools=[WEATHER_TOOL],
        temperature=0,
        max_completion_tokens=64,
        logprobs=True,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    ids = [e.token_id for e in choice.logprobs.content]
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_model_without_step_routes_to_latest_adapter(client) -> None:
    response = client.chat.completions.create(
        model="weather",
        messages=[{"role": "user", "content": WEATHER_PROMPTS[0]}],
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=64,
    )
    assert response.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_text_unparsed(client) -> None:
    response = client.chat.completions.create(
        model="weather@1",
        messages=[{"role": "user", "content": WEATHER_PROMPTS[0]}],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        temperature=0,
        max_tokens=64,
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content.startswith("<tool_call>")


def test_streaming_text_logprobs_and_usage(client, tokenizer) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=10,
        n=2,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        seed=1,
    )
    text, entries, finish, usage = {0: "", 1: ""}, {0: [], 1: []}, {}, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.logprobs:
                entries[choice.index] += choice.logprobs.content
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert finish == {0: "length", 1: "length"} and usage.completion_tokens == 20
    for i in (0, 1):
        assert len(entries[i]) == 10
        assert_ids_decode_to_text(tokenizer, entries[i], text[i])


def test_streaming_tool_call_deltas(client) -> None:
    stream = client.chat.completions.create(
        model="weather@1",
        messages=[{"role": "user", "content": WEATHER_PROMPTS[0]}],
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=64,
        stream=True,
    )
    content, calls, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert content == "" and finish == "tool_calls"  # no '<tool_call>' text leaked into content deltas
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}


def test_langchain_chatopenai_invoke_stream_n_and_tools(server, tokenizer) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=server.base_url,
        api_key="unused",
        model="tiny",
        logprobs=True,
        max_tokens=10,
        use_responses_api=False,
        max_retries=0,
    )
    reply = llm.invoke("hello")
    entries = reply.response_metadata["logprobs"]["content"]
    assert all("token_id" in e for e in entries)  # survives langchain-openai
    assert_ids_decode_to_text(tokenizer, entries, reply.content)

    chunks = list(llm.stream("hello"))
    streamed = sum(chunks[1:], chunks[0])
    assert_ids_decode_to_text(tokenizer, streamed.response_metadata["logprobs"]["content"], streamed.content)

    result = ChatOpenAI(
        base_url=server.base_url, api_key="unused", model="tiny", n=3, max_tokens=5, use_responses_api=False
    ).generate([[HumanMessage("hi")]])
    assert len(result.generations[0]) == 3

    tool_llm = ChatOpenAI(
        base_url=server.base_url,
        api_key="unused",
        model="weather@1",
        temperature=0,
        max_tokens=64,
        use_responses_api=False,
    ).bind_tools([WEATHER_TOOL])
    message = tool_llm.invoke(WEATHER_PROMPTS[0])
    assert message.tool_calls[0]["name"] == "get_weather" and message.tool_calls[0]["args"] == {"city": "Paris"}


def test_models_and_adapters_listing(server) -> None:
    models = httpx.get(f"{server.base_url}/models").json()["data"]
    ids = [m["id"] for m in models]
    assert ids[0] == "tiny" and "weather@1" in ids
    assert next(m for m in models if m["id"] == "weather@1")["parent"] == "tiny"
    health = httpx.get(server.base_url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and "weather@1" in health["adapters"]


def test_adapter_load_unload_over_http(server, tool_adapter) -> None:
    url = f"{server.base_url}/adapters"
    assert httpx.post(url, json={"name": "tmp@7", "path": str(tool_adapter)}).status_code == 200
    body = {"model": "tmp@7", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert httpx.post(f"{server.base_url}/chat/completions", json=body).status_code == 200
    assert httpx.delete(f"{url}/tmp@7").status_code == 200
    gone = httpx.post(f"{server.base_url}/chat/completions", json=body)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"
    missing = httpx.delete(f"{url}/tmp@7")
    assert missing.status_code == 404
    bad = httpx.post(url, json={"name": "tmp@8", "path": "/nonexistent"})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_http_logprobs_match_an_independent_forward_pass(client, tiny_path, tokenizer, temperature) -> None:
    """The logprobs that reach the client equal log_softmax(logits / T) of a separately loaded model."""
    import torch
    from transformers import AutoModelForCausalLM

    messages = [{"role": "user", "content": "check my logprobs"}]
    response = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=20, logprobs=True, temperature=temperature, seed=2, n=2
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    for choice in response.choices:
        ids = [e.token_id for e in choice.logprobs.content]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        ref = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        got = torch.tensor([e.logprob for e in choice.logprobs.content])
        assert (ref - got).abs().max().item() < 1e-4
