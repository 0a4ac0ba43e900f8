"""Several inference replicas for one policy (``RemoteBackend(replicas=[...])``, ``ChatART(base_urls=[...])``): after
each step every replica serves the new checkpoint before a rollout of the next step uses it, and the rollouts
spread over the replicas."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

import langgraph_art as art
from langgraph_art.backends.service import build_service
from langgraph_art.serve.embedded import EmbeddedServer
from tests.helpers import one_agent_graph

PROBE = {"messages": [{"role": "user", "content": "numbers"}], "max_tokens": 6, "temperature": 0, "logprobs": True}


@art.reward
def varied(metadata: dict[str, Any]) -> float:
    """Differs between the runs of a group whatever they sampled: every step updates."""
    return metadata["generation"] / 4


def counting(server: EmbeddedServer, counts: Counter[str], name: str) -> EmbeddedServer:
    """Count the chat completions ``server`` answers (a middleware, added before it starts)."""

    @server.app.middleware("http")
    async def count(request: Any, call_next: Any) -> Any:
        if request.url.path.endswith("/chat/completions"):
            counts[name] += 1
        return await call_next(request)

    return server


def probe(url: str, model: str) -> tuple[str, list[float]]:
    """The greedy answer of ``model`` at ``url`` and its sampled tokens' logprobs."""
    body = httpx.post(f"{url}/chat/completions", json={**PROBE, "model": model}, timeout=60).json()
    choice = body["choices"][0]
    return body["model"], [t["logprob"] for t in choice["logprobs"]["content"]]


@pytest.mark.slow
@pytest.mark.integration
def test_every_replica_serves_each_new_checkpoint_before_the_next_rollouts(tiny_path: Path, tmp_path: Path) -> None:
    check_replicas(tiny_path, tmp_path, device="cpu")


def check_replicas(tiny_path: Path, tmp_path: Path, device: str) -> None:
    """A training service and a replica on loopback (on ``device``), three steps (also run on a GPU:
    test_scale_out_gpu.py)."""
    counts: Counter[str] = Counter()
    service = build_service(str(tiny_path), home=tmp_path / "service", served_name="tiny", device=device)
    trainer_service = counting(EmbeddedServer(app=service.app), counts, "a")
    replica = EmbeddedServer(str(tiny_path), served_name="tiny", adapter_roots=[tmp_path / "service"], device=device)
    counting(replica, counts, "b")
    with trainer_service, replica:
        urls = [trainer_service.base_url, replica.base_url]
        backend = art.RemoteBackend(urls[0], home=tmp_path / "client", replicas=urls)
        model = art.TrainableModel(name="rep", project="p").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)
        assert llm.base_urls == urls
        config = art.GRPOConfig(learning_rate=5e-2)
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[varied], num_generations=4, config=config)
        scenarios = [{"input": {"messages": [("user", "numbers")]}}]
        before = probe(urls[0], "p/rep")
        for step in range(1, 4):
            counts.clear()
            metrics = trainer.train_step(scenarios)
            assert metrics["train/updated"] == 1.0 and metrics["step"] == step
            # the step's rollouts spread over both replicas, and all sampled with the policy of the step before
            assert counts["a"] > 0 and counts["b"] > 0, counts
            runs = [t for t in backend.store(model).trajectories() if t.metadata.get("policy_step") == step - 1]
            turns = [turn for t in runs for turn in t.turns()]
            assert len(runs) == 4 and {turn.policy_step for turn in turns} == ({step - 1} if step > 1 else {None})
            # train_step has returned: both replicas serve checkpoint `step` as p/rep, the same greedy tokens and
            # logprobs, and not those of the policy before
            served = [probe(url, "p/rep") for url in urls]
            assert served[0][0] == served[1][0] == f"p/rep@{step}"
            assert served[0][1] == pytest.approx(served[1][1], abs=1e-6)  # the same engine and weights
            assert max(abs(a - b) for a, b in zip(served[0][1], before[1], strict=True)) > 1e-5  # a step moved it
            before = served[0]
        loaded = [a["name"] for a in httpx.get(f"{replica.base_url}/adapters").json()["data"]]
        assert loaded == ["p/rep@2", "p/rep@3"]  # keep_loaded=2: older steps unloaded on the replica


def test_replica_settings_that_cannot_work_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError, match="replicas is a list of base URLs"):
        art.RemoteBackend("http://127.0.0.1:1/v1", replicas="http://127.0.0.1:2/v1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not the first of base_urls"):  # pydantic's error around ChatART's
        art.ChatART(model="m", base_url="http://127.0.0.1:3/v1", base_urls=["http://127.0.0.1:1/v1"])


def test_chat_art_takes_the_replicas_in_turn_and_skips_one_that_is_down(tiny_path: Path) -> None:
    counts: Counter[str] = Counter()
    servers = [counting(EmbeddedServer(str(tiny_path), served_name="tiny"), counts, name) for name in "ab"]
    with servers[0], servers[1]:
        down = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
        llm = art.ChatART(model="tiny", base_urls=[servers[0].base_url, down, servers[1].base_url], max_tokens=2)
        for _ in range(6):
            llm.invoke("hi")
        assert counts["a"] >= 2 and counts["b"] >= 2 and sum(counts.values()) == 6
