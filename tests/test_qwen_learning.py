"""Qwen2.5-Coder-0.5B-Instruct learns: a few GRPO steps through the whole stack (a LangGraph node calling ChatART, an
@reward, the trainer on the engine's shared weights, hot reload) change what the served model says.

The task is a preference the untrained model does not have: asked to pick red, green or blue, it says green in
~1 of 6 replies at temperature 1 (red ~1 of 2); the reward is 1 for green."""

from __future__ import annotations

from pathlib import Path

import pytest

import langgraph_art as art
from langgraph_art.testing import one_agent_graph

pytestmark = [pytest.mark.slow, pytest.mark.integration]
QUESTION = "Pick one color: red, green or blue. Reply with the color only."
SAMPLES = 32


@art.reward
def green(state) -> float:
    return float("green" in str(state["messages"][-1].content).lower())


def green_share(llm: art.ChatART) -> float:
    replies = llm.batch([QUESTION] * SAMPLES)
    return sum("green" in str(r.content).lower() for r in replies) / SAMPLES


def test_a_few_grpo_steps_change_what_the_half_billion_model_says(qwen_path: Path, tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="green", project="qwen", base_model="qwen2.5-coder-0.5b").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
        before = green_share(llm)
        config = art.GRPOConfig(learning_rate=1e-3, seed=0)
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[green], num_generations=8, config=config)
        history = trainer.train([{"id": "color", "input": {"messages": [("user", QUESTION)]}}], steps=4,
                                progress=False)  # fmt: skip
        served = art.ChatART(model=model, temperature=1.0, max_tokens=8)
        after = green_share(served)
        updates = [m for m in history if m["train/updated"]]
        assert served.invoke(QUESTION).response_metadata["model_name"] == f"qwen/green@{len(updates)}"
    # measured: 0.16 -> 1.0, group rewards 0.125, 0.875, then 1.0 (no update), ~2.7 s an update on 2 threads
    assert len(updates) >= 2, history
    assert all(m["train/gradient_checkpointing"] == 0.0 for m in updates)  # 8 short runs fit in memory
    assert before < 0.4, before  # room to learn
    assert after >= before + 0.3, (before, after)
