"""``build_engine``: one name per engine (``"hf"``, ``"vllm"``) and the options each takes, checked up front, for
``LocalBackend(engine=...)``, ``EmbeddedServer`` and ``langgraph-art serve --engine``."""

from __future__ import annotations

import os
from typing import Any, Literal

from langgraph_art.errors import ConfigError

EngineName = Literal["hf", "vllm"]
ENGINE_OPTIONS: dict[str, frozenset[str]] = {
    "hf": frozenset(
        {
            "device",
            "dtype",
            "max_batch_size",
            "max_model_len",
            "seed",
            "fast_decode",
            "merge_adapters",
            "share_weights",
            "batch_wait_ms",
            "chat_template",
            "enable_prefix_caching",
            "prefix_cache_gib",
        }
    ),
    "vllm": frozenset(
        {
            "device",
            "dtype",
            "max_model_len",
            "seed",
            "max_lora_rank",
            "max_loras",
            "gpu_memory_utilization",
            "kv_cache_gib",
            "tensor_parallel_size",
            "data_parallel_size",
            "enable_sleep_mode",
            "engine_args",
            "chat_template",
            "enable_prefix_caching",
        }
    ),
}


def check_engine_options(engine: str, options: dict[str, Any]) -> None:
    if engine not in ENGINE_OPTIONS:
        raise ConfigError(f"engine must be one of {sorted(ENGINE_OPTIONS)}, got {engine!r}")
    unknown = sorted(set(options) - ENGINE_OPTIONS[engine])
    if unknown:
        others = {name: sorted(set(unknown) & keys) for name, keys in ENGINE_OPTIONS.items() if name != engine}
        hint = "; ".join(f"{keys} belong to engine={name!r}" for name, keys in others.items() if keys)
        raise ConfigError(
            f"engine {engine!r} does not take {unknown}" + (f" ({hint})" if hint else "")
            + f"; it takes {sorted(ENGINE_OPTIONS[engine])}"
        )  # fmt: skip


def build_engine(engine: str, model: str | os.PathLike[str], *, served_name: str | None = None, **options: Any) -> Any:
    """An unstarted engine serving ``model``. ``options`` are the named engine's (``ENGINE_OPTIONS``); ``None``
    values mean the engine's default."""
    options = {key: value for key, value in options.items() if value is not None}
    check_engine_options(engine, options)
    if engine == "vllm":
        from langgraph_art.serve.engines.vllm.engine import VLLMEngine

        extra = options.pop("engine_args", None) or {}
        return VLLMEngine(model, served_name=served_name, **options, **extra)
    from langgraph_art.serve.engines.hf.engine import HFEngine

    return HFEngine(model, served_name=served_name, **options)
