"""A served teacher: the logprobs of each sampled token under a model the trainer does not hold, fetched by the
service before the step (``GRPOConfig.teacher_is_served``; the guide: docs/guides/distillation.md).

``ServedTeacher`` is the ``TeacherScoring`` that ``build_service`` gives its ``PolicyRegistry``. For each trainable
turn of a step's groups it renders what the teacher sees exactly as the trainer would have
(``train.tokenize.teacher_sequences``: the turn's prompt ids, or its privileged ``teacher_messages`` through the chat
template), appends the turn's sampled ids and asks for each sampled token's logprob at the turn's temperature:

- of the service's own engine (``Scorer``), when the teacher is a model it serves: a policy's checkpoint
  (``"project/name@step"``), an adapter loaded with ``POST /v1/adapters``, or the base model by its served name;
- of another server (``teacher_base_url``) through its ``POST /v1/completions`` with ``prompt_logprobs`` (vLLM's
  shape, which ``langgraph-art serve`` answers too); ``LANGGRAPH_ART_TEACHER_API_KEY`` is its key, if it wants one.

The teacher must tokenize as the student does, or its logprobs are of other tokens: every token another server scores
comes back decoded, and one decoded otherwise than by the student's tokenizer (or an id outside its vocabulary) is a
``ConfigError`` naming both models. Scores are written to ``Turn.teacher_logprobs`` (the local backend's store keeps
them with the run; a remote backend's client does not get them back). Served teachers score without the turn's
grammar: their logprobs are over the whole vocabulary (the trainer's own teachers renormalise inside it), so under a
grammar the KL to them also counts the mass they put outside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from langgraph_art.config import GRPOConfig
from langgraph_art.errors import ConfigError, EngineNotReadyError, LangGraphArtError
from langgraph_art.serve.engines.base import Engine, Scorer, ScoreRequest
from langgraph_art.serve.routes.completions import resolve_adapter
from langgraph_art.train.tokenize import teacher_sequences
from langgraph_art.types import TrajectoryGroup

API_KEY_VARIABLE = "LANGGRAPH_ART_TEACHER_API_KEY"
CONCURRENT = 16  # scoring requests in flight to another server


class ServedTeacher:
    """``TeacherScoring`` through ``engine`` (the service's) or another server. ``loop``: the event loop the engine
    runs on, once the app has started (None before); ``policies``: the trainable models' served names (a policy
    with no checkpoint yet is its base model)."""

    def __init__(
        self,
        engine: Engine,
        loop: Callable[[], asyncio.AbstractEventLoop | None],
        policies: Callable[[], set[str]] = set,
        *,
        timeout: float = 600.0,
    ) -> None:
        self.engine, self._loop, self._policies, self.timeout = engine, loop, policies, timeout

    def __call__(self, groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> None:
        """Score the groups' trainable turns on the engine's loop, from the trainer's thread."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            raise EngineNotReadyError("the service is not running: the served teacher cannot score the step's turns")
        asyncio.run_coroutine_threadsafe(self.score(groups, config), loop).result(self.timeout)

    async def score(self, groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> None:
        """Write each trainable turn's ``teacher_logprobs``."""
        runs = [run for group in groups for run in group.trajectories]
        pairs = teacher_sequences(runs, self.engine.tokenizer, nodes=config.trainable_nodes)
        if not pairs:
            return
        requests = [ScoreRequest(seq.input_ids, len(seq) - len(turn.token_ids), None, seq.temperature)
                    for turn, seq in pairs]  # fmt: skip
        if config.teacher_base_url is not None:
            scored = await self._score_remote(requests, config)
        else:
            scored = await self._score_here(requests, config)
        for (turn, _), logprobs in zip(pairs, scored, strict=True):
            turn.teacher_logprobs = logprobs

    async def _score_here(self, requests: list[ScoreRequest], config: GRPOConfig) -> list[list[float]]:
        engine = self.engine
        if not isinstance(engine, Scorer):
            raise ConfigError(
                f"teacher_model={config.teacher_model!r}: the {type(engine).__name__} engine does not score token "
                "ids; serve the teacher elsewhere (teacher_base_url=...) or use 'base'/'policy'"
            )
        try:
            adapter = resolve_adapter(engine, str(config.teacher_model), self._policies())
        except LangGraphArtError as exc:
            raise ConfigError(f"teacher_model={config.teacher_model!r}: {exc}") from None
        return list(await asyncio.gather(*(engine.score(dataclasses.replace(r, adapter=adapter)) for r in requests)))

    async def _score_remote(self, requests: list[ScoreRequest], config: GRPOConfig) -> list[list[float]]:
        url = f"{str(config.teacher_base_url).rstrip('/')}/completions"
        key = os.environ.get(API_KEY_VARIABLE)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        limit = asyncio.Semaphore(CONCURRENT)
        decode = TokenCheck(self.engine, str(config.teacher_model), url)
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as client:

            async def one(request: ScoreRequest) -> list[float]:
                body = {"model": config.teacher_model, "prompt": request.token_ids, "max_tokens": 0,
                        "prompt_logprobs": 0, "temperature": request.temperature,
                        "prompt_logprobs_start": request.start}  # fmt: skip
                async with limit:
                    try:
                        response = await client.post(url, json=body)
                    except httpx.HTTPError as exc:
                        raise EngineNotReadyError(f"the teacher's server at {url} did not answer: {exc}") from exc
                if response.status_code != 200:
                    raise decode.refused(response)
                return decode.logprobs(request, response.json())

            return list(await asyncio.gather(*(one(r) for r in requests)))


class TokenCheck:
    """Reads another server's prompt logprobs, and checks that its tokenizer is the student's: each scored token's
    ``decoded_token`` must be what the student's tokenizer decodes that id to."""

    def __init__(self, engine: Engine, teacher: str, url: str) -> None:
        self.tokenizer, self.student, self.teacher, self.url = engine.tokenizer, engine.base_model, teacher, url
        self._decoded: dict[int, str] = {}

    def logprobs(self, request: ScoreRequest, body: dict[str, Any]) -> list[float]:
        """The logprob of each of ``request.token_ids[request.start:]`` from the response ``body``."""
        try:
            entries = body["choices"][0]["prompt_logprobs"][request.start :]
        except (KeyError, IndexError, TypeError):
            raise ConfigError(
                f"the teacher's server at {self.url} answered without prompt_logprobs: it must score token ids "
                "(langgraph-art serve, or vLLM)"
            ) from None
        wanted = request.token_ids[request.start :]
        if len(entries) != len(wanted):
            raise ConfigError(f"the teacher's server at {self.url} scored {len(entries)} tokens of {len(wanted)}")
        out = []
        for token, entry in zip(wanted, entries, strict=True):
            scored = (entry or {}).get(str(token))
            if not isinstance(scored, dict) or not isinstance(scored.get("logprob"), (int, float)):
                raise ConfigError(f"the teacher's server at {self.url} did not score token {token}: {entry!r:.200}")
            decoded = scored.get("decoded_token")
            if not self._agrees(token, decoded):
                raise ConfigError(
                    f"the teacher {self.teacher!r} at {self.url} decodes token {token} as {decoded!r}, the student's "
                    f"tokenizer ({self.student!r}) as {self._decode(token)!r}: a teacher must share the student's "
                    "tokenizer (a model of the same family: SmolLM2-1.7B for SmolLM2-135M, Qwen2.5-7B for 0.5B)"
                )
            out.append(float(scored["logprob"]))
        return out

    def refused(self, response: httpx.Response) -> LangGraphArtError:
        """The error for a request the teacher's server refused: a token id outside its vocabulary means another
        tokenizer (ConfigError naming both), an unknown model or any other refusal says what the server said."""
        text = response.text[:500]
        if response.status_code == 400 and "vocabulary" in text:
            return ConfigError(
                f"the teacher {self.teacher!r} at {self.url} does not know the student's token ids ({text}): a "
                f"teacher must share the student's tokenizer ({self.student!r})"
            )
        return ConfigError(
            f"the teacher's server at {self.url} refused to score for teacher_model={self.teacher!r} "
            f"(HTTP {response.status_code}): {text}"
        )

    def _agrees(self, token: int, decoded: object) -> bool:
        """Whether the server decodes ``token`` as the student's tokenizer does, up to surrounding spaces (vLLM
        decodes in context, so a SentencePiece word's leading space may come back) and bytes of a character cut in
        two (no text to compare); True when it sent no decoded text."""
        if not isinstance(decoded, str):
            return True
        ours = self._decode(token)
        return "\ufffd" in decoded or "\ufffd" in ours or decoded.strip() == ours.strip()

    def _decode(self, token: int) -> str:
        if token not in self._decoded:
            self._decoded[token] = self.tokenizer.decode([token])
        return self._decoded[token]
