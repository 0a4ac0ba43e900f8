"""Tool calls per model family (``serve/parsers``): each family's template (``family_templates.py``) renders calls,
its parser reads them back from the tokens a model would sample (special tokens and all), the grammar made from the
template accepts that rendering, prose that only mentions a tool stays content, ``"auto"`` picks the family's
parser, and ``parallel_tool_calls=False`` leaves one call, streamed or not, under ``"auto"`` and ``"required"``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from langgraph_art.errors import ConfigError, RequestError
from langgraph_art.serve.engines.base import FinishedEvent, GenerationRequest, GenerationResult, Sample, TokenEvent
from langgraph_art.serve.parsers import register_tool_call_parser, tool_call_parser
from langgraph_art.serve.parsers.auto import detect_reasoning_parser, detect_tool_call_parser
from langgraph_art.serve.parsers.reply import ReplyReader
from langgraph_art.serve.parsers.tool_calls import ParsedCall, ParsedReply, ToolCallParser
from langgraph_art.serve.protocol import ChatCompletionRequest
from langgraph_art.serve.structured import ToolCallFormat, request_constraint
from tests.family_templates import FAMILIES, Family, family_tokenizer

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}
LOOKUP_PARAMETERS = {"type": "object", "properties": {"project": {"type": "string"}}, "required": ["project"]}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP_PARAMETERS}}
NAMES = ["get_weather", "lookup"]
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("lookup", {"project": "Onyx Forge"})]
PROSE = 'You could call get_weather for Paris, or lookup("Onyx Forge"); I will answer directly: it is sunny.'


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family(request: Any, tokenizer: Any) -> tuple[Family, Any]:
    return request.param, family_tokenizer(tokenizer, request.param)


def rendered_reply(tokenizer: Any, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """What the template writes for an assistant turn of ``calls``, after its generation prompt."""
    user = [{"role": "user", "content": "Weather in Paris, and who owns Onyx Forge?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}  # fmt: skip
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    text = tokenizer.apply_chat_template([*user, turn], tokenize=False)
    assert text.startswith(prompt)
    return text[len(prompt) :]


def sample_of(tokenizer: Any, text: str) -> Sample:
    """A sample whose tokens are ``text`` (special tokens as tokens), as an engine would return it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Sample(0, ids, [-0.5] * len(ids), [[] for _ in ids], tokenizer.decode(ids, skip_special_tokens=True), "stop")


def called(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


@pytest.mark.parametrize("count", [1, 2])
def test_each_parser_reads_back_its_template_s_calls(family: tuple[Family, Any], count: int) -> None:
    spec, tokenizer = family
    if count == 2 and not spec.parallel:
        pytest.skip(f"{spec.name}'s template renders one call a message")
    reader = ReplyReader(tokenizer)
    assert reader.tool_call_parser_name == spec.parser
    reply = reader.read(sample_of(tokenizer, rendered_reply(tokenizer, CALLS[:count])), NAMES)
    assert called(reply.message) == CALLS[:count]
    assert not (reply.message["content"] or "").strip() and reply.unparsed == 0
    assert reply.finish_reason == "tool_calls"
    ids = [c["id"] for c in reply.message["tool_calls"]]
    assert len(set(ids)) == count
    if spec.parser == "mistral":  # the only ids Mistral's template accepts
        assert all(len(i) == 9 and i.isalnum() for i in ids)


def test_prose_that_mentions_a_tool_stays_content(family: tuple[Family, Any]) -> None:
    _, tokenizer = family
    reply = ReplyReader(tokenizer).read(sample_of(tokenizer, PROSE), NAMES)
    assert reply.message["content"] == PROSE and "tool_calls" not in reply.message and reply.unparsed == 0


def test_the_grammar_accepts_the_template_s_own_rendering(family: tuple[Family, Any]) -> None:
    from langgraph_art.models.grammar import Grammars

    spec, tokenizer = family
    calls = ToolCallFormat.probe(tokenizer)
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER, LOOKUP],
                                 tool_choice="required")  # fmt: skip
    assert calls is not None and calls.single == (not spec.parallel)
    assert calls.python == (spec.parser == "pythonic")  # keyword arguments, each value JSON valid against its schema
    constraint = request_constraint(body, calls)
    assert constraint is not None
    grammars = Grammars(tokenizer, vocab_size=len(tokenizer))
    for count in (1, 2) if spec.parallel else (1,):
        reply = rendered_reply(tokenizer, CALLS[:count])
        ending = _turn_end(tokenizer)
        reply = reply[: len(reply) - len(ending)] if ending and reply.endswith(ending) else reply
        ids = [*tokenizer.encode(reply, add_special_tokens=False), grammars.eos]
        assert grammars.replay(constraint.grammar, ids) is not None, (spec.name, count, reply)
    named = {"type": "function", "function": {"name": "lookup"}}
    named_body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER, LOOKUP],
                                       tool_choice=named)  # fmt: skip
    named_constraint = request_constraint(named_body, calls)
    assert named_constraint is not None
    _, closing = grammars.close(named_constraint.grammar, [], 96)
    shortest = tokenizer.decode(closing, skip_special_tokens=False)
    assert (
        ReplyReader(tokenizer).read(sample_of(tokenizer, shortest), NAMES).message["tool_calls"][0]["function"]["name"]
        == "lookup"
    )


