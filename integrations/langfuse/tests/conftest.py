"""Fixtures of the Langfuse integration's tests, from langgraph-art's public API and ``langgraph_art.testing``: the
offline tiny model and the embedded service with the weather tool agent loaded as ``weather@1``."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_art.models.tiny import tiny_model
from langgraph_art.serve import EmbeddedServer
from langgraph_art.testing import take_langfuse_keys

_REAL = take_langfuse_keys()  # real keys would make every Trainer here export: only the contract test gets them


@pytest.fixture(scope="session")
def real_langfuse() -> dict[str, str]:
    """The LANGFUSE_* variables the developer had set (taken out of the environment for every other test)."""
    return dict(_REAL)


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    import torch

    torch.set_num_threads(1)
    return tiny_model()


@pytest.fixture(scope="session")
def server(tiny_path: Path) -> Iterator[Any]:
    import httpx

    from langgraph_art.testing import tool_call_adapter

    adapter = tool_call_adapter(tiny_path)
    with EmbeddedServer(str(tiny_path), served_name="tiny") as running:
        httpx.post(f"{running.base_url}/adapters", json={"name": "weather@1", "path": str(adapter)}).raise_for_status()
        yield running
