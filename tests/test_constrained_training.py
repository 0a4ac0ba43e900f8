"""Training on turns sampled under a grammar: the trainer rebuilds each turn's masks from its grammar and takes the
logprobs under them, so the importance ratio starts at 1; unmasked, it starts at the policy's mass inside the mask.
Turns come from the real server (the tiny model under a JSON schema), as ChatART records them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from langgraph_art.config import GRPOConfig  # noqa: E402
from langgraph_art.train.advantages import Advantages  # noqa: E402
from langgraph_art.train.constrained import batch_grammar_masks, replay_grammars  # noqa: E402
from langgraph_art.train.tokenize import build_sequences  # noqa: E402
from langgraph_art.train.trainer import GRPOTrainer  # noqa: E402
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn  # noqa: E402

ROUTE = {
    "type": "object",
    "properties": {"destination": {"enum": ["weather", "math", "chat"]}, "note": {"type": "string"}},
    "required": ["destination", "note"],
}


def constrained_turns(server: Any, count: int, temperature: float, max_tokens: int = 24) -> list[Turn]:
    """``count`` turns sampled by the service under ``ROUTE``'s grammar, recorded as ChatART records them."""
    messages = [{"role": "user", "content": "route: what is the weather in paris"}]
    body = {
        "model": "tiny",
        "messages": messages,
        "n": count,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "logprobs": True,
        "return_token_ids": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "Route", "schema": ROUTE}},
    }
    answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60).json()
    return [
        Turn(
            id=f"t{choice['index']}",
            node="route",
            messages=messages,
            output=choice["message"],
            prompt_token_ids=answer["prompt_token_ids"],
            token_ids=choice["token_ids"],
            logprobs=[entry["logprob"] for entry in choice["logprobs"]["content"]],
            grammar=answer["grammar"],
            closing_tokens=choice["closing_tokens"],
            params={"temperature": temperature},
        )
        for choice in answer["choices"]
    ]


def group_of(turns: list[Turn]) -> TrajectoryGroup:
    """Rewards alternate 1, 0 (what they are does not matter here: every run gets an advantage)."""
    runs = [
        Trajectory(id=f"r{i}", status="ok", reward=float(i % 2), spans=[NodeSpan(id=f"s{i}", name="route", turns=[t])])
        for i, t in enumerate(turns)
    ]
    return TrajectoryGroup(id="g", trajectories=runs)


@pytest.fixture(scope="module")
def turns(server: Any) -> list[Turn]:
    sampled = constrained_turns(server, 8, temperature=1.0)
    assert any(t.closing_tokens for t in sampled), "at 24 tokens the looping model needs a closing in some runs"
    return sampled


def trainer_for(tiny_path: Path, tmp_path: Path, **config: Any) -> GRPOTrainer:
    return GRPOTrainer(str(tiny_path), GRPOConfig(learning_rate=1e-3, **config), checkpoint_dir=tmp_path / "ckpt")


def test_sequences_note_each_constrained_turn_and_leave_closing_tokens_untrained(turns: list[Turn], tokenizer) -> None:
    runs = group_of(turns).trajectories
    advantages = Advantages(by_trajectory={run.id: 1.0 for run in runs})
    sequences = build_sequences(runs, advantages, tokenizer)
    for sequence, turn in zip(sequences, turns, strict=True):
        start = len(turn.prompt_token_ids or [])
        assert sequence.grammars == [(start, len(turn.token_ids), turn.grammar)]
        sampled = len(turn.token_ids) - turn.closing_tokens
        assert sequence.mask[start:] == [1] * sampled + [0] * turn.closing_tokens


def test_replayed_masks_allow_every_sampled_token(turns: list[Turn], tokenizer) -> None:
    from langgraph_art.models.grammar import Grammars, unpack

    runs = group_of(turns).trajectories
    sequences = build_sequences(runs, Advantages(by_trajectory={r.id: 1.0 for r in runs}), tokenizer)
    grammars = Grammars(tokenizer)
    trained = sum(sum(s.mask) for s in sequences)
    mismatched, forced = replay_grammars(sequences, grammars)
    assert mismatched == 0 and 0 < forced == trained - sum(sum(s.mask) for s in sequences)  # '{"destination": "' ...
    first = min(s.mask.index(1) for s in sequences)
    masks = batch_grammar_masks(sequences, first, "cpu")
    assert masks is not None and len(masks.rows) == sum(len(t.token_ids) for t in turns)
    allowed = unpack(masks.packed, grammars.vocab_size)
    targets = [sequences[r].input_ids[c + first] for r, c in zip(masks.rows.tolist(), masks.cols.tolist(), strict=True)]
    assert all(allowed[i, t] for i, t in enumerate(targets))

    foreign = sequences[0]
    foreign.grammars = [(foreign.grammars[0][0], foreign.grammars[0][1], 'start: x\nx: %json {"type": "integer"}\n')]
    assert replay_grammars([foreign], grammars) == (1, 0) and foreign.allowed == []


