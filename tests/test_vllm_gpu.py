"""What only a GPU shows about the vLLM engine (``gpu`` marker: skipped without CUDA; ``benchmarks/gpu_check.sh``
runs them on a lent GPU). Written against the CPU build; not yet run on a GPU (no GPU was lent while they were
written): a first run may need its tolerances read off, not just checked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.test_engine_conformance import lora_folder, max_gap, prompt, trainer_logprobs, vllm_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="needs vLLM 0.32 (the CUDA build)"),
]


@pytest.fixture(scope="module")
def model() -> Path:
    from langgraph_art.models.loading import resolve_model

    return Path(resolve_model("tiny-128"))


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 2e-3), ("bfloat16", 0.1)])
def test_logprobs_agree_with_the_trainer_on_cuda(model: Path, dtype: str, tolerance: float) -> None:
    """fp32 agrees to TF32/kernel noise; bf16 kernels differ per token (why the loss keeps the importance ratio)."""
    import torch
    from transformers import AutoModelForCausalLM

    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
    from langgraph_art.serve.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(str(model), device="cuda", dtype=dtype, gpu_memory_utilization=0.2, enable_sleep_mode=False)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()  # the trainer's fp32 view, CPU
    with EmbeddedServer(engine) as server:
        ids = prompt(server)
        params = SamplingParams(temperature=0.8, max_tokens=32, n=8, seed=0)
        result = server.run(engine.generate(GenerationRequest(ids, params)))
    gaps = []
    for sample in result.samples:
        want = trainer_logprobs(reference, ids, sample.token_ids, 0.8)
        gaps.append(sum(abs(a - b) for a, b in zip(want, sample.logprobs, strict=True)) / len(want))
    print(f"{dtype}: mean |logprob gap| per token {sum(gaps) / len(gaps):.2e}, worst sample {max(gaps):.2e}")
    assert max(gaps) < tolerance


def test_adapter_swaps_under_load_serve_each_request_its_own_weights(model: Path, tmp_path: Path) -> None:
    import copy

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
    from langgraph_art.serve.engines.vllm.engine import VLLMEngine
    from langgraph_art.serve.publish import publish
    from langgraph_art.types import ModelRef

    folders = [lora_folder(model, tmp_path / f"s{i}", i) for i in range(4)]
    engine = VLLMEngine(str(model), device="cuda", dtype="float32", max_lora_rank=8, gpu_memory_utilization=0.2)
    with EmbeddedServer(engine) as server:
        ids = prompt(server)

        async def load_and_sample() -> list[tuple[int, Any]]:
            results = []
            for step, folder in enumerate(folders, 1):
                await publish(engine, ModelRef("p", step), folder, keep_loaded=2)
                batch = [GenerationRequest(ids, SamplingParams(max_tokens=16, seed=i), adapter=f"p@{step}")
                         for i in range(64)]  # fmt: skip
                results += [(step, r) for r in await asyncio.gather(*(engine.generate(r) for r in batch))]
            return results

        results = server.run(load_and_sample())
    base = AutoModelForCausalLM.from_pretrained(model).eval()
    for step, result in results[::32]:
        tuned = PeftModel.from_pretrained(copy.deepcopy(base), str(folders[step - 1])).eval()
        want = trainer_logprobs(tuned, ids, result.samples[0].token_ids, 1.0)
        assert max_gap(want, result.samples[0].logprobs) < 2e-3, f"step {step} served other weights"


def test_training_steps_share_the_gpu_with_vllm_asleep(tmp_path: Path) -> None:
    import torch

    import langgraph_art as art
    from tests.test_async_training import SCENARIOS, assert_trained, async_node_graph, varied

    options = {"gpu_memory_utilization": 0.3, "max_lora_rank": 8}
    with art.LocalBackend(home=tmp_path, engine="vllm", device="cuda", engine_options=options) as backend:
        model = art.TrainableModel(name="agent", project="gpu", base_model="tiny-128").register(backend)
        engine = backend.server("tiny-128").engine
        assert engine.can_sleep
        calls: list[str] = []
        sleep, wake = engine.sleep, engine.wake_up

        async def counted_sleep() -> None:
            calls.append("sleep")
            await sleep()
            calls.append(f"asleep, {torch.cuda.memory_reserved() >> 20} MiB reserved by torch here")

        async def counted_wake() -> None:
            await wake()
            calls.append("awake")

        engine.sleep, engine.wake_up = counted_sleep, counted_wake
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=16)  # type: ignore[call-arg,arg-type]
        trainer = art.Trainer(async_node_graph(llm), model, rewards=[varied], num_generations=4,
                              config=art.GRPOConfig(learning_rate=1e-4, seed=0, lora_r=8))  # fmt: skip
        history = trainer.train(SCENARIOS, steps=3, progress=False)
        print(calls)
        assert_trained(history, 3)
        assert [c for c in calls if c in ("sleep", "awake")] == ["sleep", "awake"] * 3
        assert all(abs(m["train/mismatch/is_weight"] - 1.0) < 0.05 for m in history), history
        assert {"gpu/agent@2", "gpu/agent@3"} <= set(engine.adapters())


def test_structured_output_on_cuda_replays_and_its_logprobs_are_masked(model: Path) -> None:
    """The CUDA build applies the grammar bitmask in its GPU model runner (the CPU build's path is tested in
    test_engine_conformance.py): every sampled token must replay under the grammar, and the logprobs must be of the
    masked distribution (forced tokens at 0), within bf16's per-token noise."""
    import torch
    from transformers import AutoModelForCausalLM

    from langgraph_art.models.grammar import unpack
    from langgraph_art.serve.embedded import EmbeddedServer
    from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams
    from langgraph_art.serve.engines.vllm.engine import VLLMEngine
    from langgraph_art.train.loss import token_logprobs_and_entropy
    from tests.test_engine_conformance import route_grammar

    engine = VLLMEngine(str(model), device="cuda", dtype="bfloat16", gpu_memory_utilization=0.2)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with EmbeddedServer(engine) as server:
        ids, grammar = prompt(server, "route this: the weather in paris"), route_grammar(server)
        request = GenerationRequest(ids, SamplingParams(temperature=1.0, max_tokens=40, n=8, seed=0), grammar=grammar)
        result = server.run(engine.generate(request))
        grammars = engine.grammars()
    for sample in result.samples:
        replay = grammars.replay(grammar, sample.token_ids)
        assert replay is not None
        with torch.no_grad():
            logits = reference(torch.tensor([ids + sample.token_ids])).logits[:, len(ids) - 1 : -1]
        allowed = unpack(replay.packed, grammars.vocab_size)[None, :, : logits.shape[-1]]
        want = token_logprobs_and_entropy(logits, torch.tensor([sample.token_ids]), torch.ones(1), allowed)[0][0]
        assert max_gap(want.tolist(), sample.logprobs) < 0.1 and abs(sample.logprobs[0]) < 1e-3