def _turn_end(tokenizer: Any) -> str:
    user = [{"role": "user", "content": "x"}]
    plain = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": "ANSWER"}], tokenize=False)
    return plain[plain.find("ANSWER") + len("ANSWER") :]


# -- each parser on what models write ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n{"name": "lookup", "arguments": {"project": "Onyx Forge"}}\n```', [CALLS[1]]),
        ('```\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n```', [CALLS[0]]),
        ('{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}', [CALLS[0]]),
        (
            '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
            '{"name": "lookup", "arguments": {"project": "Onyx Forge"}}]',
            CALLS,
        ),
        ('<tool_call>\n{"name": "lookup", "arguments": {"project": "Onyx Forge"}}\n</tool_call>', [CALLS[1]]),
        ('{"name": "lookup", "parameters": {"project": "Onyx Forge"}}', [CALLS[1]]),
    ],
)
def test_xlam_reads_fences_bare_json_and_tags(text: str, expected: list[Any]) -> None:
    parsed = tool_call_parser("xlam").parse(text, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == expected
    assert parsed.content is None and parsed.unparsed == 0


def test_xlam_keeps_the_text_around_a_call_and_counts_a_call_to_an_unbound_tool() -> None:
    xlam = tool_call_parser("xlam")
    text = 'Let me check.\n```json\n{"name": "lookup", "arguments": {"project": "Onyx Forge"}}\n```\nOne moment.'
    parsed = xlam.parse(text, NAMES)
    assert parsed.content == "Let me check.\n\nOne moment." and len(parsed.calls) == 1
    unbound = '```json\n{"name": "delete_everything", "arguments": {}}\n```'
    parsed = xlam.parse(unbound, NAMES)
    assert parsed.calls == [] and parsed.content == unbound and parsed.unparsed == 1
    broken = '<tool_call>\n{"name": "lookup", "arguments": {"project": "Onyx"\n</tool_call>'
    parsed = xlam.parse(broken, NAMES)
    assert parsed.calls == [] and parsed.unparsed == 1  # one broken block, counted once
    assert xlam.parse('The JSON {"a": [1, 2]} is just data.', NAMES).unparsed == 0


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        (
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
            '{"name": "lookup", "parameters": {"project": "Onyx Forge"}}',
            CALLS,
        ),
        ("pythonic", "[get_weather(city=\"Paris\", days=2), lookup(project='Onyx Forge')]", CALLS),
        ("mistral", '[TOOL_CALLS] [{"name": "lookup", "arguments": {"project": "Onyx Forge"}}]', [CALLS[1]]),
        ("mistral", '[TOOL_CALLS]lookup[ARGS]{"project": "Onyx Forge"}', [CALLS[1]]),
        ("phi4_mini_json", 'functools[{"name": "lookup", "arguments": {"project": "Onyx Forge"}}]', [CALLS[1]]),
        (
            "openai",
            '<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"project": "Onyx Forge"}<|call|>',
            [CALLS[1]],
        ),
        ("hermes", '<tool_call>{"name": "lookup", "arguments": {"project": "Onyx Forge"}}</tool_call>', [CALLS[1]]),
    ],
)
def test_each_family_s_own_way_of_writing_calls(parser: str, text: str, expected: list[Any]) -> None:
    parsed = tool_call_parser(parser).parse(text, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == expected
    assert parsed.content is None and parsed.unparsed == 0


def test_unmarked_formats_read_only_bound_tools_and_marked_ones_count_what_they_cannot_read() -> None:
    assert tool_call_parser("llama3_json").parse('{"name": "other", "parameters": {}}', NAMES).calls == []
    assert tool_call_parser("pythonic").parse("[other(x=1)]", NAMES).calls == []
    assert tool_call_parser("mistral").parse("[TOOL_CALLS] [not json", NAMES).unparsed == 1
    assert tool_call_parser("phi4_mini_json").parse("functools[{oops}]", NAMES).unparsed == 1
    harmony = "<|channel|>commentary to=functions.lookup<|message|>{not json<|call|>"
    assert tool_call_parser("openai").parse(harmony, NAMES).unparsed == 1


def test_harmony_keeps_the_final_channel_as_content_and_thinking_apart() -> None:
    from tests.family_templates import FAMILIES

    spec = next(f for f in FAMILIES if f.name == "gpt-oss")
    import transformers

    tokenizer = family_tokenizer(transformers.AutoTokenizer.from_pretrained(_tiny()), spec)
    text = ("<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is sunny in Paris.<|return|>")  # fmt: skip
    reply = ReplyReader(tokenizer).read(sample_of(tokenizer, text), None)
    assert reply.message["content"] == "It is sunny in Paris."
    assert reply.message["reasoning_content"] == "The user wants the weather."


def _tiny() -> str:
    from langgraph_art.models.loading import resolve_model

    return resolve_model("tiny")


# -- reasoning ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("parser", "text", "thinking", "content"),
    [
        ("qwen3", "<think>\nParis is in France.\n</think>\n\nIt is sunny.", "Paris is in France.", "It is sunny."),
        ("qwen3", "It is sunny.", None, "It is sunny."),  # enable_thinking=False: the prompt closed the block
        ("qwen3", "<think>\nstill thinking when the budget", "still thinking when the budget", ""),
        ("deepseek_r1", "Paris is in France.\n</think>\n\nIt is sunny.", "Paris is in France.", "It is sunny."),
        ("deepseek_r1", "cut before the end", "cut before the end", ""),
    ],
)
def test_thinking_never_lands_in_the_text(parser: str, text: str, thinking: str | None, content: str) -> None:
    from langgraph_art.serve.parsers import reasoning_parser

    assert reasoning_parser(parser).split(text) == (thinking, content)


