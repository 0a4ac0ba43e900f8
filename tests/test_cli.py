"""The ``langgraph-art`` command line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from langgraph_art.cli import app, is_loopback
from tests.test_engine_conformance import ENGINES


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.9.9.9")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("no-such-host.invalid")


def test_serve_refuses_public_bind_without_key() -> None:
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0"], env={"LANGGRAPH_ART_API_KEY": ""})
    assert result.exit_code == 2
    assert "--api-key" in result.output and "127.0.0.1" in result.output


def test_serve_refuses_the_other_engines_options() -> None:
    result = CliRunner().invoke(app, ["serve", "--engine", "vllm", "--no-merge-adapters"])
    assert result.exit_code == 2 and "['merge_adapters'] belong to engine='hf'" in result.output
    result = CliRunner().invoke(app, ["serve", "--max-loras", "2"])
    assert result.exit_code == 2 and "['max_loras'] belong to engine='vllm'" in result.output
    result = CliRunner().invoke(app, ["serve", "--trainer-process", "--share-weights"])
    assert result.exit_code == 2 and "cannot share the engine's: drop share_weights (--share-weights)" in result.output
    result = CliRunner().invoke(app, ["serve", "--trainer-ranks", "2", "--share-weights"])
    assert result.exit_code == 2 and "cannot share the engine's: drop share_weights (--share-weights)" in result.output
    result = CliRunner().invoke(app, ["serve", "--trainer-ranks", "0"])
    assert result.exit_code == 2 and "(--trainer-ranks) must be an int >= 1" in result.output
    assert "got 0" in result.output


def test_fetch_builds_aliases_into_the_cache_and_refuses_what_it_cannot_fetch(tmp_path, monkeypatch) -> None:
    """``langgraph-art fetch`` builds an alias now and prints its folder (a second fetch finds it built); a name it
    cannot fetch (a hub id) and a GGUF file that is not there exit 2 saying what to pass."""
    from pathlib import Path

    monkeypatch.setenv("LANGGRAPH_ART_CACHE", str(tmp_path / "cache"))
    first = CliRunner().invoke(app, ["fetch", "tiny-5m"])
    assert first.exit_code == 0, first.output
    folder = Path(first.output.strip().split(": ", 1)[1])
    assert folder.is_relative_to(tmp_path / "cache") and (folder / "config.json").is_file()
    again = CliRunner().invoke(app, ["fetch", "tiny-5m"])
    assert again.exit_code == 0 and again.output == first.output
    hub = CliRunner().invoke(app, ["fetch", "Qwen/Qwen2.5-0.5B-Instruct"])
    assert hub.exit_code == 2 and "not an alias or a GGUF file" in hub.output and "qwen2.5-coder-0.5b" in hub.output
    missing = CliRunner().invoke(app, ["fetch", str(tmp_path / "absent.gguf")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("engine", ENGINES)
def test_serve_subprocess_answers_then_stops(tiny_path, engine: str) -> None:
    if engine == "vllm":
        from langgraph_art.models.loading import resolve_model

        tiny_path = resolve_model("tiny-128")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "langgraph_art.cli",
            "serve",
            "--model",
            str(tiny_path),
            "--served-name",
            "tiny",
            "--port",
            str(port),
            "--engine",
            engine,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        else:
            raise AssertionError("serve did not answer /health in 180 s")
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] <= 4
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
    output = proc.stdout.read() if proc.stdout else ""
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells how the process ended
    assert code in (0, -15), output
    assert "Application shutdown complete" in output