def test_tokens_the_grammar_forced_are_the_ones_the_engine_fed_at_once(turns: list[Turn], tokenizer) -> None:
    """The HF engine feeds the text a grammar forces (jump-forward) with logprob 0; the replay finds exactly those
    tokens, and they stay context: no choice was made there."""
    from langgraph_art.models.grammar import Grammars

    grammars = Grammars(tokenizer)
    for turn in turns:
        assert turn.grammar is not None
        replay = grammars.replay(turn.grammar, turn.token_ids)
        assert replay is not None and any(replay.forced) and not replay.forced[0]  # the first token is sampled
        for forced, logprob in zip(replay.forced, turn.logprobs, strict=True):
            assert logprob == 0.0 if forced else logprob <= 0.0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_masked_logprobs_are_the_samplers_so_the_ratio_starts_at_one(
    server: Any, tiny_path: Path, tmp_path: Path, temperature: float
) -> None:
    turns = constrained_turns(server, 8, temperature)
    result = trainer_for(tiny_path, tmp_path).step([group_of(turns)])
    metrics = result.metrics
    assert result.updated
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["train/sampler_logprob_gap"] < 1e-4
    forced = metrics["train/grammar/forced_tokens"]
    assert metrics["train/grammar/tokens"] == sum(len(t.token_ids) - t.closing_tokens for t in turns) - forced > 0
    assert 0 < metrics["train/grammar/mass"] < 1 and metrics["train/grammar/mismatched_turns"] == 0


def test_unmasked_the_ratio_starts_at_the_mass_inside_the_mask(turns: list[Turn], tiny_path: Path, tmp_path: Path):
    """pi(a) / (pi(a) / Z) = Z: against the sampler's masked logprob, the unmasked ratio of each token before any
    update is exactly the probability the policy put inside the mask there, mostly far below 1 - epsilon (on the
    tokens sampled; those the grammar forced are fed by jump-forward and not trained)."""
    unmasked = {"constrained_logprobs": "unmasked", "importance_sampling_correction": "none"}
    metrics = trainer_for(tiny_path, tmp_path, **unmasked).step([group_of(turns)]).metrics
    assert metrics["train/ratio_mean"] == pytest.approx(metrics["train/grammar/mass"], rel=1e-3)
    assert metrics["train/ratio_mean"] < 0.7 and metrics["train/clip_fraction"] > 0.2  # 1 - epsilon is 0.8
    assert metrics["train/sampler_logprob_gap"] > 0.5
    # under the default mismatch correction the ratio is to the trainer's own logprobs (1) and the mass inside the
    # mask is each token's importance weight instead (below 1: nothing to truncate)
    corrected = trainer_for(tiny_path, tmp_path / "tis", constrained_logprobs="unmasked").step([group_of(turns)])
    assert corrected.metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert corrected.metrics["train/mismatch/is_weight"] == pytest.approx(metrics["train/grammar/mass"], rel=1e-3)
    assert corrected.metrics["train/mismatch/beyond_cap"] > 0 and corrected.metrics["train/clip_fraction"] == 0


def test_a_turn_its_grammar_does_not_allow_trains_unmasked_and_is_counted(
    turns: list[Turn], tiny_path: Path, tmp_path: Path
) -> None:
    other = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    wrong = turns[0].model_copy(update={"grammar": f"start: x\nx: %json {json.dumps(other)}\n"})
    metrics = trainer_for(tiny_path, tmp_path).step([group_of([wrong, *turns[1:]])]).metrics
    assert metrics["train/grammar/mismatched_turns"] == 1
    expected = sum(len(t.token_ids) - t.closing_tokens for t in turns[1:]) - metrics["train/grammar/forced_tokens"]
    assert metrics["train/grammar/tokens"] == expected


def test_turns_keep_their_grammar_through_json(turns: list[Turn]) -> None:
    """The store, the trainer process and a remote service see turns as JSON."""
    again = Turn.model_validate_json(turns[0].model_dump_json())
    assert again.grammar == turns[0].grammar and again.closing_tokens == turns[0].closing_tokens