def test_a_qwen3_reply_with_thinking_and_a_call(tokenizer: Any) -> None:
    spec = next(f for f in FAMILIES if f.name == "qwen3")
    styled = family_tokenizer(tokenizer, spec)
    reader = ReplyReader(styled)
    assert reader.reasoning_parser_name == "qwen3"
    text = ('<think>\nI should look it up.\n</think>\n\n<tool_call>\n{"name": "lookup", "arguments": '
            '{"project": "Onyx Forge"}}\n</tool_call>')  # fmt: skip
    reply = reader.read(sample_of(styled, text), NAMES)
    assert called(reply.message) == [CALLS[1]] and reply.message["content"] is None
    assert reply.message["reasoning_content"] == "I should look it up."


def test_chat_template_kwargs_reach_the_template(tokenizer: Any) -> None:
    from langgraph_art.serve.chat import PromptCache, render_prompt

    styled = family_tokenizer(tokenizer, next(f for f in FAMILIES if f.name == "qwen3"))
    messages = [{"role": "user", "content": "hi"}]
    thinking, plain = render_prompt(styled, messages, None), render_prompt(styled, messages, None,
                                                                            {"enable_thinking": False})  # fmt: skip
    assert thinking != plain and styled.decode(plain).endswith("<think>\n\n</think>\n\n")
    cache = PromptCache()
    assert cache.render(styled, messages, None, {"enable_thinking": False}) == plain
    assert cache.render(styled, messages, None) == thinking  # a different key, not the cached other
    with pytest.raises(RequestError, match="chat_template_kwargs may not set"):
        ChatCompletionRequest(model="m", messages=messages, chat_template_kwargs={"tools": []}).check_supported()


