"""The offline tiny model: deterministic, content-addressed, a normal HF folder with a tool-aware template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from langgraph_art.models.tiny import NORM_SCALE, compile_chat_template, render_chat, tiny_model, tiny_recipe


def _digest(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja")
    }


@pytest.mark.slow
def test_build_is_deterministic_and_content_addressed(tiny_path: Path, tmp_path: Path) -> None:
    rebuilt = tiny_model(cache_dir=tmp_path)
    assert rebuilt.name == tiny_path.name  # same recipe, same address
    assert _digest(rebuilt) == _digest(tiny_path)  # byte-identical
    assert tiny_model(cache_dir=tmp_path) == rebuilt  # second call is a cache hit
    assert not [p for p in rebuilt.parent.iterdir() if p.name.startswith(".")]  # no staging leftovers


@pytest.mark.slow
def test_two_environments_sharing_one_cache_each_keep_their_own_entry(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.venv`` and ``.venv-vllm`` share one cache with other transformers versions (and a run under
    ATEN_CPU_CAPABILITY=default shares it with other CPU kernels): a folder written by one is never read as the
    other's (its config.json, its weights' last bits differ), because what wrote it is part of the address."""
    from langgraph_art.models import tiny

    ours = tiny.build_environment()
    assert set(ours) == {"torch", "transformers", "tokenizers", "safetensors", "cpu_capability"}
    assert tiny_recipe()["writers"] == ours
    other = {**ours, "transformers": ours["transformers"] + ".other"}
    monkeypatch.setattr(tiny, "build_environment", lambda: other)
    theirs = tiny_model(cache_dir=tmp_path)  # the other environment writes first
    assert json.loads((theirs / "recipe.json").read_text())["writers"] == other
    monkeypatch.undo()
    mine = tiny_model(cache_dir=tmp_path)  # then this one: its own entry, not theirs
    assert mine != theirs and mine.name == tiny_path.name
    assert _digest(mine) == _digest(tiny_path)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == sorted([mine.name, theirs.name])


def test_recipe_change_changes_address() -> None:
    assert tiny_recipe(seed=0) != tiny_recipe(seed=1)
    assert tiny_recipe(hidden_size=256)["intermediate_size"] == 1024


def test_bad_sizes_are_refused_with_a_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        tiny_model(hidden_size=50, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="at least 600"):
        tiny_model(vocab_size=100, cache_dir=tmp_path)


def test_folder_loads_through_from_pretrained(tiny_path: Path) -> None:
    import torch

    from langgraph_art.models.loading import load_causal_lm, resolve_model

    assert resolve_model("tiny") == str(tiny_path)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # hub ids pass through
    model, tok = load_causal_lm(str(tiny_path), device="cpu")
    assert model.config.model_type == "qwen2"
    assert 200_000 < sum(p.numel() for p in model.parameters()) < 400_000
    assert torch.all(model.model.norm.weight == NORM_SCALE)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert json.loads((tiny_path / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_missing_local_folder_is_a_clear_error(tmp_path: Path) -> None:
    from langgraph_art.models.loading import load_causal_lm

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nope" / "model"))


def test_reloaded_tokenizer_encodes_like_the_trained_one(tiny_path: Path, tokenizer) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    samples = [
        "12345 and 67",
        "Hello wörld!",
        '<tool_call>{"name": "x", "arguments": {}}</tool_call>',
        "  two  spaces\n\nx",
    ]
    for text in samples:
        assert tokenizer.encode(text) == raw.encode(text).ids, text
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # tool markers are single ordinary tokens that survive skip_special_tokens; ChatML markers are special
    call = tokenizer.encode("<tool_call>")
    assert len(call) == 1 and tokenizer.decode(call, skip_special_tokens=True) == "<tool_call>"
    assert tokenizer.decode(tokenizer.encode("<|im_end|>"), skip_special_tokens=True) == ""


def test_chat_template_renders_tools_calls_and_results(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+2"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "tool", "tool_call_id": "c2", "content": "5"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n")
    assert '<tool_call>{"name": "calc", "arguments": {"x": "2+2"}}</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>4</tool_response>\n<tool_response>5</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # the package's own renderer (used for the corpus) matches transformers' rendering
    assert (
        render_chat({"messages": messages, "tools": tools}, compile_chat_template()) + "<|im_start|>assistant\n" == text
    )


def test_chat_template_keeps_later_system_messages_in_place(tokenizer) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}, {"role": "system", "content": "c"}],
        tokenize=False,
    )
    assert text == "<|im_start|>system\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>system\nc<|im_end|>\n"


def test_chat_template_refuses_unknown_roles(tokenizer) -> None:
    with pytest.raises(Exception, match="unknown role: wizard"):
        tokenizer.apply_chat_template([{"role": "wizard", "content": "a"}], tokenize=False)
