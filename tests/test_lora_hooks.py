"""HookedLora against peft: same outputs for the same adapter, per-thread adapters on one model, training through
the hooks, and peft's folder format both ways."""

from __future__ import annotations

import copy
import threading
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


def test_each_thread_runs_its_own_adapter_on_one_model(base: Any, tmp_path: Path) -> None:
    model = copy.deepcopy(base)
    lora = HookedLora(model)
    lora.load_peft("one", peft_folder(base, tmp_path / "one", 1))
    lora.load_peft("two", peft_folder(base, tmp_path / "two", 2))
    alone = {}
    for name in ("one", "two", None):
        with lora.active(name):
            alone[name] = logits(model, IDS)
    seen: dict[Any, list[torch.Tensor]] = {"one": [], "two": [], None: []}
    barrier = threading.Barrier(3)

    def run(name: str | None) -> None:
        with lora.active(name):
            barrier.wait()
            for _ in range(5):
                seen[name].append(logits(model, IDS))

    threads = [threading.Thread(target=run, args=(name,)) for name in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name, outputs in seen.items():
        assert len(outputs) == 5 and all(torch.equal(o, alone[name]) for o in outputs), name
    assert not torch.allclose(alone["one"], alone["two"])


def test_training_through_the_hooks_moves_only_the_adapter_and_saves_for_peft(base: Any, tmp_path: Path) -> None:
    from peft import PeftModel

    model = copy.deepcopy(base)
    for p in model.parameters():
        p.requires_grad_(False)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    lora = HookedLora(model, ["q_proj", "v_proj", "down_proj"])
    params = lora.add_trainable("train", r=4, alpha=8, generator=torch.Generator().manual_seed(0))
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
    lora = HookedLora(copy.deepcopy(base), ["q_proj"])
    with pytest.raises(KeyError, match="not loaded"):
        lora.active("missing").__enter__()
    with pytest.raises(ValueError, match="is not a hooked linear layer"):
        lora.load_peft("wide", peft_folder(base, tmp_path / "wide", 3, ["q_proj", "v_proj"]))
    with pytest.raises(ValueError, match="matches no linear layer"):
        HookedLora(copy.deepcopy(base), ["nope"])