# -- choosing and registering -------------------------------------------------------------------------------------
def test_auto_names_its_choice_and_an_unknown_name_says_what_there_is(tokenizer: Any) -> None:
    assert detect_tool_call_parser(tokenizer)[0] == "xlam"  # the tiny model's ChatML template writes <tool_call>
    assert detect_reasoning_parser(tokenizer)[0] is None
    with pytest.raises(ConfigError, match=r"registered: .*'hermes'"):
        tool_call_parser("hermes2")


def test_a_parser_of_your_own_is_registered_by_name() -> None:
    @register_tool_call_parser("test_pipe")
    class Pipe(ToolCallParser):
        """``CALL name|{json}``."""

        name = "test_pipe"
        markers = ("CALL ",)

        def parse(self, text: str, tools: Any) -> ParsedReply:
            if not text.startswith("CALL "):
                return ParsedReply(text)
            name, _, arguments = text[5:].partition("|")
            return ParsedReply(None, [ParsedCall(name, arguments, 0, len(text))])

    parsed = tool_call_parser("test_pipe").parse('CALL lookup|{"project": "x"}', NAMES)
    assert parsed.calls[0].name == "lookup"
    with pytest.raises(ConfigError):
        register_tool_call_parser("auto")


# -- parallel_tool_calls=False through the server ------------------------------------------------------------------
class ScriptedEngine:
    """The tiny model's tokenizer, and every request answered with ``text``'s tokens (then its end token)."""

    def __init__(self, inner: Any, text: str) -> None:
        self.inner, self.text = inner, text
        self.base_model, self.max_model_len = inner.base_model, 4096

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    def _sample(self, index: int) -> Sample:
        tokenizer = self.inner.tokenizer
        ids = [*tokenizer.encode(self.text, add_special_tokens=False), tokenizer.eos_token_id]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return Sample(index, ids, [-0.25 - i / 100 for i in range(len(ids))], [[] for _ in ids], text, "stop")

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        samples = [self._sample(i) for i in range(request.params.n)]
        return GenerationResult(request.request_id, request.prompt_token_ids, samples, None)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Any]:
        result = await self.generate(request)
        for sample in result.samples:
            for token, logprob in zip(sample.token_ids, sample.logprobs, strict=True):
                yield TokenEvent(sample.index, token, logprob, [])
        yield FinishedEvent(result)


TWO_CALLS = ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'
             '```json\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n```')  # fmt: skip


@pytest.fixture(scope="module")
def scripted(tiny_path: Any) -> Any:
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.hf.engine import HFEngine

    with EmbeddedServer(ScriptedEngine(HFEngine(str(tiny_path), served_name="tiny"), TWO_CALLS)) as server:
        yield server


def _ask(server: Any, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris and Tokyo?"}],
            "tools": [WEATHER], "logprobs": True, "return_token_ids": True, **fields}  # fmt: skip
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _streamed(server: Any, **fields: Any) -> tuple[list[int], dict[str, Any]]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris and Tokyo?"}],
            "tools": [WEATHER], "logprobs": True, "stream": True, **fields}  # fmt: skip
    ids: list[int] = []
    calls: list[dict[str, Any]] = []
    content = ""
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            ids += [e["token_id"] for e in (choice.get("logprobs") or {}).get("content") or []]
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
    return ids, {"content": content or None, "tool_calls": calls}


