"""What travels to the Ray workers: the graph, cloudpickled with LangGraph's sentinels by reference (``dumps``)."""

from __future__ import annotations

import importlib
import io
import pickle
import sys
from typing import Any


def _module_attribute(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _sentinels() -> dict[int, tuple[str, str]]:
    """Every module-level bare ``object()`` of the modules loaded now, by id -> (module, name)."""
    found: dict[int, tuple[str, str]] = {}
    for name, module in list(sys.modules.items()):
        if name == "__main__" or getattr(module, "__spec__", None) is None:
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for attribute, value in items:
            if type(value) is object:
                found.setdefault(id(value), (name, attribute))
    return found


def dumps(obj: Any) -> bytes:
    """cloudpickle ``obj`` with module-level sentinels pickled by reference.

    LangGraph marks things with bare sentinels and tests them by identity (``PASSTHROUGH = object()`` in a compiled
    graph's channel writes, ``MISSING`` in its channels): cloudpickle copies them by value, and the loaded graph
    fails its first run ("InvalidUpdateError: Expected dict, got <object object at ...>"). Here every bare
    ``object()`` that is an attribute of an imported module is pickled as that attribute, so it loads as the very
    sentinel the receiving process's LangGraph compares against."""
    from ray import cloudpickle

    sentinels = _sentinels()

    class _Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is object and id(obj) in sentinels:
                return _module_attribute, sentinels[id(obj)]
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
