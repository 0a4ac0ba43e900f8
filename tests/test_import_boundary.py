"""`import langgraph_art` must stay light: no heavy framework may load as a side effect."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "vllm", "fastapi", "langfuse", "uvicorn", "wandb")


def test_import_langgraph_art_loads_no_heavy_module() -> None:
    code = f"import json, sys, langgraph_art; print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_light_submodules_stay_light() -> None:
    code = (
        "import json, sys; import langgraph_art.errors, langgraph_art.serve.engines.base, "
        "langgraph_art.serve.protocol, langgraph_art.cli, langgraph_art.models.loading, "
        "langgraph_art.serve, langgraph_art.serve.engines.vllm.engine, "
        "langgraph_art.serve.engines.choose, langgraph_art.loop, langgraph_art.sinks, langgraph_art.evaluation; "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_lazy_names_resolve() -> None:
    code = (
        "import langgraph_art as a, langgraph_art.serve as s; "
        "print(a.Trainer.__name__, a.ChatART.__name__, s.EmbeddedServer.__name__, s.build_engine.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["Trainer", "ChatART", "EmbeddedServer", "build_engine"]


def test_every_public_name_resolves_and_the_version_comes_from_the_metadata() -> None:
    from importlib.metadata import version

    import langgraph_art
    import langgraph_art.serve

    for module in (langgraph_art, langgraph_art.serve):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    assert langgraph_art.__version__ == version("langgraph-art")
    assert (
        len(langgraph_art.__all__) <= 35
    )  # the workflow (Teacher: 35), its data, extension points, errors; no internals


def test_the_errors_a_caller_handles_are_public_names() -> None:
    """What the public API raises on purpose (``model.pin`` a step that is not kept: ``ModelNotFoundError``)."""
    import langgraph_art
    from langgraph_art import errors

    for name in ("ConfigError", "ModelNotFoundError", "RewardError", "RolloutError", "ServiceBusyError",
                 "TrainingAborted", "LangGraphArtError"):  # fmt: skip
        assert name in langgraph_art.__all__, name
        assert getattr(langgraph_art, name) is getattr(errors, name), name


def test_unknown_attribute_is_a_clear_error() -> None:
    import langgraph_art

    try:
        langgraph_art.does_not_exist  # noqa: B018
    except AttributeError as exc:
        assert "does_not_exist" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_the_package_docstring_says_where_things_are() -> None:
    """Each place the package docstring sends a reader holds what it says: the tiny models, the test helpers."""
    import importlib
    import re

    import langgraph_art

    text = " ".join((langgraph_art.__doc__ or "").split())
    tiny = re.search(r"tiny models in ``([\w.]+)``", text)
    helpers = re.search(r"``FakeBackend``\) in ``([\w.]+)``", text)
    assert tiny and helpers, text
    assert hasattr(importlib.import_module(tiny.group(1)), "tiny_model"), tiny.group(1)
    assert hasattr(importlib.import_module(helpers.group(1)), "FakeBackend"), helpers.group(1)
