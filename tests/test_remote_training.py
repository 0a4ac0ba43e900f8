"""Training through `langgraph-art serve`'s training API: rollouts here, the GRPO step in the service."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

import langgraph_art as art
from langgraph_art.backends.service import build_service
from langgraph_art.errors import ConfigError
from langgraph_art.serve.embedded import EmbeddedServer
from langgraph_art.train.factory import TrainingOptions
from tests.helpers import digit_share, one_agent_graph

pytestmark = [pytest.mark.slow, pytest.mark.integration]


digits = art.reward(digit_share, name="digits")


@pytest.mark.parametrize("process", [False, True], ids=["in-process", "trainer-process"])
def test_remote_backend_trains_in_the_service(tiny_path: Path, tmp_path: Path, process: bool) -> None:
    """Also with the service's trainers in child processes (``serve --trainer-process``): warm-ups (conversations
    and stored trajectories) and steps go through the pipe."""
    built = build_service(str(tiny_path), home=tmp_path / "service", served_name="tiny",
                          training=TrainingOptions(process=process))  # fmt: skip
    with EmbeddedServer(app=built.app) as service:
        backend = art.RemoteBackend(service.base_url, home=tmp_path / "client")
        model = art.TrainableModel(name="remote", project="p").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=16)
        trainer = art.Trainer(
            one_agent_graph(llm),
            model,
            rewards=[digits],
            num_generations=4,
            config=art.GRPOConfig(learning_rate=1e-2, num_generations=4),
        )
        losses = trainer.warmup(
            [{"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": "1 2 3 4 5"}]}],
            steps=3,
        )
        assert len(losses) == 3 and backend.current_step(model) == 0
        checkpoints = tmp_path / "service" / "p" / "checkpoints" / "remote"
        warmed = load_file(str(checkpoints / "step-000000" / "adapter_model.safetensors"))  # what the warm-up published
        history = trainer.train([{"input": {"messages": [("user", "numbers")]}}], steps=3, progress=False)
        updates = sum(int(m["train/updated"]) for m in history)
        # the GRPO steps ran in the service: step 0 is the warm-up's alone, so each of these is an update
        assert updates >= 1, [(m["reward/mean"], m["reward/std"]) for m in history]
        assert [m["step"] for m in history if m["train/updated"]] == list(range(1, updates + 1)), history
        assert all(m["train/tokens"] > 0 and math.isfinite(m["train/loss"]) for m in history if m["train/updated"])
        assert backend.current_step(model) == updates
        assert (checkpoints / f"step-{updates:06d}" / "adapter_config.json").exists()
        trained = load_file(str(checkpoints / f"step-{updates:06d}" / "adapter_model.safetensors"))
        assert trained.keys() == warmed.keys()
        assert any(not torch.equal(trained[name], warmed[name]) for name in warmed)  # the LoRA moved past the warm-up
        served = [a["name"] for a in httpx.get(f"{service.base_url}/adapters").json()["data"]]
        assert f"p/remote@{updates}" in served
        assert backend.store(model).count() == 12  # trajectories stay on the client
        assert (trainer.run_dir / "metrics.jsonl").exists()
        # a warm-up from stored runs works remotely as it does locally (their exact sampled ids travel along)
        stored = backend.store(model).trajectories(status="ok")
        losses = trainer.warmup(stored[:4], steps=2)
        assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    built.close()


def test_a_service_without_training_api_says_so(server: Any, tmp_path: Path) -> None:
    model = art.TrainableModel(name="norouter", project="p").register(art.RemoteBackend(server.base_url, home=tmp_path))
    with pytest.raises(ConfigError, match="no training API"):
        model.backend.current_step(model)  # type: ignore[attr-defined]
