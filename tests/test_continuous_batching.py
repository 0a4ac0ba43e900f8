"""Continuous batching in HFEngine: a request that arrives while a batch decodes joins it at the next step, samples
what it would have sampled alone (and so do the rows already running), and leaves when it is done; another
adapter's request or a command at the head of the queue stops joining, so nothing waits behind a stream of joiners.
Checked on every way the engine runs a batch: FastLM (base and merged adapter), transformers, and unmerged adapters
on shared weights (FastLora, hooks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.serve.engines.base import FinishedEvent, GenerationRequest, SamplingParams  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from langgraph_art.serve.engines.hf.kv_cache import JOIN_MARGIN, FastCache  # noqa: E402
from tests.helpers import WEATHER_TOOL, async_wait_until  # noqa: E402
from tests.test_fast_decode import save_adapter  # noqa: E402

SETTINGS = {
    "fast": {},
    "transformers": {"fast_decode": False},
    "shared-fast": {"share_weights": True},
    "shared-hooks": {"share_weights": True, "fast_decode": False},
}


@pytest.fixture(scope="module")
def adapter(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_adapter(tiny_path, tmp_path_factory.mktemp("joining") / "a", seed=4)


@pytest.fixture(params=list(SETTINGS))
async def engine(request: pytest.FixtureRequest, tiny_path: Path, adapter: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(str(tiny_path), max_batch_size=16, **SETTINGS[request.param])
    await eng.start()
    await eng.load_adapter("a@1", str(adapter))
    yield eng
    await eng.close()


def chat(engine: HFEngine, text: str, tools: list | None = None) -> list[int]:
    template = engine.tokenizer.apply_chat_template
    return list(
        template([{"role": "user", "content": text}], tools=tools, add_generation_prompt=True, return_dict=False)
    )


def request(ids: list[int], tokens: int, seed: int, adapter: str | None, n: int = 1) -> GenerationRequest:
    params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=seed, ignore_eos=True, n=n)
    return GenerationRequest(list(ids), params, adapter=adapter)


async def first_tokens(engine: HFEngine, req: GenerationRequest, count: int) -> tuple[asyncio.Task, asyncio.Event]:
    """Stream ``req`` in a task; the event is set once ``count`` tokens have come back (the batch is decoding)."""
    started = asyncio.Event()

    async def consume() -> Any:
        seen = 0
        async for event in engine.stream(req):
            if isinstance(event, FinishedEvent):
                return event.result
            seen += 1
            if seen >= count:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    return task, started


def queued_commands(engine: HFEngine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The commands (adapter loads, unloads) put in ``engine``'s queue from now on, as they are put."""
    from langgraph_art.serve.engines.hf.schedule import Command

    commands: list[Any] = []
    put = engine._work_queue.put

    def recording(item: Any) -> None:
        put(item)
        if isinstance(item, Command):
            commands.append(item)

    monkeypatch.setattr(engine._work_queue, "put", recording)
    return commands


@pytest.mark.parametrize("adapter_name", [None, "a@1"])
async def test_requests_arriving_mid_batch_join_it_and_sample_as_if_alone(
    engine: HFEngine, adapter_name: str | None
) -> None:
    short, long_prompt = chat(engine, "hi"), chat(engine, "the weather in Paris and the sea", [WEATHER_TOOL])
    assert len(long_prompt) > len(short) + 40  # joining it shifts the running rows' cache to the right
    running = request(short, 96, seed=1, adapter=adapter_name)  # long enough to outlast the joiners anywhere
    joiners = [
        request(long_prompt, 6, seed=7, adapter=adapter_name, n=2),
        request(short, 10, seed=3, adapter=adapter_name),
    ]
    batches, joined = engine.batches_run, engine.requests_joined
    task, _ = await first_tokens(engine, running, 4)
    together = await asyncio.gather(*(engine.generate(j) for j in joiners))
    assert not task.done()  # the joiners finished while the first request was still decoding
    first = await task
    assert engine.batches_run - batches == 1 and engine.requests_joined - joined == 2

    for req, result in zip([running, *joiners], [first, *together], strict=True):
        alone = await engine.generate(GenerationRequest(req.prompt_token_ids, req.params, adapter=req.adapter))
        for sample, reference in zip(result.samples, alone.samples, strict=True):
            assert len(sample.token_ids) == req.params.max_tokens
            assert sample.token_ids == reference.token_ids
            assert max(abs(a - b) for a, b in zip(sample.logprobs, reference.logprobs, strict=True)) < 1e-4


