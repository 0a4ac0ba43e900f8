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
    assert before.response_metadata["model_name"] == "remote-agent"  # no checkpoint yet: the base model answers

    httpx.post(
        f"{server.base_url}/adapters", json={"name": "remote-agent@4", "path": str(tool_adapter)}
    ).raise_for_status()
    agent = llm.bind_tools([get_weather])
    call = agent.invoke(WEATHER_PROMPTS[0])
    assert call.tool_calls and call.response_metadata["model_name"] == "remote-agent@4"
    pinned = llm.with_step(4)
    assert (
        pinned.model_name == "remote-agent@4"
        and pinned.policy_step == 4
        and pinned.with_step(None).model_name == "remote-agent"
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
    httpx.delete(f"{server.base_url}/adapters/remote-agent@4").raise_for_status()


def test_local_backend_starts_an_embedded_service(tiny_path: Path, tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="local-agent", project="demo", base_model=str(tiny_path)).register(backend)
        reply = art.ChatART(model=model, max_tokens=4).invoke("hello")
        assert len(reply.response_metadata["logprobs"]["content"]) <= 4
        assert backend.store(model).path == tmp_path / "demo" / "trajectories.sqlite"
        policies = httpx.get(f"{backend.server(str(tiny_path)).base_url}/policies").json()["data"]
        assert policies == [{"name": "local-agent", "serves": str(tiny_path)}]


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
