"""Build a tiny Qwen2-architecture chat model offline, deterministically, and cache it.

Nothing is downloaded: a synthetic chat corpus trains a byte-level BPE tokenizer with the exact pipeline
transformers uses for Qwen2 (so reloading the folder encodes the same way), a random-init ``Qwen2ForCausalLM``
is built from a fixed seed, and both are saved as a normal Hugging Face folder that
``from_pretrained`` loads like any hub model.

Shortcut, named: the final norm weight is set to ``NORM_SCALE`` (16) at build time. A random-init model's logits
are too flat for LoRA on attention/MLP layers to move the policy; this one line makes it learnable (measured when it
was chosen: scale 8 learned partially, 4 not at all).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from langgraph_art.models.quiet import quiet_transformers

BUILD_VERSION = 1
NORM_SCALE = 16.0
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)

_WORDS = (
    "the a an of to in on for with and or but not is are was be have has do does what which who when where "
    "why how this that these those it you we they he she i me my your our their please thanks hello hi yes no "
    "find search look get give show tell make call use answer question result results number numbers word "
    "words city weather today tomorrow time date email emails inbox send read write file files name names "
    "list item items value values count total sum add subtract multiply divide price cost order orders user "
    "users data tool tools function query text good bad best first last next previous more less many few all "
    "some any each every other new old small large long short high low here there now then again done ok sure "
    "sorry can could would should will may might must need want know think see say ask try help work run stop "
    "start agent model graph node state step plan check verify report summary note notes title subject "
    "meeting project task tasks issue bug fix code test tests error errors reward score good great paris "
    "london tokyo berlin rome madrid alice bob carol dave erin frank monday tuesday friday sunday january "
    "march july"
).split()
_TOOLS = [
    ("search", "Search the knowledge base", {"query": "string"}),
    ("calculator", "Evaluate an arithmetic expression", {"expression": "string"}),
    ("get_weather", "Get the weather for a city", {"city": "string", "unit": "string"}),
    ("read_email", "Read an email by id", {"email_id": "integer"}),
    ("lookup", "Look up a record by key", {"key": "string", "limit": "integer"}),
]


def _tool_schema(name: str, description: str, params: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in params.items()},
                "required": list(params),
            },
        },
    }


def _sentence(rng: random.Random, low: int = 3, high: int = 12) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(low, high)):
        roll = rng.random()
        if roll < 0.12:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
        elif roll < 0.2:
            parts.append("".join(rng.choice("bcdfghjklmnprstvwz") + rng.choice("aeiou") for _ in range(2)))
        else:
            parts.append(rng.choice(_WORDS))
    text = " ".join(parts)
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ""])


def _arguments(rng: random.Random, params: dict[str, str]) -> dict[str, Any]:
    return {
        key: rng.randint(1, 999) if kind == "integer" else " ".join(rng.sample(_WORDS, rng.randint(1, 3)))
        for key, kind in params.items()
    }


def synthetic_conversations(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Seeded ChatML-style conversations (plain chat, tool calls, tool results) for tokenizer and warm-up data."""
    rng = random.Random(seed)
    conversations: list[dict[str, Any]] = []
    for _ in range(count):
        messages: list[dict[str, Any]] = []
        tools = None
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": _sentence(rng, 4, 10)})
        if rng.random() < 0.5:
            chosen = rng.sample(_TOOLS, rng.randint(1, 3))
            tools = [_tool_schema(*tool) for tool in chosen]
            messages.append({"role": "user", "content": _sentence(rng)})
            name, _, params = rng.choice(chosen)
            call = {
                "id": f"call_{rng.randint(0, 10**6)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(_arguments(rng, params))},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": _sentence(rng)})
            messages.append({"role": "assistant", "content": _sentence(rng)})
        else:
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": _sentence(rng)})
                messages.append({"role": "assistant", "content": _sentence(rng, 2, 20)})
        conversations.append({"messages": messages, "tools": tools})
    return conversations


def chat_template() -> str:
    """The package's ChatML-with-tools Jinja template (also written into every tiny model folder)."""
    return resources.files("langgraph_art.models").joinpath("chat_template.jinja").read_text()