async def test_another_adapters_request_stops_joining_and_runs_next(engine: HFEngine) -> None:
    ids = chat(engine, "hi")
    joined = engine.requests_joined
    task, _ = await first_tokens(engine, request(ids, 40, seed=1, adapter="a@1"), 2)
    order: list[str] = []

    async def tracked(name: str, req: GenerationRequest) -> None:
        await engine.generate(req)
        order.append(name)

    await asyncio.gather(
        tracked("base", request(ids, 4, seed=2, adapter=None)),  # queued first: it must not wait for the a@1 ones
        *(tracked(f"a{i}", request(ids, 4, seed=3 + i, adapter="a@1")) for i in range(3)),
        task,
    )
    assert order[0] == "base"
    assert engine.requests_joined == joined  # the a@1 requests queued behind the base one did not jump it


async def test_a_command_is_a_barrier_for_joiners(
    engine: HFEngine, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = chat(engine, "hi")
    joined = engine.requests_joined
    commands = queued_commands(engine, monkeypatch)
    # 200 tokens: the batch outlasts the queueing below on any machine (a batch done before the late request came
    # would let it pass without a barrier to respect)
    task, _ = await first_tokens(engine, request(ids, 200, seed=1, adapter=None), 2)
    load = asyncio.create_task(engine.load_adapter("a@1", str(adapter)))  # replacing a loaded name: a barrier
    await async_wait_until(lambda: commands, "the load to be queued (behind the running batch)")
    late = await engine.generate(request(ids, 4, seed=2, adapter=None))
    assert load.done() and task.done()  # the load ran after the batch drained, the late request after the load
    assert engine.requests_joined == joined and len(late.samples[0].token_ids) == 4
    await task


async def test_a_new_adapter_loads_between_two_steps_of_a_running_batch(engine: HFEngine, adapter: Path) -> None:
    """A trainer's new checkpoint does not wait for the rollout batch running on the previous one (merged plain
    LoRA); on weights shared with a trainer the load still waits for the batch (it adds hooks to the model)."""
    ids = chat(engine, "hi")
    task, _ = await first_tokens(engine, request(ids, 40, seed=1, adapter="a@1"), 2)
    await engine.load_adapter("b@1", str(adapter))
    assert task.done() is (engine.shared_base is not None)
    first = await task
    again = await engine.generate(request(ids, 40, seed=1, adapter="a@1"))
    assert first.samples[0].token_ids == again.samples[0].token_ids  # the running rows were not disturbed
    same = await asyncio.gather(*(engine.generate(request(ids, 8, seed=5, adapter=a)) for a in ("a@1", "b@1")))
    assert same[0].samples[0].token_ids == same[1].samples[0].token_ids  # b@1 is the same folder, loaded right


def cache_of_rows(rows: int, length: int, capacity: int, fill: float) -> FastCache:
    keys = torch.full((1, rows, 1, capacity, 2), fill)
    valid = torch.zeros((rows, capacity), dtype=torch.bool)
    valid[:, :length] = True
    return FastCache(keys=keys, values=keys.clone(), valid=valid, length=length)


def test_a_joined_cache_is_right_aligned_with_room_on_the_left_that_attention_skips() -> None:
    running, joiner = cache_of_rows(2, 3, 8, 1.0), cache_of_rows(1, 6, 6, 2.0)
    running.extend(joiner)  # longer than the running rows: new buffers, JOIN_MARGIN free columns on the left
    end, margin = running.length, JOIN_MARGIN
    assert end == 6 + margin and running.keys.shape[1] == 3 and running.valid.shape[1] >= end + 1  # room to decode on
    assert running.valid[:2, :end].tolist() == [[False] * (margin + 3) + [True] * 3] * 2
    assert running.valid[2, :end].tolist() == [False] * margin + [True] * 6
    assert running.keys[0, :, 0, :margin].abs().sum() == 0  # padding is zeros (an empty tensor could hold NaN)
    assert running.keys[0, :2, 0, end - 3 : end].eq(1.0).all() and running.keys[0, 2, 0, margin:end].eq(2.0).all()
    assert running.first_used(end) == margin  # what attention reads from
    running.select(torch.tensor([0, 1]))  # the long row leaves: the three columns only it used are not read again
    assert running.length == end and running.first_used(end) == end - 3


def test_rows_joining_where_rows_left_are_written_in_place() -> None:
    """An agent loop's runs leave the batch when a call ends and join again with their next turn: a joiner no longer
    than the running rows goes into the room a leaver left, and only its columns are copied."""
    running = cache_of_rows(3, 5, 8, 1.0)
    storage = running.keys.untyped_storage().data_ptr()
    running.select(torch.tensor([0, 2]))  # a row leaves: its room stays
    joiner = cache_of_rows(1, 4, 6, 3.0)
    running.extend(joiner)
    assert running.keys.untyped_storage().data_ptr() == storage and running.keys.shape[1] == 3 and running.length == 5
    assert running.valid[2, :5].tolist() == [False, True, True, True, True]
    # its padding column keeps the KV of the row that left (masked; never NaN: buffers are allocated zeroed)
    assert running.keys[0, 2, 0, 0].eq(1.0).all() and running.keys[0, 2, 0, 1:5].eq(3.0).all()
    assert running.keys[0, :2, 0, :5].eq(1.0).all()  # the running rows as they were
    again = cache_of_rows(1, 4, 6, 4.0)
    running.extend(again)  # no room left: new buffers, the rows as they were
    assert running.keys.untyped_storage().data_ptr() != storage and running.keys.shape[1] == 4
    assert running.keys[0, 2, 0, running.length - 4 : running.length].eq(3.0).all()
    assert running.keys[0, 3, 0, running.length - 4 : running.length].eq(4.0).all()


def test_rows_that_leave_are_dropped_in_place() -> None:
    """Finished rows leave without a copy of the whole cache: the rows after them move up, the buffer stays."""
    keys = torch.arange(4.0).view(1, 4, 1, 1, 1).expand(1, 4, 1, 6, 2).clone()  # row b holds b everywhere
    valid = torch.zeros((4, 6), dtype=torch.bool)
    valid[:, :3] = True
    running = FastCache(keys=keys, values=keys.clone(), valid=valid, length=3)
    storage = running.keys.untyped_storage().data_ptr()
    running.select(torch.tensor([0, 2, 3]))
    assert running.keys.untyped_storage().data_ptr() == storage and running.keys.shape[1] == 3
    assert [float(running.keys[0, b, 0, 0, 0]) for b in range(3)] == [0.0, 2.0, 3.0] and running.length == 3
    assert running.valid[:, :3].all()
    running.select(torch.tensor([1, 1]))  # repeats (n > 1 from one prefill): copied as before
    assert [float(running.keys[0, b, 0, 0, 0]) for b in range(2)] == [2.0, 2.0]


async def test_a_failed_join_fails_every_request_in_the_batch_and_the_engine_goes_on(
    engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_art.serve.engines.hf import steps

    def broken(self: Any, batch: Any) -> Any:
        raise RuntimeError("prefill blew up")

    monkeypatch.setattr(steps.FastSteps, "join", broken)
    monkeypatch.setattr(steps.HFSteps, "join", broken)
    ids = chat(engine, "hi")
    task, _ = await first_tokens(engine, request(ids, 40, seed=1, adapter=None), 2)
    with pytest.raises(RuntimeError, match="blew up"):
        await asyncio.wait_for(engine.generate(request(ids, 4, seed=2, adapter=None)), 30)
    with pytest.raises(RuntimeError, match="blew up"):
        await asyncio.wait_for(task, 30)
    monkeypatch.undo()
    assert len((await engine.generate(request(ids, 3, seed=2, adapter=None))).samples[0].token_ids) == 3


async def test_a_request_whose_adapter_was_unloaded_before_it_ran_fails_and_the_worker_goes_on(
    engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_art.errors import ModelNotFoundError

    ids = chat(engine, "hi")
    commands = queued_commands(engine, monkeypatch)
    task, _ = await first_tokens(engine, request(ids, 200, seed=1, adapter=None), 2)  # outlasts the queueing below
    unload = asyncio.create_task(engine.unload_adapter("a@1"))
    # the unload is queued behind the running batch; this request behind the unload
    await async_wait_until(lambda: commands, "the unload to be queued")
    with pytest.raises(ModelNotFoundError, match="unloaded before the request ran"):
        await asyncio.wait_for(engine.generate(request(ids, 4, seed=2, adapter="a@1")), 30)
    await unload
    await task
    assert len((await engine.generate(request(ids, 3, seed=2, adapter=None))).samples[0].token_ids) == 3


@pytest.mark.parametrize("wait_ms", [0.0, 1000.0])
async def test_an_idle_engine_gathers_a_burst_of_arrivals_into_one_batch(tiny_path: Path, wait_ms: float) -> None:
    """With a quiet gap of 1 s, six arrivals 5 ms apart start as one batch (a window 200 times the stagger: a slow
    or busy machine stays inside it). With none, the first request's batch starts before the others arrive."""
    with pytest.raises(ValueError, match="batch_wait_ms must be >= 0"):
        HFEngine(str(tiny_path), batch_wait_ms=-1)
    eng = HFEngine(str(tiny_path), max_batch_size=16, batch_wait_ms=wait_ms)
    await eng.start()
    try:
        ids = chat(eng, "hello")

        async def staggered(i: int) -> Any:
            # arrivals 5 ms apart, as agent runs send their next calls: the scenario, not a wait for anything
            await asyncio.sleep(0.005 * i)
            return await eng.generate(request(ids, 4, seed=i, adapter=None))

        await eng.generate(request(ids, 2, seed=0, adapter=None, n=2))  # a batch of 2 rows (two requests could
        # run as two batches of one when the first ends before the second is queued: then nothing waits below)
        before_batches, before_joined = eng.batches_run, eng.requests_joined
        if wait_ms:  # each arrival within 1 s of the last: one batch, prefilled once, nobody joins late
            results = await asyncio.gather(*(staggered(i) for i in range(6)))
            assert eng.batches_run - before_batches == 1 and eng.requests_joined == before_joined
        else:  # the first starts at once, alone (no quiet gap to wait for); the rest join it or run after it
            first, _ = await first_tokens(eng, request(ids, 4, seed=0, adapter=None), 1)
            assert eng.batches_run - before_batches == 1
            results = [await first, *await asyncio.gather(*(staggered(i) for i in range(1, 6)))]
            assert eng.batches_run - before_batches + eng.requests_joined - before_joined > 1
        assert all(len(r.samples[0].token_ids) == 4 for r in results)
    finally:
        await eng.close()


async def test_a_lone_client_calling_in_turn_never_waits_for_a_burst(tiny_path: Path) -> None:
    """A quiet gap of 60 s: a lone client that waited for it even once would run past the 30 s deadline, which
    three calls of two tokens never reach on any machine that runs this suite."""
    eng = HFEngine(str(tiny_path), max_batch_size=16, batch_wait_ms=60_000)
    await eng.start()
    try:
        ids = chat(eng, "hello")

        async def in_turn() -> None:
            for i in range(4):
                await eng.generate(request(ids, 2, seed=i, adapter=None))

        try:
            await asyncio.wait_for(in_turn(), 30)
        except TimeoutError:
            raise AssertionError("a lone client's call waited for a burst of arrivals") from None
    finally:
        await eng.close()
