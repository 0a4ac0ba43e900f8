"""Learning through the whole stack: a graph using ChatART, the handler, an @reward, the trainer, hot reload."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import httpx
import pytest

import langgraph_art as art
from langgraph_art.types import ModelRef
from tests.helpers import digit_share, one_agent_graph

pytestmark = [pytest.mark.slow, pytest.mark.integration]


digits = art.reward(digit_share, name="digits")


def test_digits_task_learns_end_to_end(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="digits", project="learning").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=32)
        config = art.GRPOConfig(learning_rate=5e-3, lora_r=8, lora_alpha=16, seed=0)
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[digits], num_generations=8, config=config)
        scenarios = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]
        history = trainer.train(scenarios, steps=60, progress=False)

        rewards = [m["reward/mean"] for m in history]
        assert rewards[0] < 0.1, rewards  # the untrained policy rarely writes a digit (how fast it learns varies
        assert statistics.fmean(rewards[-10:]) > 0.5, rewards  # with the engine's sampling order: 5 to 20 steps)
        assert statistics.fmean(rewards[-10:]) > statistics.fmean(rewards[:5]) + 0.3, rewards
        # each step's runs used the checkpoint of the previous update (a step whose group had all-equal rewards
        # teaches nothing: no update, no new checkpoint)
        updates = 0
        for metrics in history:
            assert metrics["policy_step"] == updates
            updates += int(metrics["train/updated"])
        last = int(history[-1]["step"])
        assert last == updates >= 4
        base_url = backend.server("tiny").base_url
        served = [a["name"] for a in httpx.get(f"{base_url}/adapters").json()["data"]]
        served.sort(key=lambda name: ModelRef.parse(name).step or 0)
        expected = [f"learning/digits@{s}" for s in range(last - 3, last + 1)]
        assert served == expected  # older steps unloaded, still on disk
        assert art.ChatART(model=model).invoke("hi").response_metadata["model_name"] == f"learning/digits@{last}"
        lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 60 and json.loads(lines[-1])["step"] == last
        assert (trainer.run_dir / "reward_curve.png").stat().st_size > 1000
        store = backend.store(model)
        runs_per_policy = [store.count(step=s) for s in range(last + 1)]
        assert sum(runs_per_policy) == 480 and all(n % 8 == 0 for n in runs_per_policy)
        assert all(n >= 8 for n in runs_per_policy[:last])  # every checkpoint but the newest sampled runs
        assert all(t.reward is not None for t in store.trajectories(step=last - 1))
