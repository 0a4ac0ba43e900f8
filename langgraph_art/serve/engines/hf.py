"""``HFEngine``: transformers + peft inference on CPU or CUDA, with dynamic batching and LoRA adapters by name.

One worker thread owns the model. Requests queue up; each time the worker is free it takes the oldest request
and every queued request for the same adapter (up to ``max_batch_size`` rows, ``n`` rows per request), and
requests for that adapter that arrive while the batch decodes join it at the next step (continuous batching,
``batch.py``) unless a command or another adapter's request is ahead of them in the queue. Adapter loads and
unloads go through the same queue and act as barriers, so a batch never sees an adapter change under it. Rows
that finish leave the KV cache at once, so a long request does not keep short ones' memory busy.

The forwards themselves run through ``FastLM`` (``fast.py``) for Llama-family models and through transformers
otherwise (``steps.py``); an adapter is merged into the weights while its batches run (``adapters.py``), or, on
weights shared with a trainer in the same process (``share_weights``), added unmerged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from langgraph_art.errors import ConfigError, EngineNotReadyError, ModelNotFoundError
from langgraph_art.models.loading import (
    LARGE_MODEL_BYTES,
    cache_argument,
    eos_token_ids,
    load_causal_lm,
    weight_bytes,
)
from langgraph_art.models.lora import HookedLora, SharedBase
from langgraph_art.serve.engines.adapters import AdapterSet
from langgraph_art.serve.engines.base import (
    FinishedEvent,
    GenerationRequest,
    GenerationResult,
    Sample,
    StreamEvent,
    read_adapter_config,
    stop_position,
    token_budget,
)
from langgraph_art.serve.engines.batch import Job, Row, RunningBatch
from langgraph_art.serve.engines.fast import FastLM
from langgraph_art.serve.engines.steps import FastSteps, HFSteps, Steps

log = logging.getLogger(__name__)


@dataclass
class _Command:
    run: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    between_steps: bool = False  # may run between two steps of a running batch (else: once the batch is done)


SHARE_MIN_BYTES = LARGE_MODEL_BYTES  # share_weights=None: models this large train on the engine's weights


class HFEngine:
    """Serve a causal LM (hub id, folder or ``"tiny"``) and any number of peft LoRA adapters.

    ``fast_decode=False`` runs every forward through transformers; ``merge_adapters=False`` serves adapters
    through peft's LoRA layers (no copy of the targeted base weights in memory, slower forwards).

    ``share_weights``: offer the model to a trainer in this process (``shared_base``), so engine and trainer hold
    one copy of the weights; they take turns (``sleep``/``wake_up`` pause the worker between batches). Adapters
    are then served unmerged (``FastLora`` or hooks). ``None`` (default): on for models of ``SHARE_MIN_BYTES``
    and more; off for smaller ones, whose own trainer copy costs a few MB and lets rollouts go on while the trainer
    steps. Measured (benchmarks/README.md): on the 0.5B-shaped model 3 GRPO steps peak at 1.53x the weights shared,
    3.52x with merged adapters and a trainer's copy; FastLora samples as fast as the merged weights (8.88 against
    9.38 s per 8 x 32 tokens; hooks 9.68, peft's layers 9.73), so unmerged serving costs no speed.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny",
        *,
        served_name: str | None = None,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        seed: int = 0,
        fast_decode: bool = True,
        merge_adapters: bool | None = None,
        share_weights: bool | None = None,
        batch_wait_ms: float = 2.0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0 (0: start each batch at once), got {batch_wait_ms}")
        if share_weights and merge_adapters:
            raise ConfigError(
                "share_weights=True serves adapters unmerged (the trainer trains on the base weights); "
                "drop merge_adapters=True, or set share_weights=False to merge"
            )
        self.model_path = os.fspath(model)
        self.base_model = served_name or self.model_path
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len or 0
        self.batch_wait = batch_wait_ms / 1000
        self._last_batch_rows = 0  # the most rows the last batch ran at once
        self._device, self._dtype, self._seed = device, dtype, seed
        self._fast_decode, self._merge_adapters, self._share = fast_decode, merge_adapters, share_weights
        self._lora: HookedLora | None = None
        self._awake = threading.Event()  # cleared while a trainer has its turn on the shared weights
        self._awake.set()
        self._turn = asyncio.Lock()
        self._lm: Any = None
        self._fast: FastLM | None = None
        self._tokenizer: Any = None
        self._adapters: AdapterSet = AdapterSet(None)
        self._queue: collections.deque[Job | _Command] = collections.deque()
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._ready = False
        self.batches_run = 0  # observability for tests and benchmarks
        self.prefills_shared = 0  # rows that reused another row's prefill (identical prompts)
        self.requests_joined = 0  # requests that joined a batch already decoding (continuous batching)

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineNotReadyError("the engine is still loading its model")
        return self._tokenizer

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        if self._ready:
            return
        await asyncio.to_thread(self._load)
        self._worker = threading.Thread(target=self._work, name="langgraph-art-hf-engine", daemon=True)
        self._worker.start()
        self._ready = True

    def _load(self) -> None:
        self._lm, self._tokenizer = load_causal_lm(self.model_path, device=self._device, dtype=self._dtype)
        limit = int(getattr(self._lm.config, "max_position_embeddings", 0) or 0)
        self.max_model_len = min(self.max_model_len or limit, limit) if limit else self.max_model_len or 4096
        self._eos = eos_token_ids(self._lm, self._tokenizer)
        self._pad = int(self._tokenizer.pad_token_id)
        self._rng = torch.Generator(device=self._lm.device).manual_seed(self._seed)
        self._cache_kwarg = cache_argument(self._lm)
        self._fast = FastLM.build(self._lm) if self._fast_decode else None
        if self._share is None:
            self._share = self._merge_adapters is None and weight_bytes(self._lm) >= SHARE_MIN_BYTES
        if self._share:
            self._lora = HookedLora(self._lm)
            prepare = self._fast.prepare_lora if self._fast is not None else None
            self._adapters = AdapterSet(self._lm, lora=self._lora, prepare_fast=prepare)
        else:
            self._adapters = AdapterSet(self._lm, merge=self._merge_adapters is not False)

    @property
    def shared_base(self) -> SharedBase | None:
        """The model, tokenizer and LoRA hooks a trainer in this process can train on (None unless shared)."""
        if not self._ready or self._lora is None:
            return None
        return SharedBase(self._lm, self._tokenizer, self._lora)

    @property
    def can_sleep(self) -> bool:
        """True when the weights are shared: the trainer's turn (``serve.publish.trainer_turn``) pauses the worker."""
        return self._lora is not None

    async def sleep(self) -> None:
        """Pause the worker once the batches queued before this call have run; requests that arrive meanwhile wait
        for ``wake_up``. The trainer steps on the shared weights in between."""
        loop = asyncio.get_running_loop()
        paused: asyncio.Future[None] = loop.create_future()

        def pause() -> None:
            loop.call_soon_threadsafe(_set_result, paused, None)
            self._awake.wait()

        await self._turn.acquire()  # one trainer at a time: they share the model (and its one active adapter)
        self._awake.clear()
        try:
            await self._command(pause, wait=False)
            await paused
        except BaseException:
            await self.wake_up()
            raise

    async def wake_up(self) -> None:
        self._awake.set()
        if self._turn.locked():
            self._turn.release()

    async def close(self) -> None:
        self._awake.set()
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for item in pending:
            error = EngineNotReadyError("the engine was closed before this request ran")
            if isinstance(item, Job):
                item.post(error)
            else:
                item.loop.call_soon_threadsafe(_set_exception, item.future, error)
        if self._worker is not None:
            await asyncio.to_thread(self._worker.join, 30)
        self._ready = False

    # -- public API ------------------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        async for event in self._submit(request, streaming=False):
            if isinstance(event, FinishedEvent):
                return event.result
        raise RuntimeError("engine finished without a result")  # pragma: no cover - _submit always finishes

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        return self._submit(request, streaming=True)

    async def _submit(self, request: GenerationRequest, streaming: bool) -> AsyncIterator[StreamEvent]:
        if not self._ready or self._closed:
            raise EngineNotReadyError("the engine is not running (still loading, or closed)")
        if request.adapter is not None and request.adapter not in self._adapters:
            raise ModelNotFoundError(f"adapter {request.adapter!r} is not loaded; loaded: {self._adapters.loaded()}")
        job = Job(
            request=request,
            max_new=token_budget(request, self.max_model_len),
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            streaming=streaming,
        )
        request.request_id = request.request_id or uuid.uuid4().hex
        with self._cv:
            self._queue.append(job)
            self._cv.notify()
        try:
            while True:
                item = await job.events.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, FinishedEvent):
                    return
        finally:
            job.cancelled = True  # a client that went away stops its rows at the next step

    async def load_adapter(self, name: str, path: str) -> None:
        """A new merged plain-LoRA adapter goes in between two decode steps (the trainer's new checkpoint does not
        wait for the rollout batch running on the previous one); any other load waits for the running batch."""
        folder = Path(path).resolve()  # the folder, not wherever a relative path points after a chdir
        read_adapter_config(name, folder)
        if name not in self._adapters:
            adapter = await asyncio.to_thread(self._adapters.read, str(folder))
            if adapter is not None and await self._command(lambda: self._adapters.add(name, adapter), between=True):
                return
        await self._command(lambda: self._adapters.load(name, str(folder)))

    async def unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise ModelNotFoundError(f"adapter {name!r} is not loaded; loaded: {self._adapters.loaded()}")
        await self._command(lambda: self._adapters.unload(name))

    def adapters(self) -> dict[str, str]:
        return self._adapters.folders()

    async def _command(self, run: Callable[[], Any], wait: bool = True, between: bool = False) -> Any:
        """Run ``run`` on the worker between batches (a barrier: nothing queued after it joins an earlier batch),
        or with ``between`` at the next step of a running batch (still in order: what was queued after it is
        taken after it); its result, or None at once when not ``wait``-ing."""
        if not self._ready or self._closed:
            raise EngineNotReadyError("the engine is not running (still loading, or closed)")
        loop = asyncio.get_running_loop()
        command = _Command(run=run, loop=loop, future=loop.create_future(), between_steps=between)
        with self._cv:
            self._queue.append(command)
            self._cv.notify()
        return await command.future if wait else None

    # -- worker thread ---------------------------------------------------------------------------------------
    def _work(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                self._gather_burst()
                work = self._take_batch()
            if isinstance(work, _Command):
                _run_command(work)
                continue
            self._run_batch(work)

    def _gather_burst(self) -> None:
        """Called with the lock held, the engine idle and a request queued: wait while requests keep arriving
        (each within ``batch_wait`` of the last, for at most 10 x ``batch_wait``), so a burst starts as one batch.
        Agent runs whose calls end together send their next calls one after another (each run's Python between
        them holds the GIL); started at the first, the batch prefilled it alone and the rest joined a step later:
        one more prefill per turn, and that row stayed a step ahead of the others for the rest of the run. Only
        after a batch of several rows, or with several requests queued: a lone client calling in turn pays nothing."""
        if self.batch_wait <= 0 or (len(self._queue) == 1 and self._last_batch_rows <= 1):
            return  # a lone request after lone requests (one client calling in turn) never waits
        deadline = time.monotonic() + 10 * self.batch_wait
        quiet_until = time.monotonic() + self.batch_wait
        queued = len(self._queue)
        while not self._closed and queued < self.max_batch_size and not isinstance(self._queue[-1], _Command):
            now = time.monotonic()
            if now >= min(quiet_until, deadline):
                return
            self._cv.wait(min(quiet_until, deadline) - now)
            if len(self._queue) != queued:  # another arrival: wait for a quiet gap again
                queued, quiet_until = len(self._queue), time.monotonic() + self.batch_wait

    def _take_batch(self) -> _Command | list[Job]:
        """Called with the lock held: the next command, or the oldest job plus same-adapter jobs behind it."""
        head = self._queue[0]
        if isinstance(head, _Command):
            self._queue.popleft()
            return head
        batch: list[Job] = []
        rows = 0
        kept: collections.deque[Job | _Command] = collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, _Command):  # a barrier: nothing behind it joins this batch
                kept.append(item)
                kept.extend(self._queue)
                self._queue.clear()
                break
            fits = rows + item.request.params.n <= self.max_batch_size or not batch
            if item.request.adapter == head.request.adapter and fits and not item.cancelled:
                batch.append(item)
                rows += item.request.params.n
            elif not item.cancelled:
                kept.append(item)
        self._queue.extendleft(reversed(kept))
        return batch

    def _run_batch(self, jobs: list[Job]) -> None:
        """Decode ``jobs`` as one running batch; same-adapter requests queued meanwhile join it between steps.
        Any error (an adapter unloaded under the request, a failed forward) goes to every unfinished request of
        the batch; the worker goes on."""
        self.batches_run += 1
        self._last_batch_rows = 0
        adapter = jobs[0].request.adapter
        batch: RunningBatch | None = None
        try:
            with self._adapters.use(adapter) as policy:
                if self._fast is not None and policy.plain:
                    self._fast.relink(self._lm)
                    steps: Steps = FastSteps(self._fast, max(job.max_new for job in jobs), policy.fast_lora)
                else:
                    steps = HFSteps(policy.model, self._cache_kwarg)
                batch = RunningBatch(steps, self._finish_if_done, self._rng, self._pad)
                batch.admit(jobs)
                while batch.rows:
                    self._last_batch_rows = max(self._last_batch_rows, batch.size)
                    batch.step()
                    self._run_between_steps()
                    joiners = self._take_joiners(adapter, batch.size) if batch.rows and steps.can_join else []
                    if joiners:
                        batch.admit(joiners)
        except Exception as exc:
            log.exception("batch of %d requests failed", len(batch.jobs) if batch is not None else len(jobs))
            if batch is None:
                for job in jobs:
                    job.post(exc)
            else:
                batch.fail(exc)
        finally:
            if batch is not None:
                self.prefills_shared += batch.prefills_shared
                self.requests_joined += batch.joined

    def _run_between_steps(self) -> None:
        """The commands at the head of the queue that may run while a batch is running (``between_steps``)."""
        while True:
            with self._cv:
                head = self._queue[0] if self._queue else None
                if not isinstance(head, _Command) or not head.between_steps:
                    return
                self._queue.popleft()
            _run_command(head)

    def _take_joiners(self, adapter: str | None, rows: int) -> list[Job]:
        """The queued requests that may join a running batch of ``rows`` rows for ``adapter``: those at the head
        of the queue, in order, while they are for the same adapter and fit. A command or another adapter's
        request at the head stops it (the batch then drains and that one runs next), so nothing waits behind a
        stream of joiners."""
        joiners: list[Job] = []
        with self._cv:
            while self._queue:
                head = self._queue[0]
                if isinstance(head, _Command) or head.request.adapter != adapter:
                    break
                if not head.cancelled and rows + head.request.params.n > self.max_batch_size:
                    break
                self._queue.popleft()
                if not head.cancelled:
                    joiners.append(head)
                    rows += head.request.params.n
        return joiners

    def _finish_if_done(self, row: Row) -> bool:
        """Record the row's sample if it is finished; True when it is."""
        job, params = row.job, row.job.request.params
        reason: str | None = None
        text: str | None = None
        if job.cancelled:
            reason = "length"
        elif row.token_ids[-1] in self._eos and not params.ignore_eos:
            reason = "stop"
        elif params.stop:
            text = self._tokenizer.decode(row.token_ids, skip_special_tokens=True)
            if stop_position(text, params.stop) >= 0:
                reason = "stop"
        if reason is None and len(row.token_ids) >= job.max_new:
            reason = "length"
        if reason is None:
            return False
        if text is None:
            text = self._tokenizer.decode(row.token_ids, skip_special_tokens=True)
        cut = stop_position(text, params.stop) if params.stop else -1
        job.samples[row.index] = Sample(
            index=row.index,
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            top_logprobs=row.top,
            text=text[:cut] if cut >= 0 else text,
            finish_reason="stop" if reason == "stop" else "length",
        )
        if all(s is not None for s in job.samples):
            samples = [s for s in job.samples if s is not None]
            req = job.request
            job.post(FinishedEvent(GenerationResult(req.request_id, req.prompt_token_ids, samples, req.adapter)))
        return True


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _run_command(command: _Command) -> None:
    """Run a command on the worker; its result or error goes to the awaiting caller's loop."""
    try:
        result = command.run()
        command.loop.call_soon_threadsafe(_set_result, command.future, result)
    except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller, not swallowed
        command.loop.call_soon_threadsafe(_set_exception, command.future, exc)
