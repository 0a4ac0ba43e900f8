"""The HF engine's prefix cache: the trie and its budget by hand, then the engine with the cache against the engine
without it on agent-shaped traffic (turns that continue each other, groups of runs, a hot reload, a grammar, seeds,
a budget small enough to evict): the same tokens, logprobs within the suite's 1e-4, less prefilled."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.errors import ConfigError  # noqa: E402
from langgraph_art.serve.engines.base import GenerationRequest, GenerationResult, SamplingParams  # noqa: E402
from langgraph_art.serve.engines.hf import steps  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from langgraph_art.serve.engines.hf.prefix_cache import PrefixCache  # noqa: E402
from tests.helpers import WEATHER_TOOL, assert_same_samples  # noqa: E402
from tests.test_fast_decode import save_adapter  # noqa: E402


# -- the trie, by hand (blocks of 2 tokens; "KV" [1 layer, 1 head, tokens, 1]: each token's own id) -------------
def kv_of(tokens: list[int], asked: list[tuple[int, int]] | None = None) -> Any:
    def kv(start: int, stop: int) -> tuple[Any, Any]:
        if asked is not None:
            asked.append((start, stop))
        column = torch.tensor(tokens[start:stop], dtype=torch.float32).view(1, 1, -1, 1)
        return column, -column

    return kv


def ids_of(cache: PrefixCache, policy: int, prompt: list[int], limit: int | None = None) -> list[int]:
    hit = cache.lookup(policy, prompt, limit)
    if not hit.length:
        return []
    keys = torch.cat([k for k, _ in hit.blocks], dim=2)[0, 0, : hit.length, 0]
    return [int(x) for x in keys]


BLOCK_BYTES = 2 * 2 * 4  # keys and values of a 2-token block, float32


def test_the_longest_cached_prefix_in_whole_blocks_under_its_own_policy() -> None:
    cache = PrefixCache(budget_bytes=10_000, block_size=2)
    asked: list[tuple[int, int]] = []
    cache.insert(0, [1, 2, 3, 4, 5], kv_of([1, 2, 3, 4, 5], asked))
    assert asked == [(0, 2), (2, 4)]  # whole blocks only: token 5 waits for its block to fill
    assert ids_of(cache, 0, [1, 2, 3, 4, 9, 9]) == [1, 2, 3, 4]
    assert ids_of(cache, 0, [1, 2, 3, 9]) == [1, 2]  # the second block differs
    assert ids_of(cache, 0, [1, 2, 3, 4], limit=3) == [1, 2, 3]  # cut inside a block: the prompt keeps a token
    assert ids_of(cache, 1, [1, 2, 3, 4, 5]) == []  # another policy's weights: never this KV
    assert ids_of(cache, 0, [2, 1, 3, 4]) == []
    asked.clear()
    cache.insert(0, [1, 2, 3, 4, 6, 7], kv_of([1, 2, 3, 4, 6, 7], asked))
    assert asked == [(4, 6)]  # the blocks it shares with the first are held once
    assert cache.blocks == 3 and cache.bytes == 3 * BLOCK_BYTES
    stats = cache.stats()
    assert stats["prefix_cache_queries"] == 6 + 4 + 4 + 5 + 4 and stats["prefix_cache_hits"] == 4 + 2 + 3


def test_past_the_budget_the_least_recently_used_blocks_go_children_first() -> None:
    cache = PrefixCache(budget_bytes=4 * BLOCK_BYTES, block_size=2)
    cache.insert(0, [1, 2, 3, 4], kv_of([1, 2, 3, 4]))  # A=(1,2) -> B=(3,4)
    cache.insert(0, [5, 6], kv_of([5, 6]))  # C
    cache.insert(0, [1, 2, 7, 8], kv_of([1, 2, 7, 8]))  # D under A; A touched
    assert cache.blocks == 4 and cache.evictions == 0
    assert ids_of(cache, 0, [5, 6, 0]) == [5, 6]  # C is now the most recently used
    cache.insert(0, [9, 9], kv_of([9, 9]))  # one over: B (least recent) goes, not A, which D still needs
    assert cache.evictions == 1 and cache.blocks == 4 and cache.bytes == 4 * BLOCK_BYTES
    assert ids_of(cache, 0, [1, 2, 3, 4, 0]) == [1, 2] and ids_of(cache, 0, [1, 2, 7, 8, 0]) == [1, 2, 7, 8]
    cache.insert(1, [1, 2, 3, 4, 5, 6], kv_of([1, 2, 3, 4, 5, 6]))  # 3 blocks of another policy: 3 more go
    assert cache.bytes <= cache.budget_bytes and cache.evictions == 4
    assert ids_of(cache, 1, [1, 2, 3, 4, 5, 6, 0]) == [1, 2, 3, 4, 5, 6]
    cache.retain({0})
    assert ids_of(cache, 1, [1, 2, 3, 4, 5, 6, 0]) == []
    cache.clear()
    assert cache.blocks == 0 and cache.bytes == 0


def test_a_zero_budget_keeps_nothing_and_bad_sizes_say_what_to_change() -> None:
    cache = PrefixCache(budget_bytes=0, block_size=2)
    cache.insert(0, [1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    assert cache.blocks == 0 and ids_of(cache, 0, [1, 2, 3, 4, 5]) == []
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(budget_bytes=-1)
    with pytest.raises(ConfigError, match="prefix_cache_gib"):
        HFEngine("tiny", prefix_cache_gib=-1.0)


# -- the engine, cache on against cache off ----------------------------------------------------------------------
@pytest.fixture(params=["short-prompts", "shared-head"])
async def pair(
    request: pytest.FixtureRequest, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[HFEngine, HFEngine]]:
    """The engine with the cache and without it; under "shared-head" the rows of a batch that begin with the same 8
    tokens share them as the batch's head (the tests' prompts are shorter than the 256 it takes by default), so a
    joiner's next turn is prefilled after the head with the cache on, and in full with it off."""
    if request.param == "shared-head":
        monkeypatch.setattr(steps, "MIN_SHARED_HEAD", 8)
    on = HFEngine(str(tiny_path), max_batch_size=16)
    off = HFEngine(str(tiny_path), max_batch_size=16, enable_prefix_caching=False)
    for engine in (on, off):
        await engine.start()
    assert on.prefix_cache is not None and off.prefix_cache is None and on._fast is not None
    yield on, off
    for engine in (on, off):
        await engine.close()


