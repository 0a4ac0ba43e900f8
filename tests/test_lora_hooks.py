"""HookedLora against peft: same outputs for the same adapter, the same init for the same seed, one active adapter
per model, training through the hooks (checkpointed too), and peft's folder format both ways."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.models.lora import HookedLora  # noqa: E402


@pytest.fixture(scope="module")
def base(tiny_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def peft_folder(base: Any, out: Path, seed: int, targets: Any = "all-linear") -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    get_peft_model(copy.deepcopy(base), config).save_pretrained(str(out))
    return out


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 300, 42, 7, 99, 1000, 3]])


def test_a_hooked_peft_adapter_gives_peft_outputs(base: Any, tmp_path: Path) -> None:
    from peft import PeftModel

    for targets in ("all-linear", ["q_proj", "v_proj"]):
        folder = peft_folder(base, tmp_path / str(targets), 1, targets)
        want = logits(PeftModel.from_pretrained(copy.deepcopy(base), str(folder)).eval(), IDS)
        model = copy.deepcopy(base)
        lora = HookedLora(model)
        plain = logits(model, IDS)
        lora.load_peft("a", folder)
        with lora.active("a"):
            got = logits(model, IDS)
        assert torch.allclose(got, want, atol=1e-5)
        assert torch.equal(logits(model, IDS), plain)  # outside the block: the base model, untouched
        lora.detach()


def test_a_trainable_adapter_starts_as_peft_starts_it_and_leaves_the_rng_alone(base: Any) -> None:
    """Same seed, same LoRA init as peft's get_peft_model (a run seeded before the switch is the same run)."""
    from peft import LoraConfig, get_peft_model

    for targets in ("all-linear", ["q_proj", "v_proj"]):
        torch.manual_seed(7)
        peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        theirs = {k.replace(".default", ""): p for k, p in peft_model.named_parameters() if "lora_" in k}
        torch.manual_seed(1234)
        expected = torch.rand(3)
        torch.manual_seed(1234)
        ours = HookedLora(copy.deepcopy(base)).add_trainable("t", r=4, alpha=8, target_modules=targets, seed=7)
        assert torch.equal(torch.rand(3), expected)  # the caller's RNG stream is untouched
        assert list(ours) == list(theirs)  # same tensors, same (layer) order: optimizer state files stay valid
        for key, param in ours.items():
            assert torch.equal(param, theirs[key]), key


def test_one_adapter_active_at_a_time_and_nested_blocks_restore(base: Any, tmp_path: Path) -> None:
    model = copy.deepcopy(base)
    lora = HookedLora(model)
    lora.load_peft("one", peft_folder(base, tmp_path / "one", 1))
    lora.load_peft("two", peft_folder(base, tmp_path / "two", 2))
    plain = logits(model, IDS)
    with lora.active("one"):
        first = logits(model, IDS)
        with lora.active("two"):
            second = logits(model, IDS)
        assert torch.equal(logits(model, IDS), first)
        with lora.active(None):
            assert torch.equal(logits(model, IDS), plain)
    assert torch.equal(logits(model, IDS), plain)
    assert not torch.allclose(first, second) and not torch.allclose(first, plain)


def test_gradient_checkpointing_recomputes_with_the_adapter(base: Any) -> None:
    """Checkpointed layers run their forward again inside backward: the hooks must add the same adapter there."""
    grads = []
    for checkpointing in (False, True):
        model = copy.deepcopy(base).train()
        model.requires_grad_(False)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lora = HookedLora(model)
        params = lora.add_trainable("t", r=4, alpha=8, seed=3)
        for key, param in params.items():
            if "lora_B" in key:
                torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(len(key)))
        with lora.active("t"):
            loss = model(input_ids=IDS).logits.square().mean()
            loss.backward()
        grads.append([p.grad.clone() for p in params.values()])
    for plain, recomputed in zip(*grads, strict=True):
        assert torch.allclose(plain, recomputed, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[1])


def test_training_through_the_hooks_moves_only_the_adapter_and_saves_for_peft(base: Any, tmp_path: Path) -> None:
    from peft import PeftModel

    model = copy.deepcopy(base)
    for p in model.parameters():
        p.requires_grad_(False)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    lora = HookedLora(model)
    named = lora.add_trainable("train", r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    params = list(named.values())
    assert torch.equal(logits(model, IDS), logits(base, IDS))  # B = 0: a fresh adapter changes nothing
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(3):
        with lora.active("train"):
            out = model(input_ids=IDS).logits
        loss = -torch.log_softmax(out[0, :-1], -1).gather(-1, IDS[0, 1:, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.equal(v, frozen[k]) for k, v in model.state_dict().items())  # base weights untouched
    assert all(p.abs().sum() > 0 for p in params[1::2])  # every B moved
    folder = lora.save_peft("train", tmp_path / "saved", base_model="tiny")
    with lora.active("train"):
        ours = logits(model, IDS)
    theirs = logits(PeftModel.from_pretrained(copy.deepcopy(base), str(folder)).eval(), IDS)
    assert torch.allclose(ours, theirs, atol=1e-5)
    fresh = HookedLora(copy.deepcopy(base))
    fresh.load_peft("again", folder)
    with fresh.active("again"):
        assert torch.allclose(logits(fresh.model, IDS), ours, atol=1e-6)


def test_bad_names_and_adapters_are_refused(base: Any, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from langgraph_art.errors import AdapterError

    lora = HookedLora(copy.deepcopy(base))
    with pytest.raises(KeyError, match="not loaded"):
        lora.active("missing").__enter__()
    with pytest.raises(AdapterError, match="matches no linear layer"):
        lora.add_trainable("t", r=4, alpha=8, target_modules=["nope"])
    dora = tmp_path / "dora"
    get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)).save_pretrained(dora)
    with pytest.raises(AdapterError, match="only plain LoRA"):
        lora.load_peft("dora", dora)
