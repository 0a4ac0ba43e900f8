"""What every backend does, in one protocol: ``Trainer`` and ``TrainableModel`` talk to any object that satisfies it.

``LocalBackend`` (``backends/local.py``) runs the service embedded in this process; ``RemoteBackend``
(``backends/remote.py``) talks to a ``langgraph-art serve`` elsewhere. A test can pass a fake.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx

from langgraph_art.errors import ConfigError
from langgraph_art.store import TrajectoryStore
from langgraph_art.types import StepResult, TrajectoryGroup

if TYPE_CHECKING:
    from langgraph_art.config import GRPOConfig
    from langgraph_art.model import TrainableModel
    from langgraph_art.train.protocol import SFTExample


@runtime_checkable
class Backend(Protocol):
    """Serves a trainable model's current policy, keeps its runs and trains it."""

    home: Path

    def register(self, model: TrainableModel) -> None:
        """Make ``model`` servable (its latest checkpoint, or the base model before the first)."""

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]:
        """``base_url`` and ``api_key`` for ``ChatART(model=model)``."""
        ...

    def store(self, model: TrainableModel) -> TrajectoryStore:
        """Where the model's runs are kept."""
        ...

    def run_dir(self, model: TrainableModel) -> Path:
        """Where a training run's metrics and plots go."""
        ...

    def current_step(self, model: TrainableModel) -> int:
        """The checkpoint that serves the model now (0 before the first)."""
        ...

    def engine_stats(self, model: TrainableModel) -> dict[str, float]:
        """The counters of the engine serving ``model`` (``Engine.stats``: prompt tokens sent and prefilled, prefix
        cache queries and hits, ...); empty where none can be read. The loop records each rollout's share."""
        ...

    def trainer(self, model: TrainableModel, config: GRPOConfig | None = None) -> None:
        """Get the model's trainer ready (load or resume) with ``config``; before the first rollout."""

    def train_step(
        self, model: TrainableModel, groups: Sequence[TrajectoryGroup], config: GRPOConfig | None = None
    ) -> StepResult:
        """One GRPO step on scored groups; when the weights changed, checkpoint and serve ``project/name@step``."""
        ...

    def warmup(
        self,
        model: TrainableModel,
        examples: Sequence[SFTExample],
        *,
        steps: int,
        learning_rate: float | None = None,
        config: GRPOConfig | None = None,
    ) -> list[float]:
        """SFT warm-up of the model's LoRA; the result is saved and served. Returns the loss per step."""
        ...


def register_policy(base_url: str, api_key: str | None, name: str) -> None:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{base_url}/policies", json={"name": name}, headers=headers, timeout=30)
    except httpx.TransportError as exc:
        raise ConfigError(f"cannot reach the langgraph-art service at {base_url}: {exc}") from exc
    if response.status_code != 200:
        raise ConfigError(f"the service at {base_url} refused policy {name!r}: {response.text}")