def render(engine: HFEngine, messages: list[dict[str, Any]]) -> list[int]:
    return list(
        engine.tokenizer.apply_chat_template(
            messages, tools=[WEATHER_TOOL], add_generation_prompt=True, return_dict=False
        )
    )


async def both(on: HFEngine, off: HFEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    """Each request on both engines (each engine's concurrently: batches, joins); asserts they sample the same."""
    got = await asyncio.gather(*(on.generate(copy.deepcopy(r)) for r in requests))
    want = await asyncio.gather(*(off.generate(copy.deepcopy(r)) for r in requests))
    assert_same_samples(got, want)
    return got


async def agent_turns(on: HFEngine, off: HFEngine, turns: int = 3, adapter: str | None = None) -> None:
    """A group of 4 runs (n=2 each, seeded, and one greedy) over ``turns`` turns of a tool loop: each turn's prompt
    is the last one's, the model's reply and a tool result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
    for turn in range(turns):
        ids = render(on, messages)
        requests = [
            GenerationRequest(ids, SamplingParams(temperature=1.0, max_tokens=12, n=2, seed=10 * turn + i), adapter)
            for i in range(4)
        ] + [GenerationRequest(ids, SamplingParams(temperature=0.0, max_tokens=12), adapter)]
        results = await both(on, off, requests)
        reply = results[0].samples[0].text
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "tool", "content": f'{{"city": "Rome", "sky": "clear", "turn": {turn}}}'},
        ]


async def test_an_agent_loop_samples_the_same_with_the_cache_and_prefills_less(
    pair: tuple[HFEngine, HFEngine],
) -> None:
    on, off = pair
    await agent_turns(on, off)
    got, want = on.stats(), off.stats()
    assert got["prompt_tokens"] == want["prompt_tokens"] > 0
    assert got["prefix_cache_hits"] > 0 and got["prefix_cache_blocks"] > 0 and got["prefix_cache_bytes"] > 0
    # every prompt token looked up was either found or computed (identical prompts in one batch: looked up once)
    assert got["prefill_tokens"] + got["prefix_cache_hits"] == got["prefix_cache_queries"] <= got["prompt_tokens"]
    assert got["prefill_tokens"] < 0.5 * want["prefill_tokens"], (got, want)
    assert want["prefix_cache_queries"] == want["prefix_cache_hits"] == 0


async def test_a_budget_that_evicts_changes_what_is_computed_never_what_is_sampled(tiny_path: Path) -> None:
    small = HFEngine(str(tiny_path), max_batch_size=16, prefix_cache_gib=40_000 / 2**30)  # a few blocks
    off = HFEngine(str(tiny_path), max_batch_size=16, enable_prefix_caching=False)
    for engine in (small, off):
        await engine.start()
    try:
        await agent_turns(small, off)
        stats = small.stats()
        assert stats["prefix_cache_evictions"] > 0 and stats["prefix_cache_bytes"] <= 40_000
        assert stats["prefix_cache_hits"] > 0
    finally:
        for engine in (small, off):
            await engine.close()


async def test_a_checkpoint_reloaded_under_its_name_never_hits_the_old_kv(
    pair: tuple[HFEngine, HFEngine], tiny_path: Path, tmp_path: Path
) -> None:
    on, off = pair
    first, second = save_adapter(tiny_path, tmp_path / "a", seed=1), save_adapter(tiny_path, tmp_path / "b", seed=2)
    ids = render(on, [{"role": "user", "content": "What is the weather in Oslo today, and tomorrow?"}])
    params = SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=4)
    for engine in (on, off):
        await engine.load_adapter("agent@1", str(first))
    before = await both(on, off, [GenerationRequest(ids, params, adapter="agent@1")])
    await both(on, off, [GenerationRequest(ids, params, adapter="agent@1")])
    assert on.stats()["prefix_cache_hits"] > 0  # the second request reused the first's prompt
    for engine in (on, off):
        await engine.load_adapter("agent@1", str(second))  # the same name, new weights (a hot reload)
    hits = on.stats()["prefix_cache_hits"]
    after = await both(on, off, [GenerationRequest(ids, params, adapter="agent@1")])
    assert on.stats()["prefix_cache_hits"] == hits  # nothing of the old weights' KV was reused
    assert after[0].samples[0].logprobs != before[0].samples[0].logprobs  # and the new weights matter
    assert set(on.prefix_cache._roots) <= on._adapters.keys()  # the replaced adapter's blocks are gone
    await agent_turns(on, off, turns=2, adapter="agent@1")
    for engine in (on, off):
        await engine.load_adapter("agent@2", str(first))  # a new name goes in between steps
        await engine.unload_adapter("agent@1")
    assert set(on.prefix_cache._roots) <= on._adapters.keys()
    await agent_turns(on, off, turns=2, adapter="agent@2")


async def test_grammar_constrained_and_seeded_rows_sample_the_same_with_the_cache(
    pair: tuple[HFEngine, HFEngine],
) -> None:
    from langgraph_art.serve.protocol import ChatCompletionRequest
    from langgraph_art.serve.structured import ToolCallFormat, request_constraint

    on, off = pair
    body = ChatCompletionRequest(
        model="model",
        messages=[{"role": "user", "content": "x"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    constraint = request_constraint(body, ToolCallFormat.probe(on.tokenizer))
    assert constraint is not None
    ids = render(on, [{"role": "user", "content": "Weather in Lima, please, in celsius."}])
    grammar = constraint.grammar
    for _ in range(2):  # the second round hits what the first kept, prompt and sampled call alike
        requests = [
            GenerationRequest(ids, SamplingParams(temperature=1.0, max_tokens=40, n=3, seed=s), grammar=grammar)
            for s in (1, 2)
        ] + [GenerationRequest(ids, SamplingParams(temperature=0.7, max_tokens=16, seed=5))]
        await both(on, off, requests)
    assert on.stats()["prefix_cache_hits"] > 0


# -- in training: each step's record and the server's /metrics -------------------------------------------------------
def two_turn_graph(llm: Any) -> Any:
    """The model answers, then is asked again with its answer in the conversation: the second prompt continues the
    first, as an agent's next turn does."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def first(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def second(state: MessagesState) -> dict[str, Any]:
        follow_up = HumanMessage("Now say it again, but shorter please.")
        return {"messages": [follow_up, llm.invoke([*state["messages"], follow_up])]}

    graph = StateGraph(MessagesState)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    return graph.compile()


def test_each_step_records_what_the_cache_saved_and_the_server_exports_it(tmp_path: Path) -> None:
    import httpx

    import langgraph_art as art
    from langgraph_art.serve.app import read_prometheus_text
    from langgraph_art.testing import digit_share

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="twice", project="prefix").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=12)
        config = art.GRPOConfig(learning_rate=1e-3, seed=0)
        scenarios = [{"id": "q", "input": {"messages": [("user", "Write a few numbers, then some words.")]}}]
        trainer = art.Trainer(two_turn_graph(llm), model, rewards=[art.reward(digit_share, name="digits")],
                              num_generations=4, config=config)  # fmt: skip
        history = trainer.train(scenarios, steps=2, progress=False)
        for metrics in history:
            assert metrics["engine/prompt_tokens"] > metrics["engine/prefill_tokens"] > 0, metrics
            assert 0 < metrics["engine/prefix_cache_hit_rate"] <= 1 and metrics["engine/prefix_cache_bytes"] > 0
            # where the rollout's time went: the engine's prefill and decode seconds, within the rollout's own
            assert min(metrics["engine/prefill_s"], metrics["engine/decode_s"]) > 0, metrics
            assert metrics["engine/prefill_s"] + metrics["engine/decode_s"] <= metrics["time/rollout_s"], metrics
        root = backend.server(model.base_model).base_url.removesuffix("/v1")
        exported = read_prometheus_text(httpx.get(f"{root}/metrics", timeout=10).text)
    assert exported["prefix_cache_hits"] > 0 and exported["prompt_tokens"] >= sum(
        m["engine/prompt_tokens"] for m in history
    )
    assert set(exported) >= {"prefill_tokens", "prefix_cache_queries", "prefix_cache_bytes", "prefix_cache_evictions"}
    assert exported["decode_seconds"] >= sum(m["engine/decode_s"] for m in history) > 0  # seconds, not truncated
