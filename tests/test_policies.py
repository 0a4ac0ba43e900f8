"""PolicyRegistry, the one owner of live trainers (LocalBackend and the service's training routes both use it)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError, ServiceBusyError
from langgraph_art.train.policies import PolicyRegistry
from langgraph_art.types import StepResult


class Recording:
    """A trainer that records how it was made and used."""

    made: ClassVar[list[Recording]] = []

    def __init__(
        self,
        base_model: str,
        config: Any,
        *,
        checkpoint_dir: Path,
        device: str | None,
        chat_template: str | None = None,
    ) -> None:
        self.base_model, self.config, self.checkpoint_dir, self.device = base_model, config, checkpoint_dir, device
        self.step_count, self.configs, self.closed = 0, [config], False
        Recording.made.append(self)

    def update_config(self, config: GRPOConfig) -> None:
        if self.config is not None and config.lora_r != self.config.lora_r:
            raise ConfigError("['lora_r'] cannot change for a model that already has a LoRA")
        self.config = config
        self.configs.append(config)

    def step(self, groups: Any) -> StepResult:
        self.step_count += 1
        return StepResult(self.step_count, True)

    def save_checkpoint(self) -> Path:
        folder = self.checkpoint_dir / f"step-{self.step_count:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def sft(self, examples: Any, *, steps: int, learning_rate: float | None = None) -> list[float]:
        return [1.0] * steps

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def registry(tmp_path: Path) -> PolicyRegistry:
    Recording.made = []
    return PolicyRegistry("tiny", tmp_path, device="cuda:1", max_trainers=2, trainer_factory=Recording)


def test_a_policy_is_project_and_name(registry: PolicyRegistry, tmp_path: Path) -> None:
    (a, folder_a), (b, folder_b) = registry.step("p1", "agent", []), registry.step("p2", "agent", [])
    assert a.step == b.step == 1 and len(Recording.made) == 2  # same name, two projects: two trainers
    assert folder_a == tmp_path / "p1" / "checkpoints" / "agent" / "step-000001"
    assert folder_b == tmp_path / "p2" / "checkpoints" / "agent" / "step-000001"
    assert registry.current_step("p1", "agent") == 1 and registry.current_step("p1", "other") == 0
    assert {t.device for t in Recording.made} == {"cuda:1"}  # the service's --device reaches its trainers


def test_a_changed_config_reaches_the_live_trainer_or_is_refused(registry: PolicyRegistry) -> None:
    first, second = GRPOConfig(learning_rate=1e-3), GRPOConfig(learning_rate=5e-4)
    registry.prepare("p", "agent", first)
    registry.step("p", "agent", [], second)
    (trainer,) = Recording.made
    assert trainer.configs == [first, second] and trainer.config.learning_rate == 5e-4
    with pytest.raises(ConfigError, match="lora_r"):
        registry.step("p", "agent", [], GRPOConfig(lora_r=16))
    registry.step("p", "agent", [])  # None keeps the current config
    assert trainer.config is second


def test_names_are_checked_and_stay_under_home(registry: PolicyRegistry, tmp_path: Path) -> None:
    for project, name in (("../x", "a"), ("p", "a@1"), ("p", "../../etc"), ("", "a")):
        with pytest.raises(ConfigError, match="letters, digits"):
            registry.step(project, name, [])
    (tmp_path / "p" / "checkpoints").mkdir(parents=True)
    (tmp_path / "p" / "checkpoints" / "out").symlink_to(tmp_path.parent)
    with pytest.raises(ConfigError, match="outside"):
        registry.step("p", "out", [])
    assert Recording.made == []


def test_the_least_recently_used_idle_trainer_makes_room(registry: PolicyRegistry) -> None:
    for name in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        registry.prepare("p", name)
        assert len(registry) <= 2
    registry.prepare("p", "a")
    assert [t.checkpoint_dir.name for t in Recording.made] == ["a", "b", "c"]  # "a" was kept, not rebuilt
    assert [t.closed for t in Recording.made] == [False, True, False]  # "b" was closed when dropped
    registry.prepare("p", "b")
    assert [t.checkpoint_dir.name for t in Recording.made] == ["a", "b", "c", "b"]  # dropped, rebuilt (resumes)


def test_busy_trainers_are_never_dropped(registry: PolicyRegistry) -> None:
    entered, release = threading.Event(), threading.Event()

    def hold(name: str) -> None:
        with registry.lease("p", name):
            entered.set()
            release.wait(10)

    holders = [threading.Thread(target=hold, args=(name,)) for name in ("a", "b")]
    for holder in holders:
        entered.clear()
        holder.start()
        assert entered.wait(10)
    with pytest.raises(ServiceBusyError, match="--max-trainers"):
        registry.prepare("p", "c")
    release.set()
    for holder in holders:
        holder.join(10)
    registry.prepare("p", "c")  # now an idle one makes room
    assert len(registry) == 2
