"""langgraph-art: reinforcement learning for existing LangGraph agents.

``import langgraph_art`` stays light (no torch, transformers, peft, vllm, fastapi or langfuse): the heavy parts
load on first use of the names below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from langgraph_art.errors import (
    AdapterError,
    ConfigError,
    ContextLengthError,
    EngineNotReadyError,
    LangGraphArtError,
    ModelNotFoundError,
    RequestError,
    RewardError,
)

__version__ = "0.1.0"

_LAZY = {
    "ChatART": "langgraph_art.capture.chat_model",
    "TrajectoryCallbackHandler": "langgraph_art.capture.callbacks",
    "TurnRecorder": "langgraph_art.capture.recorder",
    "rollout": "langgraph_art.capture.rollout",
    "arollout": "langgraph_art.capture.rollout",
    "gather_groups": "langgraph_art.capture.rollout",
    "agather_groups": "langgraph_art.capture.rollout",
    "RolloutError": "langgraph_art.capture.rollout",
    "TrajectoryStore": "langgraph_art.store",
    "reward": "langgraph_art.rewards.decorators",
    "RewardFunction": "langgraph_art.rewards.decorators",
    "Score": "langgraph_art.rewards.decorators",
    "RulerJudge": "langgraph_art.rewards.judge",
    "score_groups": "langgraph_art.rewards.combine",
    "ascore_groups": "langgraph_art.rewards.combine",
    "RewardReport": "langgraph_art.rewards.combine",
    "TrainableModel": "langgraph_art.model",
    "evaluate": "langgraph_art.evaluation",
    "aevaluate": "langgraph_art.evaluation",
    "Evaluation": "langgraph_art.evaluation",
    "Sink": "langgraph_art.sinks",
    "Trainer": "langgraph_art.loop",
    "GRPOConfig": "langgraph_art.config",
    "LocalBackend": "langgraph_art.backends.local",
    "RemoteBackend": "langgraph_art.backends.remote",
    "Backend": "langgraph_art.backends.base",
    "StepResult": "langgraph_art.types",
    "Turn": "langgraph_art.types",
    "ModelRef": "langgraph_art.types",
    "ToolCallRecord": "langgraph_art.types",
    "NodeSpan": "langgraph_art.types",
    "Trajectory": "langgraph_art.types",
    "TrajectoryGroup": "langgraph_art.types",
    "tiny_model": "langgraph_art.models.tiny",
    "EmbeddedServer": "langgraph_art.serve.embedded",
    "start_embedded_server": "langgraph_art.serve.embedded",
    "HFEngine": "langgraph_art.serve.engines.hf",
    "VLLMEngine": "langgraph_art.serve.engines.vllm_engine",
    "create_app": "langgraph_art.serve.app",
}

if TYPE_CHECKING:
    from langgraph_art.backends.base import Backend
    from langgraph_art.backends.local import LocalBackend
    from langgraph_art.backends.remote import RemoteBackend
    from langgraph_art.capture.callbacks import TrajectoryCallbackHandler
    from langgraph_art.capture.chat_model import ChatART
    from langgraph_art.capture.recorder import TurnRecorder
    from langgraph_art.capture.rollout import RolloutError, agather_groups, arollout, gather_groups, rollout
    from langgraph_art.config import GRPOConfig
    from langgraph_art.evaluation import Evaluation, aevaluate, evaluate
    from langgraph_art.loop import Trainer
    from langgraph_art.model import TrainableModel
    from langgraph_art.models.tiny import tiny_model
    from langgraph_art.rewards.combine import RewardReport, ascore_groups, score_groups
    from langgraph_art.rewards.decorators import RewardFunction, Score, reward
    from langgraph_art.rewards.judge import RulerJudge
    from langgraph_art.serve.app import create_app
    from langgraph_art.serve.embedded import EmbeddedServer, start_embedded_server
    from langgraph_art.serve.engines.hf import HFEngine
    from langgraph_art.serve.engines.vllm_engine import VLLMEngine
    from langgraph_art.sinks import Sink
    from langgraph_art.store import TrajectoryStore
    from langgraph_art.types import ModelRef, NodeSpan, StepResult, ToolCallRecord, Trajectory, TrajectoryGroup, Turn


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
    "AdapterError",
    "Backend",
    "ChatART",
    "ConfigError",
    "ContextLengthError",
    "EmbeddedServer",
    "EngineNotReadyError",
    "Evaluation",
    "GRPOConfig",
    "HFEngine",
    "LangGraphArtError",
    "LocalBackend",
    "ModelNotFoundError",
    "ModelRef",
    "NodeSpan",
    "RemoteBackend",
    "RequestError",
    "RewardError",
    "RewardFunction",
    "RewardReport",
    "RolloutError",
    "RulerJudge",
    "Score",
    "Sink",
    "StepResult",
    "ToolCallRecord",
    "TrainableModel",
    "Trainer",
    "Trajectory",
    "TrajectoryCallbackHandler",
    "TrajectoryGroup",
    "TrajectoryStore",
    "Turn",
    "TurnRecorder",
    "VLLMEngine",
    "__version__",
    "aevaluate",
    "agather_groups",
    "arollout",
    "ascore_groups",
    "create_app",
    "evaluate",
    "gather_groups",
    "reward",
    "rollout",
    "score_groups",
    "start_embedded_server",
    "tiny_model",
]
