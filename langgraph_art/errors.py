"""Exceptions raised by langgraph-art. Every message says what was wrong and what to change.

``HTTP_ERRORS`` is the one vocabulary between the service and its clients: the service answers each error class with
its row's status, OpenAI error type and code (``serve/http_errors.py``), and ``RemoteBackend`` raises the class of the
row an answer matches (``error_from_http``), so a remote step fails as a local one does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


# (class, HTTP status, OpenAI error type, code): a subclass before its base; code None = the error's own ``code``
HTTP_ERRORS: tuple[tuple[type[LangGraphArtError], int, str, str | None], ...] = (
    (ContextLengthError, 400, "invalid_request_error", "context_length_exceeded"),
    (RequestError, 400, "invalid_request_error", None),
    (AdapterError, 400, "invalid_request_error", "invalid_adapter"),
    (ConfigError, 400, "invalid_request_error", "invalid_config"),
    (ModelNotFoundError, 404, "invalid_request_error", "model_not_found"),
    (TrainingAborted, 422, "training_error", "aborted"),
    (ServiceBusyError, 429, "rate_limit_error", "busy"),
    (EngineNotReadyError, 503, "service_unavailable", "loading"),
)
RETRY_AFTER = {429: 5, 503: 2}  # seconds the service asks a client to wait (the ``retry-after`` header)


def http_row(error: LangGraphArtError) -> tuple[int, str, str | None]:
    """The status, OpenAI error type and code the service answers ``error`` with (500 for one not in the table)."""
    for cls, status, kind, code in HTTP_ERRORS:
        if isinstance(error, cls):
            return status, kind, code if code is not None else getattr(error, "code", None)
    return 500, "server_error", None


def error_from_http(status: int, error: dict[str, Any], where: str) -> LangGraphArtError:
    """The exception a service's error answer stands for (``error``: the ``{"message", "type", "param", "code"}``
    object of OpenAI's error JSON): the row with its code, else the first with its status; ``where`` names the
    service in the message of anything else."""
    message, code, param = str(error.get("message") or ""), error.get("code"), error.get("param")
    rows = [r for r in HTTP_ERRORS if r[3] is not None and r[3] == code and r[1] == status]
    rows = rows or [r for r in HTTP_ERRORS if r[1] == status and r[0] is not ContextLengthError]
    if not rows:
        return LangGraphArtError(f"{where} answered {status}: {message or error}")
    cls = rows[0][0]
    if cls is ContextLengthError:
        return ContextLengthError(message, param or "messages")
    if issubclass(cls, RequestError):
        return RequestError(message, param, code or "invalid_request")
    if cls is ModelNotFoundError:
        return ModelNotFoundError(message, param or "model")
    return cls(message)
