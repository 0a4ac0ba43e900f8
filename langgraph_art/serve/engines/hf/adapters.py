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
``merge=False``.

On weights shared with a trainer (``lora=``, a ``models.lora.HookedLora``) nothing is ever merged: the trainer
must see the base weights, and an exact unmerge needs the pristine copy that sharing saves. Plain LoRA adapters are
then served through the hooks (transformers' forward) or ``FastLM``'s fused LoRA path (``prepare_fast``); others
are refused, since peft's wrappers would also act in the trainer's forward. Worker thread only.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from langgraph_art.errors import AdapterError, ModelNotFoundError
from langgraph_art.models.lora import Factor, HookedLora, read_plain_lora
from langgraph_art.models.quiet import quiet_transformers


@dataclass(frozen=True)
class Policy:
    """What a batch runs: ``model`` to call, and whether it is the plain architecture with its current weights
    (base model, or an adapter merged into them), which the fast decoder can run instead."""

    model: Any
    plain: bool
    fast_lora: Any = None  # the adapter in FastLM's fused layout, when served unmerged on shared weights
    key: int = 0  # names the weights: 0 the base model, each loaded adapter its own (a reload gets a new one)


@dataclass(eq=False)
class _Adapter:
    folder: str
    factors: dict[str, Factor] | None  # module path -> its LoRA; None when peft serves the adapter
    key: int  # unique per loaded adapter (``Policy.key``)
    peft_key: str | None = None  # set when peft serves it
    hooked: str | None = None  # its name in the shared HookedLora
    fast_lora: Any = None


class AdapterSet:
    def __init__(
        self,
        lm: Any,
        *,
        merge: bool = True,
        lora: HookedLora | None = None,
        prepare_fast: Callable[[dict[str, Factor]], Any] | None = None,
    ) -> None:
        self._lm = lm
        self._merge = merge and lora is None
        self._lora, self._prepare_fast = lora, prepare_fast
        self._peft: Any = None  # created by the first adapter peft has to serve
        self._names: dict[str, _Adapter] = {}
        self._keys = itertools.count(1)
        self._serials = itertools.count(1)  # Policy.key of each adapter read or loaded
        self._pristine: dict[str, torch.Tensor] = {}  # module path -> W0, for every module an adapter merged into
        self._merged: _Adapter | None = None  # whose delta is in the weights now
        self.merges = 0  # observability: how many times an adapter was written into the weights

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def folders(self) -> dict[str, str]:
        return {name: adapter.folder for name, adapter in self._names.items()}

    def loaded(self) -> list[str]:
        return sorted(self._names)

    def keys(self) -> set[int]:
        """The ``Policy.key`` of the base model and of every adapter loaded now."""
        return {0, *(adapter.key for adapter in self._names.values())}

    # -- load / unload ---------------------------------------------------------------------------------------
    def load(self, name: str, folder: str) -> None:
        factors = read_plain_lora(self._lm, Path(folder)) if self._merge or self._lora is not None else None
        adapter = _Adapter(folder, factors, next(self._serials))
        if self._lora is not None:
            if factors is None:
                raise AdapterError(
                    f"adapter {name!r} ({folder}) is not plain LoRA on linear layers (DoRA, modules_to_save, "
                    "embeddings ...): on weights shared with the trainer only plain LoRA is served; start the engine "
                    "with share_weights=False to serve it through peft"
                )
            if self._prepare_fast is not None:  # FastLM runs every batch: its fused copy is all that is kept
                adapter.fast_lora, adapter.factors = self._prepare_fast(factors), None
            else:
                adapter.hooked = f"served:{next(self._keys)}"
                self._lora.add(adapter.hooked, factors)
        elif factors is None:
            adapter.peft_key = self._load_with_peft(name, folder)
        previous = self._names.get(name)
        self._names[name] = adapter
        if previous is not None:  # replacing a name: the new weights are in place before the old go
            self._drop(previous)

    def read(self, folder: str) -> _Adapter | None:
        """The adapter in ``folder``, read ahead so that ``add`` can put it in while a batch runs: only for merged
        plain LoRA (None otherwise: peft's loading and the shared model's hooks change what a running batch
        uses, so those load between batches). Reads files and the model's shapes only: safe from any thread."""
        if not self._merge:
            return None
        factors = read_plain_lora(self._lm, Path(folder))
        return _Adapter(folder, factors, next(self._serials)) if factors is not None else None

    def add(self, name: str, adapter: _Adapter) -> bool:
        """Add an adapter from ``read`` under a new name (a running batch merged another one: untouched); False
        when ``name`` is loaded already (replacing it waits for the batches that use it)."""
        if name in self._names:
            return False
        self._names[name] = adapter
        return True

    def unload(self, name: str) -> None:
        self._drop(self._names.pop(name))

    def _drop(self, adapter: _Adapter) -> None:
        if adapter.hooked is not None and self._lora is not None:
            self._lora.remove(adapter.hooked)
        if self._merged is adapter:
            self._restore()
        if adapter.peft_key is not None:
            with warnings.catch_warnings():  # peft warns that the active adapter changed: each batch sets its own
                warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
                self._peft.delete_adapter(adapter.peft_key)

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
        if self._lora is not None:
            with self._lora.active(adapter.hooked if adapter is not None else None):  # None: FastLora or base
                fast_lora = adapter.fast_lora if adapter is not None else None
                yield Policy(self._lm, plain=True, fast_lora=fast_lora, key=adapter.key if adapter is not None else 0)
            return
        if adapter is not None and adapter.peft_key is not None:
            self._restore()
            self._peft.set_adapter(adapter.peft_key)
            yield Policy(self._peft, plain=False, key=adapter.key)
            return
        if adapter is None:
            self._restore()
        else:
            self._apply(adapter)
        key = adapter.key if adapter is not None else 0
        if self._peft is None:
            yield Policy(self._lm, plain=True, key=key)
            return
        with self._peft.disable_adapter():  # peft's LoRA layers (other adapters) stay out of the way
            yield Policy(self._peft, plain=True, key=key)

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
