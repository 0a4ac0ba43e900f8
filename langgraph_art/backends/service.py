"""One base model's service: its engine, the OpenAI-compatible app, and (with ``train``) the policies' trainers behind
the training routes. ``build_service`` is the one place these are put together: ``langgraph-art serve`` serves the
result with uvicorn, ``LocalBackend`` in a thread of your process (``serve.embedded.EmbeddedServer(app=...)``), and
the tests build theirs the same way. Service and trainer meet here, in the workflow layer, never in ``serve/`` or
``train/`` (which do not import each other).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from langgraph_art.train.factory import TrainingOptions

if TYPE_CHECKING:
    from fastapi import FastAPI

    from langgraph_art.models.lora import SharedBase
    from langgraph_art.serve.engines.base import Engine
    from langgraph_art.train.policies import PolicyRegistry
    from langgraph_art.train.protocol import TrainerFactory
    from langgraph_art.train.ranks import RankGroup


@dataclass
class Service:
    """What ``build_service`` made: serve ``app`` (its engine starts loading when the app starts)."""

    engine: Engine
    app: FastAPI
    policies: PolicyRegistry | None  # None without the training API
    ranks: RankGroup | None = None  # the torchrun group this process leads, stopped on close

    def register(self, served_name: str) -> None:
        """Serve ``project/name`` as a trainable model: the base model until its first checkpoint (what ``POST
        /v1/policies`` does; ``RequestError`` for a name that is not plain)."""
        from langgraph_art.serve.routes.catalog import add_policy

        add_policy(self.engine, self.app.state.policies, served_name)

    def close(self) -> None:
        """Close the trainers (their processes exit; a step under way finishes first), then tell torchrun's other
        ranks to stop. The engine closes with the app."""
        if self.policies is not None:
            self.policies.close()
        if self.ranks is not None:
            from langgraph_art.train.ranks import stop_followers

            stop_followers(self.ranks)


def build_service(
    model: str | os.PathLike[str],
    *,
    home: str | Path,
    engine: str = "hf",
    served_name: str | None = None,
    device: str | None = None,
    chat_template: str | None = None,
    tool_call_parser: str = "auto",
    reasoning_parser: str | None = "auto",
    engine_options: Mapping[str, object] | None = None,
    api_key: str | None = None,
    adapter_roots: Sequence[str | os.PathLike[str]] = (),
    train: bool = True,
    max_trainers: int | None = None,
    training: TrainingOptions | None = None,
    ranks: RankGroup | None = None,
    trainer_factory: TrainerFactory | None = None,
    keep_loaded: int = 4,
) -> Service:
    """Build (not start) the service for ``model`` under ``home``, where checkpoints live.

    ``engine``/``engine_options``: which engine and its options (``serve.engines.choose.ENGINE_OPTIONS``; ConfigError
    for another engine's). ``adapter_roots``: folders ``POST /v1/adapters`` may load from besides ``home``.
    ``training``: where the trainers run (``TrainingOptions``; its ``share_weights`` is checked against the engine's
    option of that name); ``ranks``: the torchrun group this process leads (``training.torchrun``).
    ``trainer_factory``: another way to make trainers (a test's); by default ``train.factory.trainer_factory``.
    ``tool_call_parser``/``reasoning_parser``: how replies are read (``serve.app.create_app``)."""
    from langgraph_art.serve.app import create_app
    from langgraph_art.serve.engines.choose import build_engine, check_engine_options

    options = {key: value for key, value in (engine_options or {}).items() if value is not None}
    check_engine_options(engine, options)
    # one check of the trainers' place against the engine's weights (ConfigError when they cannot share them)
    share = options.get("share_weights")
    training = replace(training or TrainingOptions(), share_weights=share if isinstance(share, bool) else None)
    template = {"chat_template": chat_template} if chat_template is not None else {}
    built: Engine = build_engine(engine, model, served_name=served_name, device=device, **template, **options)
    app = create_app(built, api_key=api_key, adapter_roots=[home, *adapter_roots], tool_call_parser=tool_call_parser,
                     reasoning_parser=reasoning_parser)  # fmt: skip
    if not train:
        return Service(built, app, None)
    from langgraph_art.backends.teacher_scoring import ServedTeacher
    from langgraph_art.serve.routes.training import training_router
    from langgraph_art.train.factory import trainer_factory as default_factory
    from langgraph_art.train.policies import PolicyRegistry

    def shared() -> SharedBase | None:  # the engine's weights, once loaded, when it offers them (hf)
        offered: SharedBase | None = getattr(built, "shared_base", None)
        return offered

    factory = trainer_factory or default_factory(training, shared=shared, ranks=ranks)
    teacher = ServedTeacher(built, lambda: getattr(app.state, "loop", None), lambda: app.state.policies)
    policies = PolicyRegistry(os.fspath(model), home, device=device, max_trainers=max_trainers,
                              trainer_factory=factory, chat_template=chat_template, score_teacher=teacher)  # fmt: skip
    app.include_router(training_router(built, policies, keep_loaded=keep_loaded))
    return Service(built, app, policies, ranks if training.torchrun else None)
