"""One copy of the base weights per process (issue 14): the HF engine serves adapters unmerged on weights that
the trainer trains on, and the two take turns."""

from __future__ import annotations

import asyncio
import copy
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import langgraph_art as art  # noqa: E402
from langgraph_art.errors import AdapterError, ConfigError  # noqa: E402
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from tests.helpers import async_wait_until, digit_share, one_agent_graph  # noqa: E402
from tests.test_fast_decode import prompts, save_adapter  # noqa: E402


@pytest.fixture(scope="module")
def plain_adapters(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shared-adapters")
    return {
        "a": save_adapter(tiny_path, root / "a", seed=1),
        "b": save_adapter(tiny_path, root / "b", seed=2, targets=["q_proj", "v_proj", "down_proj"]),
        "dora": save_adapter(tiny_path, root / "dora", seed=3, use_dora=True),
    }


@pytest.fixture
async def shared(tiny_path: Path, plain_adapters: dict[str, Path]) -> AsyncIterator[dict[str, HFEngine]]:
    """Shared weights through FastLM's fused LoRA and through the hooks, against transformers + peft."""
    engines = {
        "fast": HFEngine(str(tiny_path), max_batch_size=16, share_weights=True),
        "hooks": HFEngine(str(tiny_path), max_batch_size=16, share_weights=True, fast_decode=False),
        "peft": HFEngine(str(tiny_path), max_batch_size=16, fast_decode=False, merge_adapters=False),
    }
    for engine in engines.values():
        await engine.start()
        for name in ("a", "b"):
            await engine.load_adapter(f"{name}@1", str(plain_adapters[name]))
    yield engines
    for engine in engines.values():
        await engine.close()


async def test_unmerged_adapters_on_shared_weights_sample_what_peft_samples(
    shared: dict[str, HFEngine], tiny_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    fast, hooks, peft = shared["fast"], shared["hooks"], shared["peft"]
    assert fast._fast is not None and hooks._fast is None
    assert fast.shared_base is not None and fast.can_sleep and not peft.can_sleep
    requests = [
        GenerationRequest(ids, SamplingParams(temperature=1.0, max_tokens=10, n=2, seed=3 + i), adapter=adapter)
        for adapter in (None, "a@1", "b@1", "a@1")
        for i, ids in enumerate(prompts(fast))
    ]
    want = await asyncio.gather(*(peft.generate(copy.deepcopy(r)) for r in requests))
    texts: dict[Any, set[str]] = {}
    for engine in (fast, hooks):
        got = await asyncio.gather(*(engine.generate(copy.deepcopy(r)) for r in requests))
        for request, result, expected in zip(requests, got, want, strict=True):
            for sample, reference in zip(result.samples, expected.samples, strict=True):
                assert sample.token_ids == reference.token_ids, request.adapter
                assert max(abs(a - b) for a, b in zip(sample.logprobs, reference.logprobs, strict=True)) < 1e-4
                texts.setdefault(request.adapter, set()).add(sample.text)
    assert texts[None] != texts["a@1"] != texts["b@1"]  # the adapters act
    loaded = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    for engine in (fast, hooks):  # nothing is merged: the weights the trainer sees are the loaded ones
        current = engine._lm.state_dict()
        assert all(torch.equal(current[k], v) for k, v in loaded.items())
        assert engine._adapters.merges == 0


async def test_a_non_plain_adapter_is_refused_on_shared_weights(
    shared: dict[str, HFEngine], plain_adapters: dict[str, Path]
) -> None:
    fast = shared["fast"]
    with pytest.raises(AdapterError, match="share_weights=False"):
        await fast.load_adapter("dora@1", str(plain_adapters["dora"]))
    assert "dora@1" not in fast.adapters()
    hooks = shared["hooks"]
    assert hooks._lora is not None and len(hooks._lora.names()) == 2
    await hooks.unload_adapter("b@1")  # its hooks go with it
    assert hooks._lora.names() == [hooks._adapters._names["a@1"].hooked]
    assert fast._lora is not None and fast._lora.names() == []  # FastLM serves them: only the fused copy is kept
    await fast.unload_adapter("b@1")
    assert "b@1" not in fast.adapters()
    result = await fast.generate(GenerationRequest(prompts(fast)[1], SamplingParams(max_tokens=3), adapter="a@1"))
    assert len(result.samples[0].token_ids) == 3


async def test_sleep_holds_requests_until_wake_up_and_gives_one_turn_at_a_time(
    shared: dict[str, HFEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = shared["fast"]
    request = GenerationRequest(prompts(fast)[1], SamplingParams(max_tokens=4, seed=1))
    await fast.sleep()
    put = fast._work_queue.put
    queued: list[Any] = []
    monkeypatch.setattr(fast._work_queue, "put", lambda item: (put(item), queued.append(item))[0])

    async def held(task: asyncio.Future[Any], what: str) -> None:
        """``task``'s request is in the paused engine's queue (waited for, however long that takes) and stays
        there: a worker that was not paused would serve its 4 tokens within milliseconds of the grace period."""
        await async_wait_until(lambda: len(queued) == 1, f"{what} to reach the engine's queue")
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done, f"{what} was served while the engine slept"

    waiting = asyncio.ensure_future(fast.generate(copy.deepcopy(request)))
    second_turn = asyncio.ensure_future(fast.sleep())  # another trainer waits for this one's turn to end
    await held(waiting, "the request")
    assert not second_turn.done()  # it waits on the turn, which only wake_up gives back
    await fast.wake_up()
    result = await asyncio.wait_for(waiting, 30)  # served before the second trainer's turn began
    assert len(result.samples[0].token_ids) == 4
    await asyncio.wait_for(second_turn, 30)
    queued.clear()
    late = asyncio.ensure_future(fast.generate(copy.deepcopy(request)))
    await held(late, "a request in the second turn")
    await fast.wake_up()
    assert (await asyncio.wait_for(late, 30)).samples


def test_share_weights_settings(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="drop merge_adapters=True"):
        HFEngine(str(tiny_path), share_weights=True, merge_adapters=True)

    async def started(**options: Any) -> tuple[bool, bool]:
        engine = HFEngine(str(tiny_path), **options)
        await engine.start()
        try:
            return engine.shared_base is not None, engine._adapters._merge
        finally:
            await engine.close()

    assert asyncio.run(started()) == (False, True)  # a 2 MB model: merged adapters, the trainer keeps a copy
    monkeypatch.setattr("langgraph_art.serve.engines.hf.engine.SHARE_MIN_BYTES", 0)
    assert asyncio.run(started()) == (True, False)  # large enough: shared, unmerged
    assert asyncio.run(started(merge_adapters=True)) == (False, True)  # asked to merge: no sharing


@pytest.mark.slow
@pytest.mark.integration
def test_the_digits_task_learns_on_shared_weights(tmp_path: Path) -> None:
    """The learning test's task, with the trainer on the engine's own weights: one model in the process, sampled
    logprobs equal to the trainer's (the engine serves exactly the weights trained), and it learns."""
    with art.LocalBackend(home=tmp_path, engine_options={"share_weights": True}) as backend:
        model = art.TrainableModel(name="digits", project="shared").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=32)
        config = art.GRPOConfig(learning_rate=5e-3, lora_r=8, lora_alpha=16, seed=0)
        digits = art.reward(digit_share, name="digits")
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[digits], num_generations=8, config=config)
        scenarios = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]
        history = trainer.train(scenarios, steps=60, progress=False)
        engine = backend.server("tiny").engine
        with backend.policies("tiny").lease("shared", "digits") as live:
            assert live.shares_weights and live.model is engine._lm
        rewards = [m["reward/mean"] for m in history]
        assert rewards[0] < 0.1, rewards  # the untrained policy; how soon it learns varies with sampling order
        assert statistics.fmean(rewards[-10:]) > 0.5, rewards
        assert statistics.fmean(rewards[-10:]) > statistics.fmean(rewards[:5]) + 0.3, rewards
        trained = [m for m in history if m.get("train/updated")]
        assert len(trained) >= 4
        gaps = [m["train/sampler_logprob_gap"] for m in trained]
        assert all(gap < 1e-4 for gap in gaps), gaps
        # the HF engine on-policy (max_steps_off_policy=0): no mismatch to correct, on any token
        assert all(m["train/mismatch/abs_max"] < 1e-3 and m["train/mismatch/beyond_cap"] == 0 for m in trained)
        assert all(m["train/mismatch/is_weight"] == pytest.approx(1.0, abs=1e-4) for m in trained)
        assert not engine._lm.training  # the trainer's turn ended in eval mode


def test_the_fused_copy_gives_the_loaded_file_pages_back(tiny_path: Path) -> None:
    """FastLM copies the projections into fused buffers; the mapped weights file's pages are dropped, so the
    process holds the weights once, and the loaded tensors still read the same values (from the file)."""
    from transformers import AutoModelForCausalLM

    from langgraph_art.models.loading import release_file_pages

    lm = AutoModelForCausalLM.from_pretrained(tiny_path)
    weight = lm.model.layers[0].mlp.up_proj.weight.detach()
    before = weight.clone()
    page = 4096
    assert release_file_pages([weight]) >= weight.numel() * weight.element_size() - 2 * page
    assert torch.equal(weight, before)
    assert release_file_pages([before]) == 0  # not in a file mapping: left alone


def test_large_buffers_go_back_to_the_system_once_and_not_against_the_users_setting(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "from langgraph_art.models.loading import return_large_buffers as r; "
        "import sys; sys.stdout.write(f'{r()} {r()}')"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == "True False"
    mine = {**env, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, "-c", code], env=mine, capture_output=True, text=True, check=True)
    assert done.stdout == "False False"


def test_trim_heap_gives_another_threads_freed_blocks_back(tmp_path: Path) -> None:
    """What grew a SmolLM2 training run by ~0.7 GB a step: blocks under the 1 MiB threshold, freed in another
    thread's arena behind one still in use, stay resident until ``malloc_trim``."""
    import subprocess
    import sys

    code = """
import ctypes, threading
from langgraph_art.models.loading import trim_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
def churn():  # 256 MiB of 64 KiB blocks, all freed but the last (it pins the heap's top)
    blocks = [libc.malloc(65536) for _ in range(4096)]
    for b in blocks:
        ctypes.memset(b, 1, 65536)
    for b in blocks[:-1]:
        libc.free(b)
t = threading.Thread(target=churn); t.start(); t.join()
before = rss(); trim_heap(); print(before, rss())
"""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc only")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = map(int, done.stdout.split())
    assert before - after >= 200, (before, after)  # of the 256 MiB freed


def test_gradient_checkpointing_defaults_on_for_large_models_only(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_art.train.trainer import GRPOTrainer

    assert not GRPOTrainer(str(tiny_path), art.GRPOConfig(), checkpoint_dir=tmp_path / "a")._checkpointing()
    forced = GRPOTrainer(str(tiny_path), art.GRPOConfig(gradient_checkpointing=True), checkpoint_dir=tmp_path / "b")
    assert forced._checkpointing()
    monkeypatch.setattr("langgraph_art.train.trainer.LARGE_MODEL_BYTES", 0)
    assert not GRPOTrainer(str(tiny_path), art.GRPOConfig(), checkpoint_dir=tmp_path / "d")._checkpointing()  # CPU
    monkeypatch.setattr("langgraph_art.train.trainer.CHECKPOINTING_CPU_BYTES", 0)
    monkeypatch.setattr("langgraph_art.train.trainer.return_large_buffers", lambda: False)  # not in this process
    assert GRPOTrainer(str(tiny_path), art.GRPOConfig(), checkpoint_dir=tmp_path / "c")._checkpointing()


@pytest.mark.slow
def test_the_half_billion_shape_trains_within_1_5x_its_weights_libraries_aside() -> None:
    """Issue 14's must-hold, with gradient checkpointing on (``ours-lean``; since issue 49 the default on CPU trains
    without it where the activations fit in half the available memory, the recompute costing ~1.5x the update:
    tests/test_trainer.py checks that plan): benchmarks/memory.py's run (LocalBackend + Trainer, 3 GRPO steps
    of 8 runs x 32 tokens on the Qwen2.5-0.5B-shaped model, fp32 on CPU) in a fresh process: its own peak memory at
    most 1.5x the weights file. Own: the peak RSS less the page cache of the mapped libraries (shared objects, the
    interpreter), which depends on the machine's cache, not on us: libraries pip has just written sit in large
    folios and count ~45 MiB more than once read back from disk, enough to put a fresh clone over a bound on the
    whole RSS. Anonymous memory and the mapped weights file still count: the weights held twice (~2x) fail here.
    1.5x is issue 14's 1.6x of the whole peak less the libraries' ~0.1x (126 of 1372 MiB, measured)."""
    import json
    import subprocess
    import sys

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    build = "import sys; sys.path.insert(0, sys.argv[1]); import engines; print(engines.model_folder(sys.argv[2]))"
    built = subprocess.run(  # in its own process: building 360M parameters here would leave GBs in this one
        [sys.executable, "-c", build, str(bench), "qwen-0.5b-shape"], capture_output=True, text=True, check=True
    )
    folder = Path(built.stdout.strip().splitlines()[-1])
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20
    out = subprocess.run(
        [sys.executable, str(bench / "memory.py"), "--one", "ours-lean", str(folder)], capture_output=True, text=True
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["shared"] == 1.0 and result["updates"] >= 2, result  # it trained, on the engine's weights
    assert 0 < result["libraries_mib"] < 400 and result["idle_mib"] < 1000, result  # they were found, and not more
    assert result["own_peak_mib"] <= 1.5 * weights, result
