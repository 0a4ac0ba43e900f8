"""TrainableModel + backends: ChatART(model=trainable_model) serves the current policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import langgraph_art as art
from langgraph_art.errors import ConfigError
from tests.helpers import WEATHER_ANSWER, WEATHER_PROMPTS, get_weather

pytestmark = pytest.mark.integration


def test_names_are_validated_and_registration_is_required() -> None:
    with pytest.raises(ValueError, match="no '@'"):
        art.TrainableModel(name="agent@3", project="p")
    model = art.TrainableModel(name="agent", project="p")
    with pytest.raises(ValueError, match=r"model.register\(art.LocalBackend\(\)\)"):  # pydantic wraps ConfigError
        art.ChatART(model=model)


def test_remote_backend_serves_base_then_latest_checkpoint(server: Any, tool_adapter: Path, tokenizer: Any) -> None:
    model = art.TrainableModel(name="remote-agent", project="p").register(art.RemoteBackend(server.base_url))
    llm = art.ChatART(model=model, temperature=0, max_tokens=48)
    assert llm.recorder is model.recorder  # one shared log per trainable model
    before = llm.invoke("hi")
    assert before.response_metadata["model_name"] == "p/remote-agent"  # no checkpoint yet: the base model answers

    httpx.post(
        f"{server.base_url}/adapters", json={"name": "p/remote-agent@4", "path": str(tool_adapter)}
    ).raise_for_status()
    agent = llm.bind_tools([get_weather])
    call = agent.invoke(WEATHER_PROMPTS[0])
    assert call.tool_calls and call.response_metadata["model_name"] == "p/remote-agent@4"
    pinned = llm.with_step(4)
    assert (
        pinned.model_name == "p/remote-agent@4"
        and pinned.policy_step == 4
        and pinned.with_step(None).model_name == "p/remote-agent"
    )
    handler = art.TrajectoryCallbackHandler(recorders=[model.recorder])
    import warnings

    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(llm, [get_weather])
    state = graph.invoke({"messages": [("user", WEATHER_PROMPTS[0])]}, {"callbacks": [handler]})
    assert state["messages"][-1].content == WEATHER_ANSWER
    assert {t.policy_step for t in handler.trajectories[0].turns()} == {4}
    httpx.delete(f"{server.base_url}/adapters/p/remote-agent@4").raise_for_status()


def test_local_backend_starts_an_embedded_service(tiny_path: Path, tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="local-agent", project="demo", base_model=str(tiny_path)).register(backend)
        reply = art.ChatART(model=model, max_tokens=4).invoke("hello")
        assert len(reply.response_metadata["logprobs"]["content"]) <= 4
        assert backend.store(model).path == tmp_path / "demo" / "trajectories.sqlite"
        policies = httpx.get(f"{backend.server(str(tiny_path)).base_url}/policies").json()["data"]
        assert policies == [{"name": "demo/local-agent", "serves": str(tiny_path)}]


def test_local_backend_passes_the_engine_options_on(tiny_path: Path, tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path, merge_adapters=False, fast_decode=False) as backend:
        model = art.TrainableModel(name="plain-agent", project="demo", base_model=str(tiny_path)).register(backend)
        reply = art.ChatART(model=model, max_tokens=3).invoke("hello")
        assert len(reply.response_metadata["logprobs"]["content"]) <= 3
        engine = backend.server(str(tiny_path)).engine
        assert engine._fast is None and engine._adapters._merge is False


def test_unreachable_remote_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="cannot reach"):
        art.TrainableModel(name="a", project="p").register(art.RemoteBackend("http://127.0.0.1:9/v1"))


HELLO = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]}]


def two_projects_side_by_side(backend: Any, home: Path, base_url: str) -> None:
    """The same model name in two projects: two trainers, two checkpoint folders, two served adapters."""
    first = art.TrainableModel(name="agent", project="shop").register(backend)
    second = art.TrainableModel(name="agent", project="support").register(backend)
    backend.warmup(first, HELLO, steps=1)
    backend.warmup(second, HELLO, steps=2, learning_rate=5e-2)
    served = {a["name"]: a["path"] for a in httpx.get(f"{base_url}/adapters").json()["data"]}
    assert set(served) >= {"shop/agent@0", "support/agent@0"}
    assert served["shop/agent@0"] != served["support/agent@0"]
    assert Path(served["shop/agent@0"]).is_relative_to((home / "shop" / "checkpoints" / "agent").resolve())
    assert Path(served["support/agent@0"]).is_relative_to((home / "support" / "checkpoints" / "agent").resolve())
    for model in (first, second):
        reply = art.ChatART(model=model, max_tokens=2, temperature=0).invoke("hi")
        assert reply.response_metadata["model_name"] == f"{model.project}/agent@0"


def test_two_projects_with_one_model_name_on_one_local_backend(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        two_projects_side_by_side(backend, tmp_path, backend.server("tiny").base_url)
        assert len(backend.policies("tiny")) == 2


def test_two_projects_with_one_model_name_through_the_service(tiny_path: Path, tmp_path: Path) -> None:
    from langgraph_art.backends.service import build_service
    from langgraph_art.serve.embedded import EmbeddedServer

    service = build_service(str(tiny_path), home=tmp_path / "service", served_name="tiny", adapter_roots=[tmp_path])
    with EmbeddedServer(app=service.app) as server:
        backend = art.RemoteBackend(server.base_url, home=tmp_path / "client")
        two_projects_side_by_side(backend, tmp_path / "service", server.base_url)
        assert service.policies is not None and len(service.policies) == 2
