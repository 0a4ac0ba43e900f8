"""Losses and advantages against values computed by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.train.advantages import centred, group_advantages  # noqa: E402
from langgraph_art.train.loss import entropy, kl_k3, policy_loss, token_logprobs  # noqa: E402
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup  # noqa: E402

L = math.log


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_grpo_on_policy_is_minus_advantage_and_its_gradient() -> None:
    logp = t([L(0.5), L(0.25)]).requires_grad_()
    loss, stats = policy_loss(logp, logp.detach().clone(), torch.tensor([1.0], dtype=torch.float64), t([1, 1]))
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5])  # -A * ratio / tokens
    assert stats.clip_fraction == 0 and stats.ratio_mean == pytest.approx(1.0) and stats.tokens == 2


def test_clipping_is_one_sided_by_advantage_sign() -> None:
    new, old = t([L(0.8)]), t([L(0.5)])  # ratio 1.6
    up, stats = policy_loss(new.clone().requires_grad_(), old, torch.tensor([1.0], dtype=torch.float64), t([1]))
    assert up.item() == pytest.approx(-1.2) and stats.clip_fraction == 1.0  # min(1.6, 1.2) * 1
    down, stats = policy_loss(new, old, torch.tensor([-1.0], dtype=torch.float64), t([1]))
    assert down.item() == pytest.approx(1.6) and stats.clip_fraction == 0.0  # min(-1.6, -1.2) = -1.6
    wide, _ = policy_loss(new, old, torch.tensor([1.0], dtype=torch.float64), t([1]), epsilon_high=0.28)
    assert wide.item() == pytest.approx(-1.28)


def test_normalisations_differ_as_documented() -> None:
    logp = t([-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0])
    mask = t([1, 1, 0], [1, 0, 0])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    grpo, _ = policy_loss(logp, logp, adv, mask, loss_type="grpo")
    bnpo, _ = policy_loss(logp, logp, adv, mask, loss_type="bnpo")
    dr, _ = policy_loss(logp, logp, adv, mask, loss_type="dr_grpo", max_tokens=4)
    assert grpo.item() == pytest.approx((-1 + 2) / 2)  # per-sequence means, then their mean
    assert bnpo.item() == pytest.approx((-1 - 1 + 2) / 3)  # over all trained tokens
    assert dr.item() == pytest.approx((-1 - 1 + 2) / (2 * 4))  # over a constant


def test_cispo_weights_logprob_by_detached_clipped_ratio() -> None:
    new = t([L(0.8)]).requires_grad_()
    loss, _ = policy_loss(
        new, t([L(0.5)]), torch.tensor([1.0], dtype=torch.float64), t([1]), loss_type="cispo", epsilon_high=0.2
    )
    assert loss.item() == pytest.approx(-1.2 * L(0.8))
    loss.backward()
    assert new.grad.item() == pytest.approx(-1.2)  # the weight carries no gradient


def test_gspo_uses_one_geometric_mean_ratio_per_sequence() -> None:
    old = t([0.0, 0.0])
    new = t([0.1, 0.3])  # token log-ratios 0.1 and 0.3 -> sequence ratio exp(0.2)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, _ = policy_loss(new, old, adv, t([1, 1]), loss_type="gspo", epsilon=0.3)
    assert loss.item() == pytest.approx(-math.exp(0.2))
    clipped, stats = policy_loss(new, old, adv, t([1, 1]), loss_type="gspo", epsilon=0.1)
    assert clipped.item() == pytest.approx(-1.1) and stats.clip_fraction == 1.0


def test_kl_k3_and_beta() -> None:
    assert kl_k3(t([L(0.25)]), t([L(0.5)])).item() == pytest.approx(2 - L(2) - 1)
    logp = t([L(0.25)])
    loss, stats = policy_loss(
        logp, logp, torch.tensor([0.0], dtype=torch.float64), t([1]), beta=0.5, ref_logprobs=t([L(0.5)])
    )
    assert loss.item() == pytest.approx(0.5 * (2 - L(2) - 1)) and stats.kl == pytest.approx(2 - L(2) - 1)


def test_token_logprobs_and_entropy_use_the_sampling_temperature() -> None:
    logits = torch.tensor([[[2.0, 0.0]]])
    lp = token_logprobs(logits, torch.tensor([[0]]), torch.tensor([2.0]))
    assert lp.item() == pytest.approx(1 - L(math.e + 1))  # log_softmax([1, 0])[0]
    assert entropy(torch.zeros(1, 1, 4), torch.tensor([1.0])).item() == pytest.approx(L(4))


def group(gid: str, rewards: list[float | None], node_rewards: list[float] | None = None) -> TrajectoryGroup:
    runs = []
    for i, r in enumerate(rewards):
        spans = [NodeSpan(id=f"{gid}{i}s", name="critic", reward=node_rewards[i])] if node_rewards else []
        runs.append(Trajectory(id=f"{gid}{i}", status="ok", reward=r, spans=spans))
    return TrajectoryGroup(id=gid, trajectories=runs)


def test_group_advantages_scaling_and_skips() -> None:
    assert centred([1, 0, 0, 1], None) == [0.5, -0.5, -0.5, 0.5]
    adv = group_advantages(
        [group("a", [1, 0, 0, 1]), group("b", [0.3, 0.3]), group("c", [1.0]), group("d", [None, 1.0, 0.0])], "group"
    )
    assert [round(adv.by_trajectory[f"a{i}"], 3) for i in range(4)] == [1.0, -1.0, -1.0, 1.0]  # / std 0.5
    assert "b0" not in adv.by_trajectory and "c0" not in adv.by_trajectory
    assert adv.by_trajectory["d1"] == pytest.approx(1.0, abs=1e-3)
    assert adv.skipped == {
        "group with all-equal rewards": 2,
        "group of fewer than 2 scored runs": 1,
        "run has no reward": 1,
    }
    unscaled = group_advantages([group("a", [1, 0, 0, 1])], "none")
    assert unscaled.by_trajectory["a0"] == 0.5
    batch = group_advantages([group("a", [1, 0]), group("b", [4, 0])], "batch")  # batch std of [1,0,4,0] = 1.639
    assert batch.by_trajectory["b0"] == pytest.approx(2 / 1.6394, abs=1e-3)


def test_node_rewards_get_their_own_advantages() -> None:
    adv = group_advantages([group("a", [1.0, 0.0], node_rewards=[0.0, 1.0])], "none")
    assert adv.by_span == {"a0s": -0.5, "a1s": 0.5} and adv.by_trajectory == {"a0": 0.5, "a1": -0.5}


def test_chunked_logprobs_by_hand() -> None:
    """Head = identity on 2 logits. Position 0: logits [0, ln 3] -> p = [1/4, 3/4], target 1; position 1: logits
    [ln 2, 0] -> p = [2/3, 1/3], target 0. One token per chunk."""
    from langgraph_art.train.loss import chunked_logprobs_and_entropy

    hidden = torch.tensor([[[0.0, math.log(3)], [math.log(2), 0.0]]])  # [1, 2, 2]
    logprobs, entropy, log_mass = chunked_logprobs_and_entropy(
        hidden, lambda h: h, torch.tensor([[1, 0]]), torch.ones(1), 1
    )
    assert log_mass.tolist()[0] == [0.0, 0.0]  # no grammar: all the mass is allowed
    assert logprobs.tolist()[0] == pytest.approx([math.log(3 / 4), math.log(2 / 3)])
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    h1 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert entropy.tolist()[0] == pytest.approx([h0, h1])


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_logprobs_equal_the_whole_computation_with_gradients(chunk: int) -> None:
    from langgraph_art.train.loss import chunked_logprobs_and_entropy, token_logprobs_and_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(5, 11, bias=False)
    hidden = torch.randn(2, 7, 5, requires_grad=True)  # [B, T, H]
    targets = torch.randint(0, 11, (2, 7))
    temperature = torch.tensor([1.0, 0.7])
    results = []
    for fn in ("whole", "chunked"):
        hidden.grad, head.weight.grad = None, None
        if fn == "whole":
            logprobs, entropy, _ = token_logprobs_and_entropy(head(hidden), targets, temperature)
        else:
            logprobs, entropy, _ = chunked_logprobs_and_entropy(hidden, head, targets, temperature, chunk)
        (logprobs * torch.arange(7.0)).sum().backward()
        results.append((logprobs.detach(), entropy, hidden.grad.clone(), head.weight.grad.clone()))
    for whole, chunked in zip(*results, strict=True):
        assert torch.allclose(whole, chunked, atol=1e-6)
    assert not results[1][1].requires_grad  # entropy is a statistic, detached


def _packed(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    """Packed int32 masks [N, W] (models.grammar's layout) from lists of allowed token ids."""
    out = torch.zeros((len(allowed), (vocab + 31) // 32), dtype=torch.int64)
    for row, ids in enumerate(allowed):
        for t in ids:
            out[row, t // 32] |= 1 << (t % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def test_masked_logprobs_by_hand() -> None:
    """Logits [0, ln 3, ln 4] -> p = [1/8, 3/8, 4/8]. Position 0 allows {0, 1}: the sampler drew from [1/4, 3/4],
    target 1 -> log 3/4, mass inside the mask 1/2. Position 1 allows only {2} (a forced token): logprob 0, no
    gradient. Unmasked, the same targets have log 3/8 and log 4/8, and the mass is reported all the same."""
    from langgraph_art.train.loss import GrammarMasks, token_logprobs_and_entropy

    logits = torch.tensor([[[0.0, math.log(3), math.log(4)]] * 2], requires_grad=True)  # [1, 2, 3]
    targets = torch.tensor([[1, 2]])
    masks = GrammarMasks(torch.tensor([0, 0]), torch.tensor([0, 1]), _packed([[0, 1], [2]], 3))
    allowed = masks.dense(0, 2, 1, 3)
    assert allowed is not None and allowed.tolist() == [[[True, True, False], [False, False, True]]]
    logprobs, entropy, log_mass = token_logprobs_and_entropy(logits, targets, torch.ones(1), allowed)
    assert logprobs.tolist()[0] == pytest.approx([math.log(3 / 4), 0.0], abs=1e-6)
    assert log_mass.exp().tolist()[0] == pytest.approx([1 / 2, 1 / 2])
    assert entropy.tolist()[0] == pytest.approx([-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0], abs=1e-6)
    logprobs[0, 1].backward()
    assert logits.grad is not None and logits.grad.abs().max() == 0  # a forced token teaches nothing

    plain, plain_entropy, plain_mass = token_logprobs_and_entropy(logits, targets, torch.ones(1), allowed, False)
    assert plain.tolist()[0] == pytest.approx([math.log(3 / 8), math.log(4 / 8)])
    assert plain_mass.tolist()[0] == pytest.approx(log_mass.tolist()[0])
    assert plain_entropy.tolist()[0][0] == pytest.approx(-sum(p * math.log(p) for p in (1 / 8, 3 / 8, 4 / 8)))
    assert masks.dense(2, 4, 1, 3) is None  # no grammar in those columns


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_chunked_masked_logprobs_equal_the_whole_computation(chunk: int) -> None:
    from langgraph_art.train.loss import GrammarMasks, chunked_logprobs_and_entropy, token_logprobs_and_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 40, bias=False)  # 40 tokens: two packed words
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    targets = torch.tensor([[3, 33, 1, 7, 39], [0, 2, 35, 4, 6]])
    rows, cols = torch.tensor([0, 0, 1]), torch.tensor([1, 4, 2])
    masks = GrammarMasks(rows, cols, _packed([[33, 34], [39], [1, 35, 36]], 40))
    results = []
    for fn in ("whole", "chunked"):
        hidden.grad, head.weight.grad = None, None
        if fn == "whole":
            allowed = masks.dense(0, 5, 2, 40)
            logprobs, entropy, log_mass = token_logprobs_and_entropy(head(hidden), targets, torch.ones(2), allowed)
        else:
            logprobs, entropy, log_mass = chunked_logprobs_and_entropy(
                hidden, head, targets, torch.ones(2), chunk, masks
            )
        logprobs.sum().backward()
        results.append((logprobs.detach(), entropy, log_mass, hidden.grad.clone(), head.weight.grad.clone()))
    for whole, chunked in zip(*results, strict=True):
        assert torch.allclose(whole, chunked, atol=1e-6)
    assert results[0][0][0, 4] == 0.0 and results[0][2][0, 0] == 0.0  # forced token; no grammar at column 0


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_the_head_on_picked_positions_equals_the_whole_computation_there(chunk: int) -> None:
    """What the trainer does: the trained positions gathered into one row, a temperature per position, the grammar
    masks moved along (``GrammarMasks.gathered``); a mask at a position not picked is dropped."""
    from langgraph_art.train.loss import GrammarMasks, chunked_logprobs_and_entropy, token_logprobs_and_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 40, bias=False)
    hidden = torch.randn(2, 5, 4)
    targets = torch.tensor([[3, 33, 1, 7, 39], [0, 2, 35, 4, 6]])
    temperature = torch.tensor([0.7, 1.3])
    masks = GrammarMasks(torch.tensor([0, 0, 1]), torch.tensor([1, 4, 2]), _packed([[33, 34], [39], [1, 35, 36]], 40))
    picked = torch.tensor([[False, True, True, False, True], [False, False, True, True, False]])
    rows, cols = picked.nonzero(as_tuple=True)
    gathered = masks.gathered(rows, cols)
    assert gathered is not None and gathered.rows.tolist() == [0, 0, 0] and gathered.cols.tolist() == [0, 2, 3]
    whole = token_logprobs_and_entropy(head(hidden), targets, temperature, masks.dense(0, 5, 2, 40))
    apart = chunked_logprobs_and_entropy(
        hidden[rows, cols][None], head, targets[rows, cols][None], temperature[rows][None], chunk, gathered
    )
    for w, a in zip(whole, apart, strict=True):
        assert torch.allclose(w[rows, cols], a[0], atol=1e-6)
    assert masks.gathered(torch.tensor([0]), torch.tensor([0])) is None  # no grammar at the one picked position


def test_chunk_size_keeps_a_chunks_logits_under_the_budget() -> None:
    from langgraph_art.train.loss import LOGITS_PER_CHUNK, chunk_tokens

    assert chunk_tokens(rows=2, vocab=2**20) == 32 and LOGITS_PER_CHUNK >= 2 * 32 * 2**20
    assert chunk_tokens(rows=8, vocab=152_064) == LOGITS_PER_CHUNK // (8 * 152_064)
    assert chunk_tokens(rows=1, vocab=2**30) == 1
    assert chunk_tokens(rows=2, vocab=2048, chunk_size=5) == 5
