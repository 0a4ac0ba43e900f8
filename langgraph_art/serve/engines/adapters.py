"""The HF engine's LoRA adapters, by public name, served merged into the base weights.

An adapter served through peft's LoRA layers costs two extra small matmuls (and a few Python calls) per targeted
layer on every forward: +45% per decode step on the 5M tiny model with all-linear LoRA. So a plain LoRA adapter
is kept as its factors ``(A, B, scale)`` per module, and while its batches run each targeted weight is
``W0 + scale * B @ A``, written from a pristine copy ``W0`` of that module's weight. Switching adapters rewrites
from ``W0``: no rounding error builds up over thousands of switches (merging and unmerging by subtraction is
close, not exact), and the base model is bit-for-bit the loaded one again. Cost: one copy of the targeted
weights in memory. Loading is reading one safetensors file (a few ms, against ~50 ms for peft to build modules),
which matters because the training loop hot-loads a new checkpoint after every step.

Adapters that are not plain LoRA on linear layers (DoRA, ``lora_bias``, ``modules_to_save``, rank or alpha
patterns, embeddings, ...) are loaded and served by peft, unmerged, on pristine weights; so is everything when
``merge=False``. Worker thread only.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from langgraph_art.errors import AdapterError, ModelNotFoundError
from langgraph_art.models.loading import quiet_transformers

_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")
# adapter_config.json fields that make an adapter more than W0 + scale * B @ A on linear layers
_NOT_PLAIN = (
    "use_dora",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "fan_in_fan_out",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "use_qalora",
)


@dataclass(frozen=True)
class Policy:
    """What a batch runs: ``model`` to call, and whether it is the plain architecture with its current weights
    (base model, or an adapter merged into them), which the fast decoder can run instead."""

    model: Any
    plain: bool


@dataclass(frozen=True)
class _Factor:
    linear: nn.Linear  # the targeted layer (peft may wrap it later; this stays its base layer)
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


@dataclass(eq=False)
class _Adapter:
    folder: str
    factors: dict[str, _Factor] | None  # module path -> its LoRA; None when peft serves the adapter
    peft_key: str | None = None  # set when peft serves it


class AdapterSet:
    def __init__(self, lm: Any, *, merge: bool = True) -> None:
        self._lm = lm
        self._merge = merge
        self._peft: Any = None  # created by the first adapter peft has to serve
        self._names: dict[str, _Adapter] = {}
        self._keys = itertools.count(1)
        self._pristine: dict[str, torch.Tensor] = {}  # module path -> W0, for every module an adapter merged into
        self._merged: _Adapter | None = None  # whose delta is in the weights now
        self.merges = 0  # observability: how many times an adapter was written into the weights

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def folders(self) -> dict[str, str]:
        return {name: adapter.folder for name, adapter in self._names.items()}

    def loaded(self) -> list[str]:
        return sorted(self._names)

    # -- load / unload ---------------------------------------------------------------------------------------
    def load(self, name: str, folder: str) -> None:
        factors = self._read_plain_lora(Path(folder)) if self._merge else None
        adapter = _Adapter(folder, factors)
        if factors is None:
            adapter.peft_key = self._load_with_peft(name, folder)
        previous = self._names.get(name)
        self._names[name] = adapter
        if previous is not None:  # replacing a name: the new weights are in place before the old go
            self._drop(previous)

    def unload(self, name: str) -> None:
        self._drop(self._names.pop(name))

    def _drop(self, adapter: _Adapter) -> None:
        if self._merged is adapter:
            self._restore()
        if adapter.peft_key is not None:
            with warnings.catch_warnings():  # peft warns that the active adapter changed: each batch sets its own
                warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
                self._peft.delete_adapter(adapter.peft_key)

    def _read_plain_lora(self, folder: Path) -> dict[str, _Factor] | None:
        """The adapter's factors per module, or None when it is not plain LoRA on this model's linear layers."""
        from safetensors.torch import load_file

        config = json.loads((folder / "adapter_config.json").read_text())
        weights = folder / "adapter_model.safetensors"
        if config.get("peft_type") != "LORA" or any(config.get(k) for k in _NOT_PLAIN) or not weights.is_file():
            return None
        rank, alpha = int(config.get("r", 8)), float(config.get("lora_alpha", 8))
        scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in load_file(str(weights)).items():
            match = _KEY.match(key)
            if match is None:
                return None
            pairs.setdefault(match.group(1), {})[match.group(2)] = tensor
        factors = {}
        tied = self._lm.get_input_embeddings().weight.data_ptr()
        for path, pair in pairs.items():
            linear = _base_linear(self._lm, path)
            if linear is None or set(pair) != {"A", "B"} or linear.weight.data_ptr() == tied:
                return None  # (a LoRA on an lm_head tied to the embeddings must not change the embeddings)
            a, b = pair["A"], pair["B"]
            if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
                raise AdapterError(
                    f"{folder}: {path} has LoRA shapes A{tuple(a.shape)} B{tuple(b.shape)}, which do not fit this "
                    f"model's layer ({linear.out_features}x{linear.in_features}) at rank {rank}: the adapter was "
                    "trained on another base model"
                )
            weight = linear.weight
            factors[path] = _Factor(linear, a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype), scale)
        return factors or None

    def _load_with_peft(self, name: str, folder: str) -> str:
        from peft import PeftModel

        key = f"adapter_{next(self._keys)}"
        self._restore()  # peft wraps the pristine weights
        try:
            if self._peft is None:
                with quiet_transformers():
                    self._peft = PeftModel.from_pretrained(self._lm, folder, adapter_name=key, is_trainable=False)
            else:
                self._peft.load_adapter(folder, adapter_name=key, is_trainable=False)
        except Exception as exc:
            raise AdapterError(f"could not load adapter {name!r} from {folder!r}: {exc}") from exc
        self._peft.eval()
        return key

    # -- serving ---------------------------------------------------------------------------------------------
    @contextmanager
    def use(self, name: str | None) -> Iterator[Policy]:
        """The model to run a batch for adapter ``name`` (None: the base model)."""
        adapter = None
        if name is not None:
            adapter = self._names.get(name)
            if adapter is None:
                raise ModelNotFoundError(f"adapter {name!r} was unloaded before the request ran")
        if adapter is not None and adapter.peft_key is not None:
            self._restore()
            self._peft.set_adapter(adapter.peft_key)
            yield Policy(self._peft, plain=False)
            return
        if adapter is None:
            self._restore()
        else:
            self._apply(adapter)
        if self._peft is None:
            yield Policy(self._lm, plain=True)
            return
        with self._peft.disable_adapter():  # peft's LoRA layers (other adapters) stay out of the way
            yield Policy(self._peft, plain=True)

    @torch.no_grad()
    def _apply(self, adapter: _Adapter) -> None:
        """Write ``W0 + scale * B @ A`` into every module the adapter targets (one fused op per module, straight
        from W0), and W0 back into modules only the previously merged adapter targeted."""
        if self._merged is adapter:
            return
        assert adapter.factors is not None
        if self._merged is not None:
            self._restore([p for p in self._merged.factors or {} if p not in adapter.factors])
        for path, factor in adapter.factors.items():
            weight = factor.linear.weight
            if path not in self._pristine:  # first merge into this module: the weight is W0 now
                self._pristine[path] = weight.detach().clone()
            torch.addmm(self._pristine[path], factor.b, factor.a, alpha=factor.scale, out=weight)  # [out, r] @ [r, in]
        self._merged = adapter
        self.merges += 1

    @torch.no_grad()
    def _restore(self, paths: list[str] | None = None) -> None:
        """Put W0 back in ``paths`` (default: every module the merged adapter changed, which is then unmerged)."""
        if self._merged is None:
            return
        factors = self._merged.factors or {}
        for path in paths if paths is not None else list(factors):
            factors[path].linear.weight.copy_(self._pristine[path])
        if paths is None:
            self._merged = None


def _base_linear(lm: Any, path: str) -> nn.Linear | None:
    """The ``nn.Linear`` at ``path`` (under peft's wrapper when peft has wrapped it), or None."""
    try:
        module = lm.get_submodule(path)
    except AttributeError:
        return None
    if hasattr(module, "get_base_layer"):
        module = module.get_base_layer()
    return module if type(module) is nn.Linear else None