def test_parallel_tool_calls_false_keeps_the_first_call_and_only_its_tokens(scripted: Any) -> None:
    both = _ask(scripted)["choices"][0]
    assert [c["function"]["arguments"] for c in both["message"]["tool_calls"]] == [
        '{"city": "Paris"}', '{"city": "Tokyo"}']  # fmt: skip
    one = _ask(scripted, parallel_tool_calls=False)["choices"][0]
    assert [c["function"]["arguments"] for c in one["message"]["tool_calls"]] == ['{"city": "Paris"}']
    assert one["finish_reason"] == "tool_calls" and one["message"]["content"] is None
    kept = one["token_ids"]
    assert kept == both["token_ids"][: len(kept)] and len(kept) < len(both["token_ids"]) / 2 + 2
    assert [e["logprob"] for e in one["logprobs"]["content"]] == [e["logprob"] for e in both["logprobs"]["content"]][
        : len(kept)
    ]
    text = scripted.engine.tokenizer.decode(kept)
    assert "Paris" in text and "Tokyo" not in text  # what is trained is the call that was executed
    streamed_ids, streamed = _streamed(scripted, parallel_tool_calls=False)
    assert streamed_ids == kept
    assert [c["function"]["arguments"] for c in streamed["tool_calls"]] == ['{"city": "Paris"}']


def test_parallel_tool_calls_false_under_required_makes_one_call(tiny_path: Any) -> None:
    """The tiny model under the grammar: with parallel calls allowed it may write several; with them off, one."""
    from langgraph_art.serve.embedded import EmbeddedServer

    with EmbeddedServer(str(tiny_path), served_name="tiny", seed=3) as server:
        for seed in range(6):
            reply = _ask(server, tool_choice="required", parallel_tool_calls=False, max_tokens=48, seed=seed)
            assert len(reply["choices"][0]["message"]["tool_calls"]) == 1


def test_unparsed_calls_are_counted_in_the_metrics(tiny_path: Any) -> None:
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.hf.engine import HFEngine

    broken = '```json\n{"name": "not_bound", "arguments": {"city": "Paris"}}\n```'
    with EmbeddedServer(ScriptedEngine(HFEngine(str(tiny_path), served_name="tiny"), broken)) as server:
        choice = _ask(server)["choices"][0]
        assert choice["message"]["content"] == broken and choice["unparsed_tool_calls"] == 1
        metrics = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
        assert "langgraph_art:tool_calls_unparsed_total 1.0" in metrics
        models = httpx.get(server.base_url + "/models").json()["data"][0]
        assert models["tool_call_parser"] == "xlam" and models["reasoning_parser"] is None


def test_xlam_closes_a_call_whose_last_brace_the_model_left_out() -> None:
    """Qwen2.5-Coder-0.5B at temperature 0.7 ended 1 in ~20 calls right after its arguments (benchmarks)."""
    xlam = tool_call_parser("xlam")
    for text in ('{"name": "lookup", "arguments": {"project": "Onyx Forge"}',
                 '```json\n{"name": "lookup", "arguments": {"project": "Onyx Forge"}\n```'):  # fmt: skip
        parsed = xlam.parse(text, NAMES)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [CALLS[1]], text
        assert parsed.content is None
    for text in (
        '{"name": "lookup", "arguments": {"project": "Onyx Forge"}) and more',  # something after it
        '{"name": "lookup", "arguments": {"project": "Onyx',
    ):  # the arguments themselves unfinished
        assert xlam.parse(text, NAMES).calls == [], text


def test_parser_names_are_checked_where_they_are_given(tmp_path: Any) -> None:
    import langgraph_art as art
    from langgraph_art.cli import load_plugin

    with pytest.raises(ConfigError, match="no tool-call parser 'hermes2'"):
        art.LocalBackend(home=tmp_path, tool_call_parser="hermes2")
    with pytest.raises(ConfigError, match="no reasoning parser 'r1'"):
        art.LocalBackend(home=tmp_path, reasoning_parser="r1")
    with pytest.raises(ConfigError, match="is not a file"):
        load_plugin(str(tmp_path / "missing.py"))
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from langgraph_art.serve.parsers import register_tool_call_parser\n"
        "from langgraph_art.serve.parsers.tool_calls import Hermes\n"
        "register_tool_call_parser('test_plugin')(type('Mine', (Hermes,), {'name': 'test_plugin'}))\n"
    )
    load_plugin(str(plugin))  # what `langgraph-art serve --tool-parser-plugin plugin.py` runs first
    assert tool_call_parser("test_plugin").name == "test_plugin"
    plugin.write_text("raise RuntimeError('broken plugin')\n")
    with pytest.raises(ConfigError, match=r"plugin\.py' failed: RuntimeError: broken plugin"):
        load_plugin(str(plugin))


