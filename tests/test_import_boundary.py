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
        "langgraph_art.integrations.langfuse, langgraph_art.serve.engines.vllm_engine, "
        "langgraph_art.serve.engines.choose, langgraph_art.loop, langgraph_art.sinks, langgraph_art.evaluation; "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_lazy_names_resolve() -> None:
    code = "import langgraph_art as a; print(a.tiny_model.__name__, a.EmbeddedServer.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["tiny_model", "EmbeddedServer"]


def test_unknown_attribute_is_a_clear_error() -> None:
    import langgraph_art

    try:
        langgraph_art.does_not_exist  # noqa: B018
    except AttributeError as exc:
        assert "does_not_exist" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")
