"""One loading path for every model: a hub id, a local folder, or ``"tiny"`` (built offline, then a folder)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TINY_ALIASES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "tiny-5m": {"hidden_size": 256, "num_layers": 6},
    "tiny-128": {"hidden_size": 128},  # head_dim 32: the smallest vLLM's CPU attention runs
}


def resolve_model(model: str | os.PathLike[str]) -> str:
    """Map ``"tiny"``/``"tiny-5m"`` to their built folder; return anything else (hub id or folder) unchanged."""
    model = os.fspath(model)
    if model in TINY_ALIASES:
        from langgraph_art.models.tiny import tiny_model

        return str(tiny_model(**TINY_ALIASES[model]))
    return model


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Inside our own loading and saving: no transformers progress bars ("Loading weights", "Writing model shards")
    and no FutureWarnings from transformers or peft about their own internals. The user's settings come back after:
    nothing changes process-wide."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)(\.|$)")
            yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def pick_device(device: str | None = None) -> str:
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    if tokenizer.chat_template is None:
        raise ValueError(
            f"{model!r} has no chat template; use an instruct/chat model or add a chat_template to its tokenizer"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model: str, *, device: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` through ``from_pretrained``; float32 on CPU, bfloat16 on CUDA unless ``dtype`` is set."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(model)
    if os.path.sep in path and not Path(path).exists():
        raise FileNotFoundError(f"model folder {path!r} does not exist; pass a hub id, a folder or 'tiny'")
    device = pick_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with quiet_transformers():
        lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    lm = lm.to(device)
    lm.eval()
    return lm, load_tokenizer(path)


def cache_argument(lm: Any) -> str:
    """The keyword ``lm.forward`` takes its KV cache by: ``cache`` since transformers 5.x renamed it, else
    ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"


def cache_of(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def eos_token_ids(lm: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a turn: the generation config's EOS ids plus the tokenizer's EOS."""
    ids: set[int] = set()
    configured = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def configured_eos_ids(path: str) -> set[int]:
    """The EOS ids in a model folder's ``generation_config.json`` and ``config.json`` (without loading weights)."""
    import json

    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if not file.is_file():
            continue
        value = json.loads(file.read_text()).get("eos_token_id")
        ids.update([value] if isinstance(value, int) else [int(v) for v in value or []])
    return ids
