"""Scoring token ids (what a teacher on a server gives): the HF engine's ``score`` reproduces the logprobs it
sampled with, for the base model and an adapter, merged, unmerged on shared weights and through transformers; and
``POST /v1/completions`` answers the same values as the engine in process, in vLLM's ``prompt_logprobs`` shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.errors import RequestError  # noqa: E402
from langgraph_art.serve.engines.base import GenerationRequest, SamplingParams, Scorer, ScoreRequest  # noqa: E402
from langgraph_art.serve.engines.hf.engine import HFEngine  # noqa: E402
from tests.helpers import WEATHER_PROMPTS, WEATHER_TOOL  # noqa: E402

SETTINGS = {
    "merged": {},
    "shared-fast": {"share_weights": True},
    "shared-transformers": {"share_weights": True, "fast_decode": False},
}


@pytest.fixture(scope="module", params=list(SETTINGS), ids=list(SETTINGS))
async def engine(request: Any, tiny_path: Path, tool_adapter: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(str(tiny_path), served_name="tiny", **SETTINGS[request.param])
    await eng.start()
    await eng.load_adapter("weather@1", str(tool_adapter))
    yield eng
    await eng.close()


def prompt(engine: HFEngine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    rendered = engine.tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], add_generation_prompt=True, return_dict=False
    )
    return list(rendered)


@pytest.mark.parametrize("adapter", [None, "weather@1"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_scoring_reproduces_the_samplers_logprobs(engine: HFEngine, adapter: str | None, temperature: float):
    assert isinstance(engine, Scorer)
    ids = prompt(engine, WEATHER_PROMPTS[0])
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=3)
    (sample,) = (await engine.generate(GenerationRequest(ids, params, adapter=adapter))).samples
    scored = await engine.score(ScoreRequest(ids + sample.token_ids, len(ids), adapter, temperature))
    assert len(scored) == len(sample.token_ids)
    assert max(abs(a - b) for a, b in zip(scored, sample.logprobs, strict=True)) < 1e-4
    other = await engine.score(ScoreRequest(ids + sample.token_ids, len(ids), "weather@1" if adapter is None else None,
                                            temperature))  # fmt: skip
    assert max(abs(a - b) for a, b in zip(other, sample.logprobs, strict=True)) > 1e-3  # the other policy differs


async def test_a_bad_score_request_says_what_to_change(engine: HFEngine) -> None:
    with pytest.raises(RequestError, match=r"prompt_logprobs_start=0: score from a position in 1\.\.2"):
        ScoreRequest([1, 2, 3], 0)
    with pytest.raises(RequestError, match="temperature must be in"):
        ScoreRequest([1, 2, 3], 1, None, 0.0)
    from langgraph_art.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="'nope@1' is not loaded"):
        await engine.score(ScoreRequest([1, 2, 3], 1, "nope@1"))


def test_completions_answers_in_vllms_shape_and_refuses_what_it_does_not_serve(server: Any) -> None:
    """The embedded server (tiny, ``weather@1`` loaded); its values against the engine's in process are in
    ``test_engine_conformance.py``, on both engines."""
    import httpx

    ids = prompt(server.engine, WEATHER_PROMPTS[1])
    tokens = ids + server.engine.tokenizer.encode(" sunny today", add_special_tokens=False)
    body = {"model": "weather@1", "prompt": tokens, "max_tokens": 0, "prompt_logprobs": 0, "temperature": 0.7}
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    entries = reply["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(tokens)  # vLLM's default: every token but the first
    assert [int(next(iter(e))) for e in entries[1:]] == tokens[1:]
    assert all(next(iter(e.values()))["logprob"] <= 0 for e in entries[1:])
    assert reply["usage"] == {"prompt_tokens": len(tokens), "completion_tokens": 0, "total_tokens": len(tokens)}
    for bad, param in (({"max_tokens": 8}, "max_tokens"), ({"prompt_logprobs": 5}, "prompt_logprobs"),
                       ({"prompt_logprobs_start": 0}, "prompt_logprobs_start"),
                       ({"prompt": [1, 10**9]}, "prompt"), ({"prompt": [-1, 2]}, "prompt")):  # fmt: skip
        refused = httpx.post(f"{server.base_url}/completions", json={**body, **bad}, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    unknown = httpx.post(f"{server.base_url}/completions", json={**body, "model": "nope"}, timeout=60)
    assert unknown.status_code == 404
