"""Exceptions raised by langgraph-art. Every message says what was wrong and what to change."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langgraph_art.types import Trajectory


class LangGraphArtError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(LangGraphArtError, ValueError):
    """A configuration value is invalid; the message names the field and the accepted values."""


class RequestError(LangGraphArtError, ValueError):
    """A request to the inference service is invalid (HTTP 400). ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ContextLengthError(RequestError):
    """The prompt (plus the requested completion) does not fit the model's context window (HTTP 400)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class ModelNotFoundError(LangGraphArtError, LookupError):
    """The requested model or adapter name is not served (HTTP 404)."""

    def __init__(self, message: str, param: str = "model") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class AdapterError(LangGraphArtError):
    """An adapter folder could not be loaded (not a peft adapter, or incompatible with the base model)."""


class EngineNotReadyError(LangGraphArtError):
    """The inference engine is still loading or has been closed (HTTP 503)."""


class RewardError(LangGraphArtError):
    """A reward function or judge produced something unusable; the message names it, the value and the run."""


class ServiceBusyError(LangGraphArtError):
    """The service has no free capacity for this request right now (HTTP 429); the message says what to change."""


class TrainingAborted(LangGraphArtError):
    """A step produced a non-finite loss or gradient (HTTP 422 from a service); the weights are as before the step
    and nothing was saved."""


class RolloutError(LangGraphArtError):
    """Runs failed and ``on_failure="raise"`` was asked for; ``failed`` holds their trajectories (all stored)."""

    def __init__(self, failed: list[Trajectory]) -> None:
        self.failed = failed
        first = failed[0].error if failed else ""
        super().__init__(f"{len(failed)} run(s) failed; first error: {first}")