def test_a_remote_backend_refuses_parsers_set_on_the_model() -> None:
    import langgraph_art as art

    backend = art.RemoteBackend("http://127.0.0.1:9/v1")
    model = art.TrainableModel(name="m", project="p", tool_call_parser="hermes")
    with pytest.raises(ConfigError, match="--tool-call-parser hermes"):
        backend.register(model)


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris today.",
        'Let me check.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        'A brace { and a fence ``` in prose, then <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call> and after.",
        '```json\n{"name": "not_bound", "arguments": {}}\n```',
    ],
)
def test_the_streamed_message_is_the_non_streamed_one(tiny_path: Any, text: str) -> None:
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.hf.engine import HFEngine

    with EmbeddedServer(ScriptedEngine(HFEngine(str(tiny_path), served_name="tiny"), text)) as server:
        message = _ask(server)["choices"][0]["message"]
        _, streamed = _streamed(server)
    assert streamed["content"] == message["content"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed["tool_calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]


def test_one_call_keeps_the_first_of_two_in_each_family(family: tuple[Family, Any]) -> None:
    """``parallel_tool_calls=False`` under "auto": the reply's tokens up to the end of its first call, read as that
    one call, in every family, list formats included (their list is left open where the first call ends)."""
    spec, tokenizer = family
    if not spec.parallel:
        pytest.skip(f"{spec.name}'s template renders one call a message")
    reader = ReplyReader(tokenizer)
    sample = sample_of(tokenizer, rendered_reply(tokenizer, CALLS))
    one = reader.first_call(sample, NAMES)
    assert one.token_ids == sample.token_ids[: len(one.token_ids)] and len(one.token_ids) < len(sample.token_ids)
    reply = reader.read(one, NAMES)
    assert called(reply.message) == CALLS[:1] and reply.unparsed == 0, tokenizer.decode(one.token_ids)
    assert not (reply.message["content"] or "").strip()


def test_thinking_reaches_langchain_as_a_reasoning_block_never_as_text(tiny_path: Any) -> None:
    """Through ChatART, invoked and streamed: the message's text is the answer, its ``reasoning`` content block the
    thinking, and its sampled tokens all of it (thinking included: trained as sampled)."""
    from langgraph_art.capture.chat_model import ChatART
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.hf.engine import HFEngine

    text = "<think>\nThe user greets me; keep it short.\n</think>\n\nHello there!"
    engine = ScriptedEngine(HFEngine(str(tiny_path), served_name="tiny"), text)
    with EmbeddedServer(engine, reasoning_parser="qwen3") as server:
        llm = ChatART(model="tiny", base_url=server.base_url, max_retries=0)
        chunks = list(llm.stream("hi"))
        streamed = chunks[0]
        for chunk in chunks[1:]:
            streamed += chunk
        for message in (llm.invoke("hi"), streamed):
            assert message.text == "Hello there!"
            reasoning = [b for b in message.content_blocks if b["type"] == "reasoning"]
            assert [b["reasoning"] for b in reasoning] == ["The user greets me; keep it short."]
        sampled = "".join(e["token"] for e in llm.invoke("hi").response_metadata["logprobs"]["content"])
        assert sampled.startswith("<think>") and "Hello there!" in sampled


def test_a_model_s_parsers_serve_its_base_model_and_another_model_cannot_change_them(tmp_path: Any) -> None:
    import langgraph_art as art

    with art.LocalBackend(home=tmp_path) as backend:
        first = art.TrainableModel(name="a", project="p", tool_call_parser="hermes", reasoning_parser="none")
        first.register(backend)
        reader = backend.service("tiny")[0].app.state.chat_completions.reader
        assert (reader.tool_call_parser_name, reader.reasoning_parser_name) == ("hermes", None)
        other = art.TrainableModel(name="b", project="p", tool_call_parser="xlam")
        with pytest.raises(ConfigError, match="another tool_call_parser than model 'b'"):
            other.register(backend)
        art.TrainableModel(name="c", project="p", tool_call_parser="hermes", reasoning_parser="none").register(backend)
