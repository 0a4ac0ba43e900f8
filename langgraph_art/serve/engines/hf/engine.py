"""``HFEngine``: transformers + peft inference on CPU or CUDA, with dynamic batching and LoRA adapters by name.

One worker thread owns the model. Requests queue up; each time the worker is free it takes the oldest request
and every queued request for the same adapter (up to ``max_batch_size`` rows, ``n`` rows per request), and
requests for that adapter that arrive while the batch decodes join it at the next step (continuous batching,
``batch.py``) unless a command or another adapter's request is ahead of them in the queue (the queue's rules:
``schedule.py``). Adapter loads and unloads go through the same queue: a new merged adapter is added between two
steps, anything else is a barrier, so a batch never sees its own adapter change under it. Rows
that finish leave the KV cache at once, so a long request does not keep short ones' memory busy.

The forwards themselves run through ``FastLM`` (``fast.py``) for Llama-family models and through transformers
otherwise (``steps.py``); an adapter is merged into the weights while its batches run (``adapters.py``), or, on
weights shared with a trainer in the same process (``share_weights``), added unmerged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch

from langgraph_art.errors import ConfigError, ContextLengthError, EngineNotReadyError, ModelNotFoundError
from langgraph_art.models.grammar import Grammars
from langgraph_art.models.loading import (
    LARGE_MODEL_BYTES,
    cache_argument,
    eos_token_ids,
    load_causal_lm,
    trim_heap,
    weight_bytes,
)
from langgraph_art.models.lora import HookedLora, SharedBase
from langgraph_art.serve.engines.base import (
    FinishedEvent,
    GenerationRequest,
    GenerationResult,
    Sample,
    ScoreRequest,
    StreamEvent,
    read_adapter_config,
    stop_position,
    token_budget,
)
from langgraph_art.serve.engines.hf.adapters import AdapterSet
from langgraph_art.serve.engines.hf.batch import Job, Row, RunningBatch
from langgraph_art.serve.engines.hf.fast import FastLM
from langgraph_art.serve.engines.hf.prefill import EngineCounts
from langgraph_art.serve.engines.hf.prefix_cache import PrefixCache
from langgraph_art.serve.engines.hf.schedule import Command, WorkQueue, run_command, set_exception, set_result
from langgraph_art.serve.engines.hf.steps import FastSteps, HFSteps, Steps

log = logging.getLogger(__name__)


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
        chat_template: str | None = None,
        enable_prefix_caching: bool = True,
        prefix_cache_gib: float = 1.0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0 (0: start each batch at once), got {batch_wait_ms}")
        if not (math.isfinite(prefix_cache_gib) and prefix_cache_gib >= 0):
            raise ConfigError(f"prefix_cache_gib must be a size in GiB >= 0, got {prefix_cache_gib}")
        if share_weights and merge_adapters:
            raise ConfigError(
                "share_weights=True serves adapters unmerged (the trainer trains on the base weights); "
                "drop merge_adapters=True, or set share_weights=False to merge"
            )
        self.model_path = os.fspath(model)
        self.base_model = served_name or self.model_path
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len or 0
        self._work_queue = WorkQueue(max_batch_size, batch_wait_ms / 1000)
        self._trims_heap = False  # set by _load: large models on CPU
        self._device, self._dtype, self._seed = device, dtype, seed
        self.chat_template = chat_template  # replaces the model's own (models.templates.read_chat_template)
        self._fast_decode, self._merge_adapters, self._share = fast_decode, merge_adapters, share_weights
        self._lora: HookedLora | None = None
        self._awake = threading.Event()  # cleared while a trainer has its turn on the shared weights
        self._awake.set()
        self._turn = asyncio.Lock()
        self._lm: Any = None
        self._fast: FastLM | None = None
        self._tokenizer: Any = None
        self._adapters: AdapterSet = AdapterSet(None)
        self._grammars: Grammars | None = None
        self._grammars_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._ready = False
        self.batches_run = 0  # observability for tests and benchmarks
        self.prefills_shared = 0  # rows that reused another row's prefill (identical prompts)
        self.requests_joined = 0  # requests that joined a batch already decoding (continuous batching)
        self.counts = EngineCounts()
        budget = int(prefix_cache_gib * 2**30) if enable_prefix_caching else 0
        self.prefix_cache = PrefixCache(budget) if budget else None

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
        self._lm, self._tokenizer = load_causal_lm(
            self.model_path, device=self._device, dtype=self._dtype, chat_template=self.chat_template
        )
        limit = int(getattr(self._lm.config, "max_position_embeddings", 0) or 0)
        self.max_model_len = min(self.max_model_len or limit, limit) if limit else self.max_model_len or 4096
        self._eos = eos_token_ids(self._lm, self._tokenizer)
        self._pad = int(self._tokenizer.pad_token_id)
        self._rng = torch.Generator(device=self._lm.device).manual_seed(self._seed)
        self._cache_kwarg = cache_argument(self._lm)
        self._fast = FastLM.build(self._lm) if self._fast_decode else None
        if self._share is None:
            self._share = self._merge_adapters is None and weight_bytes(self._lm) >= SHARE_MIN_BYTES
        self._trims_heap = self._lm.device.type == "cpu" and weight_bytes(self._lm) >= LARGE_MODEL_BYTES
        if self._share:
            self._lora = HookedLora(self._lm)
            prepare = self._fast.prepare_lora if self._fast is not None else None
            self._adapters = AdapterSet(self._lm, lora=self._lora, prepare_fast=prepare)
        else:
            self._adapters = AdapterSet(self._lm, merge=self._merge_adapters is not False)

    def grammars(self) -> Grammars:
        """llguidance over this model's tokenizer and vocabulary, built on the first request with a grammar."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = Grammars(self.tokenizer, vocab_size=int(self._lm.config.vocab_size))
            return self._grammars

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
            loop.call_soon_threadsafe(set_result, paused, None)
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
        self._closed = True
        for item in self._work_queue.close():
            error = EngineNotReadyError("the engine was closed before this request ran")
            if isinstance(item, Job):
                item.post(error)
            else:
                item.loop.call_soon_threadsafe(set_exception, item.future, error)
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
        grammar = request.grammar
        if grammar is not None and not (self._grammars and self._grammars.compiled(grammar)):
            await asyncio.to_thread(lambda: self.grammars().check(grammar))  # a grammar that fails is a 400
        self._work_queue.put(job)
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

    async def score(self, request: ScoreRequest) -> list[float]:
        """The logprobs of ``request.token_ids[request.start:]``, from one forward of the whole sequence on the
        worker between batches (``Scorer``): through the fast decoder when the policy runs there (an unmerged
        adapter on shared weights is only there), else transformers' forward."""
        if self.max_model_len and len(request.token_ids) > self.max_model_len:
            raise ContextLengthError(
                f"{len(request.token_ids)} tokens to score; this model's context is {self.max_model_len}", "prompt"
            )
        if request.adapter is not None and request.adapter not in self._adapters:
            raise ModelNotFoundError(f"adapter {request.adapter!r} is not loaded; loaded: {self._adapters.loaded()}")
        return await self._command(lambda: self._score(request))

    def _fast_for(self, policy: Any) -> FastLM | None:
        """The fast decoder, when ``policy`` runs there (the plain architecture), its weights relinked; else None.
        On the worker."""
        if self._fast is None or not policy.plain:
            return None
        if self._fast.relink(self._lm) and self.prefix_cache is not None:
            self.prefix_cache.clear()  # a parameter was replaced: every KV computed before is stale
        return self._fast

    def _score(self, request: ScoreRequest) -> list[float]:
        """``score`` on the worker."""
        ids = torch.tensor([request.token_ids], device=self._lm.device)  # [1, T]
        with self._adapters.use(request.adapter) as policy:
            fast = self._fast_for(policy)
            if fast is not None:
                cache = fast.new_cache(1, ids.shape[1])
                positions = torch.arange(ids.shape[1], device=ids.device)[None]  # [1, T]
                valid = torch.ones_like(ids, dtype=torch.bool)
                hidden = fast.forward(ids, positions, valid, cache, policy.fast_lora, every=True)  # [1, T, H]
                logits = fast.lm_head(hidden[0, request.start - 1 : -1])  # [T - start, V]
            else:
                logits = policy.model(ids).logits[0, request.start - 1 : -1]  # [T - start, V]
        logp = torch.log_softmax(logits.float() / request.temperature, dim=-1)
        return logp.gather(-1, ids[0, request.start :, None])[:, 0].tolist()

    async def load_adapter(self, name: str, path: str) -> None:
        """A new merged plain-LoRA adapter goes in between two decode steps (the trainer's new checkpoint does not
        wait for the rollout batch running on the previous one); any other load waits for the running batch."""
        folder = Path(path).resolve()  # the folder, not wherever a relative path points after a chdir
        read_adapter_config(name, folder)
        if name not in self._adapters:
            adapter = await asyncio.to_thread(self._adapters.read, str(folder))
            if adapter is not None and await self._command(lambda: self._adapters.add(name, adapter), between=True):
                return

        def load() -> None:
            self._adapters.load(name, str(folder))
            self._forget_gone()  # the adapter it replaced, if any

        await self._command(load)

    async def unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise ModelNotFoundError(f"adapter {name!r} is not loaded; loaded: {self._adapters.loaded()}")

        def unload() -> None:
            self._adapters.unload(name)
            self._forget_gone()

        await self._command(unload)

    def adapters(self) -> dict[str, str]:
        return self._adapters.folders()

    def _forget_gone(self) -> None:
        """On the worker, after an adapter went (unloaded, or replaced under its name): its prefix-cache KV goes."""
        if self.prefix_cache is not None:
            self.prefix_cache.retain(set(self._adapters.keys()))

    def stats(self) -> dict[str, float]:
        """Counters since start: prompt tokens sent and prefilled, the worker's seconds in prefill and in decode, the
        prefix cache's queries, hits (tokens), evictions (blocks), blocks and bytes held, batches, requests that
        joined a running batch."""
        prefix = self.prefix_cache.stats() if self.prefix_cache is not None else dict.fromkeys(PrefixCache.FIELDS, 0)
        return {
            "prompt_tokens": self.counts.prompt_tokens,
            "prefill_tokens": self.counts.prefill_tokens,
            "prefill_seconds": self.counts.prefill_seconds,
            "decode_seconds": self.counts.decode_seconds,
            **prefix,
            "batches": self.batches_run,
            "requests_joined": self.requests_joined,
        }

    async def _command(self, run: Callable[[], Any], wait: bool = True, between: bool = False) -> Any:
        """Run ``run`` on the worker between batches (a barrier: nothing queued after it joins an earlier batch),
        or with ``between`` at the next step of a running batch (still in order: what was queued after it is
        taken after it); its result, or None at once when not ``wait``-ing."""
        if not self._ready or self._closed:
            raise EngineNotReadyError("the engine is not running (still loading, or closed)")
        loop = asyncio.get_running_loop()
        command = Command(run=run, loop=loop, future=loop.create_future(), between_steps=between)
        self._work_queue.put(command)
        return await command.future if wait else None

    # -- worker thread ---------------------------------------------------------------------------------------
    def _work(self) -> None:
        """The worker thread: commands and batches in the order ``WorkQueue`` gives them."""
        torch.set_grad_enabled(False)
        while (work := self._work_queue.next_work()) is not None:
            if isinstance(work, Command):
                run_command(work)
            else:
                self._run_batch(work)
                if self._trims_heap:
                    trim_heap()  # the batch's freed buffers back to the system (see there)

    def _run_batch(self, jobs: list[Job]) -> None:
        """Decode ``jobs`` as one running batch; same-adapter requests queued meanwhile join it between steps, and
        commands that may run between steps do.
        Any error (an adapter unloaded under the request, a failed forward) goes to every unfinished request of
        the batch; the worker goes on."""
        self.batches_run += 1
        work = self._work_queue
        work.last_batch_rows = 0
        adapter = jobs[0].request.adapter
        batch: RunningBatch | None = None
        try:
            with self._adapters.use(adapter) as policy:
                fast = self._fast_for(policy)
                if fast is not None:
                    max_new = max(job.max_new for job in jobs)
                    steps: Steps = FastSteps(
                        fast, max_new, policy.fast_lora, prefix=self.prefix_cache, policy=policy.key,
                        counts=self.counts,
                    )  # fmt: skip
                else:
                    steps = HFSteps(policy.model, self._cache_kwarg, self.counts)
                batch = RunningBatch(steps, self._finish_if_done, self._rng, self._pad, self.grammars, self.counts)
                self._admit(batch, jobs)
                while batch.rows:
                    work.last_batch_rows = max(work.last_batch_rows, batch.size)
                    batch.step()
                    for command in work.take_between_steps():
                        run_command(command)
                    joiners = work.take_joiners(adapter, batch.size) if batch.rows and steps.can_join else []
                    if joiners:
                        self._admit(batch, joiners)
        except Exception as exc:
            log.exception("batch of %d requests failed", len(batch.jobs) if batch is not None else len(jobs))
            if batch is None:
                for job in jobs:
                    job.post(exc)
            else:
                batch.fail(exc)

    def _admit(self, batch: RunningBatch, jobs: list[Job]) -> None:
        """``batch.admit(jobs)``, counted at once: a request's result can reach its caller before the batch ends, and
        the counters were read too early when they were added up after it (a flaky test)."""
        shared, joined = batch.prefills_shared, batch.joined
        batch.admit(jobs)
        self.prefills_shared += batch.prefills_shared - shared
        self.requests_joined += batch.joined - joined

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
