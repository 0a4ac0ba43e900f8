"""langgraph-art: reinforcement learning for existing LangGraph agents.

The names here are the workflow: capture runs of your graph (``ChatART``, ``rollout``), say what a good run is
(``reward``, ``RulerJudge``), train (``Trainer``, ``GRPOConfig``, a backend, ``RayRollouts`` for rollouts on Ray,
``Teacher`` for distillation), evaluate; the data they pass (``Trajectory``, ``TrajectoryGroup``,
``TrajectoryStore``); the extension points (``Backend``, ``Sink``, ``RewardSource``); and the errors a caller
handles. The parts of a trajectory are in ``langgraph_art.types``, every error in ``langgraph_art.errors``, the
inference service (engines, the app, the embedded server) in ``langgraph_art.serve``, the offline tiny models in
``langgraph_art.models.tiny`` (``tiny_model()``), and what the tests share (a weather tool and its adapter, small
graphs, ``FakeBackend``) in ``langgraph_art.testing``. ``import langgraph_art`` stays light (no torch, transformers,
peft, vllm, fastapi or langfuse): the heavy parts load on first use of the names below.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from langgraph_art.errors import (
    ConfigError,
    LangGraphArtError,
    ModelNotFoundError,
    RewardError,
    RolloutError,
    ServiceBusyError,
    TrainingAborted,
)

try:
    __version__ = version("langgraph-art")  # pyproject.toml is the one place it is written
except PackageNotFoundError:  # pragma: no cover - a source tree on sys.path without an install
    __version__ = "0+unknown"

_LAZY = {
    # capture
    "ChatART": "langgraph_art.capture.chat_model",
    "TrajectoryCallbackHandler": "langgraph_art.capture.callbacks",
    "rollout": "langgraph_art.capture.rollout",
    "arollout": "langgraph_art.capture.rollout",
    "Branching": "langgraph_art.capture.branching",
    "gather_groups": "langgraph_art.capture.rollout",
    "agather_groups": "langgraph_art.capture.rollout",
    # rewards
    "reward": "langgraph_art.rewards.decorators",
    "Score": "langgraph_art.rewards.decorators",
    "RulerJudge": "langgraph_art.rewards.judge",
    "RewardSource": "langgraph_art.rewards.combine",
    "score_groups": "langgraph_art.rewards.combine",
    "ascore_groups": "langgraph_art.rewards.combine",
    # training and evaluation
    "TrainableModel": "langgraph_art.model",
    "Trainer": "langgraph_art.loop",
    "RayRollouts": "langgraph_art.rollouts",
    "GRPOConfig": "langgraph_art.config",
    "LocalBackend": "langgraph_art.backends.local",
    "RemoteBackend": "langgraph_art.backends.remote",
    "Backend": "langgraph_art.backends.base",
    "Sink": "langgraph_art.sinks",
    "Teacher": "langgraph_art.teacher",
    "evaluate": "langgraph_art.evaluation",
    "aevaluate": "langgraph_art.evaluation",
    # data
    "Trajectory": "langgraph_art.types",
    "TrajectoryGroup": "langgraph_art.types",
    "TrajectoryStore": "langgraph_art.store",
}

if TYPE_CHECKING:
    from langgraph_art.backends.base import Backend
    from langgraph_art.backends.local import LocalBackend
    from langgraph_art.backends.remote import RemoteBackend
    from langgraph_art.capture.branching import Branching
    from langgraph_art.capture.callbacks import TrajectoryCallbackHandler
    from langgraph_art.capture.chat_model import ChatART
    from langgraph_art.capture.rollout import agather_groups, arollout, gather_groups, rollout
    from langgraph_art.config import GRPOConfig
    from langgraph_art.evaluation import aevaluate, evaluate
    from langgraph_art.loop import Trainer
    from langgraph_art.model import TrainableModel
    from langgraph_art.rewards.combine import RewardSource, ascore_groups, score_groups
    from langgraph_art.rewards.decorators import Score, reward
    from langgraph_art.rewards.judge import RulerJudge
    from langgraph_art.rollouts import RayRollouts
    from langgraph_art.sinks import Sink
    from langgraph_art.store import TrajectoryStore
    from langgraph_art.teacher import Teacher
    from langgraph_art.types import Trajectory, TrajectoryGroup


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_art' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Backend",
    "Branching",
    "ChatART",
    "ConfigError",
    "GRPOConfig",
    "LangGraphArtError",
    "LocalBackend",
    "ModelNotFoundError",
    "RayRollouts",
    "RemoteBackend",
    "RewardError",
    "RewardSource",
    "RolloutError",
    "RulerJudge",
    "Score",
    "ServiceBusyError",
    "Sink",
    "Teacher",
    "TrainableModel",
    "Trainer",
    "TrainingAborted",
    "Trajectory",
    "TrajectoryCallbackHandler",
    "TrajectoryGroup",
    "TrajectoryStore",
    "__version__",
    "aevaluate",
    "agather_groups",
    "arollout",
    "ascore_groups",
    "evaluate",
    "gather_groups",
    "reward",
    "rollout",
    "score_groups",
]