def compile_chat_template(template: str | None = None) -> Any:
    """Compile the template the way transformers does (sandboxed Jinja, ``tojson`` without HTML escaping)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template or chat_template())


def render_chat(conversation: dict[str, Any], compiled: Any = None) -> str:
    """Render one conversation (``messages`` and optional ``tools``) to ChatML text."""
    compiled = compiled or compile_chat_template()
    return str(
        compiled.render(messages=conversation["messages"], tools=conversation.get("tools"), add_generation_prompt=False)
    )


WRITERS = ("torch", "transformers", "tokenizers", "safetensors")


def build_environment() -> dict[str, str]:
    """What writes the folder's files besides the recipe: the installed versions of the packages that write them
    (another transformers writes another ``config.json``: its own ``transformers_version``, new default keys), and the
    CPU kernels torch picked (``torch.backends.cpu.get_cpu_capability()``: its vectorised random normal rounds the
    initial weights differently from the scalar one, by a unit in the last place; measured with
    ATEN_CPU_CAPABILITY=default, which CI's other CPUs can differ by). Part of the recipe, so two environments that
    share one cache (``.venv`` and ``.venv-vllm`` do) each build and read their own entry, and an entry always holds
    what its address says, byte for byte."""
    from importlib.metadata import version

    import torch

    return {**{name: version(name) for name in WRITERS}, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def tiny_recipe(vocab_size: int = 2048, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> dict:
    """Everything that determines the built folder, the writers' versions included; its hash names the cache entry."""
    return {
        "build_version": BUILD_VERSION,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "norm_scale": NORM_SCALE,
        "corpus_size": 3000,
        "seed": seed,
        "template_sha": hashlib.sha256(chat_template().encode()).hexdigest()[:16],
        "builder_sha": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16],
        "writers": build_environment(),
    }


def default_cache_dir() -> Path:
    from langgraph_art.cache import cache_root

    return cache_root()


def tiny_model(
    *,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Return the folder of a tiny, offline-built Qwen2 chat model, building it on first use.

    The folder lives under ``<cache>/tiny/<hash of the recipe>``, so a changed recipe (or other versions of the
    packages that write it, or other CPU kernels: ``build_environment``) never reuses a stale build;
    it is written to a temporary folder and renamed into place, so a killed build leaves no half folder.
    ``hidden_size=256, num_layers=6`` gives the ~5M-parameter variant used by the benchmarks.
    """
    if hidden_size % 16 or hidden_size < 32:
        raise ValueError(f"hidden_size must be a multiple of 16 and at least 32 (4 heads x 16+), got {hidden_size}")
    if vocab_size < 600:
        raise ValueError(f"vocab_size must be at least 600 to hold the byte alphabet and specials, got {vocab_size}")
    recipe = tiny_recipe(vocab_size, hidden_size, num_layers, seed)
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:20]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "tiny" / digest
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
    try:
        _build(recipe, staging)
        (staging / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
        try:
            staging.rename(target)
        except OSError:  # another process finished the same build first; theirs is identical
            if not (target / "config.json").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _train_tokenizer(recipe: dict, texts: list[str]) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"] - len(TOOL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in TOOL_TOKENS])
    return tokenizer


def _build(recipe: dict, folder: Path) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    template = chat_template()
    compiled = compile_chat_template(template)
    texts = [render_chat(c, compiled) for c in synthetic_conversations(recipe["corpus_size"], recipe["seed"])]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(recipe, texts),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=recipe["max_position_embeddings"],
    )
    fast.chat_template = template
    fast.save_pretrained(folder)
    _set_tokenizer_class(folder / "tokenizer_config.json")
    (folder / "chat_template.jinja").write_text(template)

    config = Qwen2Config(
        vocab_size=recipe["vocab_size"],
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        head_dim=recipe["hidden_size"] // recipe["num_attention_heads"],  # type: ignore[call-arg]
        max_position_embeddings=recipe["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=int(fast.convert_tokens_to_ids("<|im_end|>")),  # type: ignore[arg-type]
        pad_token_id=int(fast.convert_tokens_to_ids("<|endoftext|>")),  # type: ignore[arg-type]
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(recipe["norm_scale"])
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_p = 1.0
    model.generation_config.top_k = 0
    with quiet_transformers():
        model.save_pretrained(folder)


def _set_tokenizer_class(path: Path) -> None:
    data = json.loads(path.read_text())
    data["tokenizer_class"] = "Qwen2Tokenizer"
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
