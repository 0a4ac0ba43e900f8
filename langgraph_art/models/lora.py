"""``HookedLora``: LoRA adapters as forward hooks on a model's ``nn.Linear`` modules, the adapter chosen per thread.

The building block for one copy of the base weights per process (issue 14): the engine and the trainer can both run
the same HF model, each with its own adapter active in its own thread (a ``contextvars.ContextVar``), without
peft replacing modules (peft's active adapter is global per layer, and ``set_adapter`` flips ``requires_grad`` of
the others, so an engine switching adapters would freeze the trainer's). Every hooked layer computes
``base(x) + scale * B(A(dropout(x)))`` for the active adapter, as peft's LoRA layer does, and nothing extra when
no adapter (or one that does not target it) is active. Adapters load from and save to peft's folder format.

Not used by the engine or the trainer yet; ``tests/test_lora_hooks.py`` holds it to peft's outputs. Measured
(tiny-5m, one transformers forward of 8 rows x 1 token, all-linear rank 8, 1 thread): plain 9.11 ms, hooked LoRA
8.98 ms, peft's LoRA layers 9.67 ms.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar("langgraph_art_lora", default=None)
_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


@dataclass
class _Factor:
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float
    dropout: float = 0.0


class HookedLora:
    """LoRA adapters by name on ``model``'s linear layers (``target_modules``: names such as ``["q_proj"]``, or
    ``"all-linear"``: every ``nn.Linear`` but the output head). ``with lora.active("name"):`` runs the model with
    that adapter in this thread only."""

    def __init__(self, model: nn.Module, target_modules: list[str] | str = "all-linear") -> None:
        self.model = model
        getter: Any = getattr(model, "get_output_embeddings", None)
        head = getter() if callable(getter) else None
        self.layers: dict[str, nn.Linear] = {
            path: module
            for path, module in model.named_modules()
            if type(module) is nn.Linear and module is not head and _targeted(path, target_modules)
        }
        if not self.layers:
            raise ValueError(f"target_modules={target_modules!r} matches no linear layer of this model")
        self._adapters: dict[str, dict[str, _Factor]] = {}
        self._handles = [layer.register_forward_hook(self._hook(path)) for path, layer in self.layers.items()]

    def _hook(self, path: str) -> Any:
        def add_lora(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            name = _ACTIVE.get()
            factor = self._adapters.get(name, {}).get(path) if name is not None else None
            if factor is None:
                return output
            x = args[0]
            if factor.dropout and module.training:
                x = nn.functional.dropout(x, factor.dropout, training=True)
            # [..., in] @ [in, r] @ [r, out]
            return output + nn.functional.linear(nn.functional.linear(x, factor.a), factor.b) * factor.scale

        return add_lora

    # -- adapters ----------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._adapters)

    def add_trainable(
        self, name: str, r: int, alpha: float, dropout: float = 0.0, generator: torch.Generator | None = None
    ) -> list[nn.Parameter]:
        """A fresh adapter initialised as peft does (A: Kaiming-uniform with a=sqrt(5), B: zeros), its factors as
        parameters (A, B per layer, in layer order) for an optimizer."""
        params: list[nn.Parameter] = []
        factors = {}
        for path, layer in self.layers.items():
            weight = layer.weight
            a = torch.empty(r, layer.in_features, device=weight.device, dtype=weight.dtype)
            bound = 1 / math.sqrt(layer.in_features)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3), bound = 1/sqrt(in)
            a.uniform_(-bound, bound, generator=generator)
            a_param = nn.Parameter(a)
            b_param = nn.Parameter(torch.zeros(layer.out_features, r, device=weight.device, dtype=weight.dtype))
            factors[path] = _Factor(a_param, b_param, alpha / r, dropout)
            params += [a_param, b_param]
        self._adapters[name] = factors
        return params

    def load_peft(self, name: str, folder: str | Path) -> None:
        """Load a peft LoRA folder (plain LoRA on this model's linear layers) as adapter ``name``."""
        from safetensors.torch import load_file

        folder = Path(folder)
        config = json.loads((folder / "adapter_config.json").read_text())
        unsupported = [k for k in ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern") if config.get(k)]
        if config.get("peft_type") != "LORA" or unsupported:
            raise ValueError(f"{folder}: only plain LoRA adapters can be hooked (found {unsupported or config})")
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        scale = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in load_file(str(folder / "adapter_model.safetensors")).items():
            match = _KEY.match(key)
            if match is None:
                raise ValueError(f"{folder}: unexpected tensor {key!r} in a LoRA adapter")
            pairs.setdefault(match.group(1), {})[match.group(2)] = tensor
        factors = {}
        for path, pair in pairs.items():
            layer = self.layers.get(path)
            if layer is None:
                raise ValueError(f"{folder}: {path} is not a hooked linear layer of this model")
            w = layer.weight
            factors[path] = _Factor(pair["A"].to(w.device, w.dtype), pair["B"].to(w.device, w.dtype), scale)
        self._adapters[name] = factors

    def save_peft(self, name: str, folder: str | Path, *, base_model: str | None = None) -> Path:
        """Write adapter ``name`` as peft's ``save_pretrained`` would (loadable by peft, vLLM and the engines)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        factors = self._adapters[name]
        tensors = {}
        for path, factor in factors.items():
            tensors[f"base_model.model.{path}.lora_A.weight"] = factor.a.detach().contiguous()
            tensors[f"base_model.model.{path}.lora_B.weight"] = factor.b.detach().contiguous()
        save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        first = next(iter(factors.values()))
        r = int(first.a.shape[0])
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": r,
            "lora_alpha": first.scale * r,
            "lora_dropout": first.dropout,
            "target_modules": sorted({path.rsplit(".", 1)[-1] for path in factors}),
            "bias": "none",
            "inference_mode": True,
            "base_model_name_or_path": base_model,
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
        }
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
        return folder

    def remove(self, name: str) -> None:
        del self._adapters[name]

    @contextlib.contextmanager
    def active(self, name: str | None) -> Iterator[None]:
        """Run the model with adapter ``name`` (None: the base model) in this thread/task for the block."""
        if name is not None and name not in self._adapters:
            raise KeyError(f"adapter {name!r} is not loaded; loaded: {self.names()}")
        token = _ACTIVE.set(name)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def detach(self) -> None:
        """Remove every hook: the model is the plain model again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _targeted(path: str, targets: list[str] | str) -> bool:
    if targets == "all-linear":
        return True
    names = [targets] if isinstance(targets, str) else targets
    return path.rsplit(".", 1)[-1] in names
