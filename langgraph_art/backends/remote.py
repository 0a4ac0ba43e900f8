"""``RemoteBackend``: a client of ``langgraph-art serve``. Rollouts (and the store) stay here, so many machines can
roll out against one service; the GRPO steps and checkpoints happen in the service."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from langgraph_art.backends.base import register_policy
from langgraph_art.errors import RETRY_AFTER, ConfigError, LangGraphArtError, error_from_http
from langgraph_art.model import TrainableModel
from langgraph_art.serve.publish import stale_adapters
from langgraph_art.store import TrajectoryStore, default_home
from langgraph_art.types import StepResult, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from langgraph_art.config import GRPOConfig
    from langgraph_art.train.protocol import SFTExample

log = logging.getLogger(__name__)


class RemoteBackend:
    """A client of ``langgraph-art serve`` at ``base_url`` (``http://host:8000/v1``): rollouts run here (many
    machines can point at one service), training steps run in the service. The store and metrics stay local,
    under ``home``. Errors keep their class across the wire (a step aborted in the service raises
    ``TrainingAborted`` here).

    With ``replicas``, after each step every replica loads the new checkpoint before ``train_step`` returns, so the
    next step's rollouts only meet the new policy; ``ChatART(model=...)`` takes the replicas in turn
    (``base_urls``) and skips one that is down. Why in the client rather than a load balancer in front: the
    balancer cannot know when every replica has the new checkpoint; with one in front, pass its URL alone and load
    the checkpoints yourself.

    Args:
        base_url: The training service, ``http://host:8000/v1``.
        api_key: The service's ``--api-key`` (None: a service started without one).
        home: Where the store and the metrics go (None: ``$LANGGRAPH_ART_HOME`` or ``./.art``).
        timeout: Seconds for one request (a training step included).
        max_wait: How long a busy (429) or loading (503) service is waited for, by its ``retry-after``, before the
            error (``ServiceBusyError``) is raised.
        replicas: The ``serve`` processes that answer the rollouts (``base_url`` among them or not), each started
            with ``--adapter-root`` on the training service's ``--home`` (a file system they share, at the same
            path). None: ``base_url`` alone.
        keep_loaded: Checkpoints of a policy each replica keeps loaded (older ones are unloaded, and stay on disk).

    Example:
        ```python
        backend = art.RemoteBackend("http://trainer-host:8000/v1", api_key="...")
        model = art.TrainableModel(name="agent-001", project="support").register(backend)
        ```
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        home: str | Path | None = None,
        timeout: float = 600.0,
        max_wait: float = 60.0,
        replicas: Sequence[str] | None = None,
        keep_loaded: int = 2,
    ) -> None:
        """See the class docstring for the arguments."""
        if replicas is not None and (isinstance(replicas, str) or not replicas):
            raise ConfigError(f"replicas is a list of base URLs (http://host:8000/v1, ...), got {replicas!r}")
        self.base_url = base_url.rstrip("/")
        self.replicas = [url.rstrip("/") for url in replicas] if replicas else [self.base_url]
        self.keep_loaded = keep_loaded
        self.max_wait = max_wait
        self.api_key = api_key
        self.home = Path(home) if home is not None else default_home()
        self.timeout = timeout
        self._config: dict[tuple[str, str], dict[str, Any] | None] = {}  # by (project, name)

    def register(self, model: TrainableModel) -> None:
        if model.chat_template is not None:
            raise ConfigError(
                f"model {model.name!r} sets chat_template, but a remote service renders with its own: start it with "
                "`langgraph-art serve --chat-template FILE|chatml-tools` and drop chat_template from the model"
            )
        for field, flag in (("tool_call_parser", "--tool-call-parser"), ("reasoning_parser", "--reasoning-parser")):
            if getattr(model, field) is not None:
                raise ConfigError(
                    f"model {model.name!r} sets {field}, but a remote service reads replies with its own: start it "
                    f"with `langgraph-art serve {flag} {getattr(model, field)}` and drop {field} from the model"
                )
        register_policy(self.base_url, self.api_key, model.served_name)
        for url in self._other_replicas():
            register_policy(url, self.api_key, model.served_name)
        if self._other_replicas():  # a model trained before: every replica serves where it left off
            body = self._call("get", f"/train/{model.name}", params={"project": model.project})
            if body.get("checkpoint"):
                self._publish(model, int(body["step"]), body["checkpoint"])

    def chat_model_settings(self, model: TrainableModel) -> dict[str, Any]:
        urls = {"base_url": self.replicas[0], **({"base_urls": self.replicas} if len(self.replicas) > 1 else {})}
        return {**urls, "api_key": self.api_key or "unused"}

    def _other_replicas(self) -> list[str]:
        """The replicas that are not the training service (which serves its checkpoints itself)."""
        return [url for url in self.replicas if url != self.base_url]

    def _publish(self, model: TrainableModel, step: int, folder: str) -> None:
        """Every other replica loads checkpoint ``step`` (``folder``, on the shared file system) as
        ``project/name@step`` and unloads the policy's steps beyond ``keep_loaded``; an error names the replica."""
        name = model.served_name
        for url in self._other_replicas():
            replica = RemoteBackend(url, self.api_key, home=self.home, timeout=self.timeout, max_wait=self.max_wait)
            try:
                replica._call("post", "/adapters", json={"name": f"{name}@{step}", "path": folder})
                loaded = [a["name"] for a in replica._call("get", "/adapters")["data"]]
                for stale in stale_adapters(loaded, name, self.keep_loaded):
                    replica._call("delete", f"/adapters/{stale}")
            except LangGraphArtError as exc:
                raise ConfigError(
                    f"replica {url} could not load checkpoint {step} of {name} from {folder}: {exc}. Start every "
                    "replica with --adapter-root on the training service's --home (a file system they share, at "
                    "the same path); until it loads, its rollouts would sample an older policy"
                ) from exc

    def store(self, model: TrainableModel) -> TrajectoryStore:
        return TrajectoryStore.for_project(model.project, self.home)

    def run_dir(self, model: TrainableModel) -> Path:
        return self.home / model.project / "runs" / model.name

    def trainer(self, model: TrainableModel, config: GRPOConfig | None = None) -> None:
        """Remember the config sent with each step (the service creates the trainer on the first one)."""
        self._config[(model.project, model.name)] = config.model_dump() if config is not None else None

    def current_step(self, model: TrainableModel) -> int:
        body = self._call("get", f"/train/{model.name}", params={"project": model.project})
        return int(body["step"])

    def engine_stats(self, model: TrainableModel) -> dict[str, float]:
        """The replicas' engine counters (their ``GET /metrics``), summed; a replica that does not answer is left
        out (logged at INFO: the numbers are a record, never a reason to stop training)."""
        from langgraph_art.serve.app import read_prometheus_text

        total: dict[str, float] = {}
        for url in self.replicas:
            try:
                response = httpx.get(f"{url.removesuffix('/v1')}/metrics", timeout=10)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                log.info("engine counters of %s not read: %s", url, exc)
                continue
            for name, value in read_prometheus_text(response.text).items():
                total[name] = total.get(name, 0) + value
        return total

    def pin_checkpoint(self, model: TrainableModel, step: int) -> None:
        """``model.pin(step)``, in the service (its checkpoints)."""
        self._call("post", f"/train/{model.name}/pin", json={"project": model.project, "step": step})

    def train_step(
        self, model: TrainableModel, groups: Sequence[TrajectoryGroup], config: GRPOConfig | None = None
    ) -> StepResult:
        payload = {
            "project": model.project,
            "config": self._config.get((model.project, model.name)),
            "groups": [g.model_dump(mode="json") for g in groups],
        }
        body = self._call("post", f"/train/{model.name}/step", json=payload)
        folder = body.pop("checkpoint", None)
        result = StepResult(**body)
        if result.updated and folder:  # before the next step's rollouts: every replica serves the new policy
            self._publish(model, result.step, folder)
        return result

    def warmup(
        self,
        model: TrainableModel,
        examples: Sequence[SFTExample],
        *,
        steps: int,
        learning_rate: float | None = None,
        config: GRPOConfig | None = None,
    ) -> list[float]:
        runs = [e.model_dump(mode="json") for e in examples if isinstance(e, Trajectory)]
        conversations = [e for e in examples if not isinstance(e, Trajectory)]
        payload = {
            "project": model.project,
            "examples": conversations,
            "trajectories": runs,
            "steps": steps,
            "learning_rate": learning_rate,
            "config": config.model_dump() if config is not None else None,
        }
        body = self._call("post", f"/train/{model.name}/warmup", json=payload)
        if body.get("checkpoint"):
            self._publish(model, int(body["step"]), body["checkpoint"])
        return list(body["losses"])

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; an error answer raises what ``LocalBackend`` raises for the same failure
        (``errors.error_from_http``): ``TrainingAborted`` (422), ``ServiceBusyError`` (429), ``RequestError`` /
        ``ConfigError`` (400), ``EngineNotReadyError`` (503). A 429 or 503 is retried after the ``retry-after`` the
        service sends, while ``max_wait`` seconds last; then it is raised."""
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.max_wait
        while True:
            try:
                response = httpx.request(
                    method, f"{self.base_url}{path}", headers=headers, timeout=self.timeout, **kwargs
                )
            except httpx.TransportError as exc:
                raise ConfigError(
                    f"cannot reach the langgraph-art service at {self.base_url}: {exc}; check the URL and that "
                    "`langgraph-art serve` runs there"
                ) from exc
            if response.status_code == 200:
                return response.json()
            wait = retry_after(response)
            if wait is None or time.monotonic() + wait > deadline:
                raise self._error(response, path)
            log.info("%s answered %d; retrying in %.1f s", self.base_url, response.status_code, wait)
            time.sleep(wait)  # the wait the service asked for

    def _error(self, response: httpx.Response, path: str) -> Exception:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"message": response.text}
        if response.status_code == 404 and path.startswith("/train") and not error.get("code"):
            return ConfigError(  # the route itself is missing (not a policy or checkpoint it does not know)
                f"the service at {self.base_url} has no training API: start it with "
                "`langgraph-art serve` (training is on by default)"
            )
        if response.status_code == 401:
            return ConfigError(f"the service at {self.base_url} refused the API key: pass api_key= (its --api-key)")
        return error_from_http(response.status_code, error, f"the service at {self.base_url}")


def retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait before asking again: a 429 or 503's ``retry-after`` (seconds; 1 when absent or not a
    number); None for every other answer."""
    if response.status_code not in RETRY_AFTER:
        return None
    try:
        return max(0.0, float(response.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
