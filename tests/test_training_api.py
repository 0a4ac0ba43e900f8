"""The service's training API refuses bad input with a 4xx naming the field: traversal, unknown config keys, malformed
examples, too many live trainers, adapters from outside the allowed folders; and a bounded schemathesis run over
``/openapi.json`` finds no 5xx."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from langgraph_art.backends.service import build_service
from langgraph_art.serve.embedded import EmbeddedServer
from langgraph_art.train.trainer import GRPOTrainer

pytestmark = [pytest.mark.integration]
HELLO = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]}]


class QuickTrainer(GRPOTrainer):
    """The real trainer, with warm-ups capped at 2 steps (a fuzzer may ask for 100,000)."""

    def sft(self, examples: Any, *, steps: int, **kwargs: Any) -> list[float]:
        return super().sft(examples, steps=min(steps, 2), **kwargs)


@pytest.fixture(scope="module")
def api(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Any]]:
    home = tmp_path_factory.mktemp("service") / "home"
    home.mkdir()
    service = build_service(str(tiny_path), home=home, served_name="tiny", max_trainers=2, trainer_factory=QuickTrainer)
    with EmbeddedServer(app=service.app) as server:
        yield server.base_url, home, service.policies


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    return response.json()["error"]


def test_traversal_in_project_or_policy_is_refused_and_writes_nothing(api: tuple[str, Path, Any]) -> None:
    url, home, _ = api
    before = sorted(p.name for p in home.parent.iterdir())
    inside = sorted(home.rglob("*"))  # what the module's other tests wrote (the workers run them in any order)
    body = {"project": "../../../../elsewhere", "examples": HELLO, "steps": 1}
    response = httpx.post(f"{url}/train/p1/warmup", json=body, timeout=60)
    assert response.status_code == 400 and error_of(response)["param"] == "project"
    assert "letters, digits" in error_of(response)["message"]
    for policy in ("a@1", ".hidden", "..", "x%2F..%2F..%2Fy"):
        response = httpx.post(f"{url}/train/{policy}/warmup", json={**body, "project": "ok"}, timeout=60)
        assert response.status_code in (400, 404), (policy, response.text)
    response = httpx.get(f"{url}/train/p1", params={"project": "../x"}, timeout=30)
    assert error_of(response)["param"] == "project"
    assert sorted(p.name for p in home.parent.iterdir()) == before
    assert sorted(home.rglob("*")) == inside  # nothing was created inside either


def test_bad_config_and_examples_are_400s_naming_the_field(api: tuple[str, Path, Any]) -> None:
    url, _, _ = api
    step = {"project": "p", "groups": [], "config": {"learning_rat": 1e-3}}
    error = error_of(httpx.post(f"{url}/train/p1/step", json=step, timeout=60))
    assert error["param"] == "config.learning_rat"
    error = error_of(httpx.post(f"{url}/train/p1/step", json={**step, "config": {"learning_rate": 5}}, timeout=60))
    assert error["param"] == "config" and "learning_rate=5" in error["message"]
    warm = {"project": "p", "examples": [{}], "steps": 1}
    assert error_of(httpx.post(f"{url}/train/p1/warmup", json=warm, timeout=60))["param"] == "examples[0].messages"
    no_assistant = {**warm, "examples": [{"messages": [{"role": "user", "content": "hi"}]}]}
    error = error_of(httpx.post(f"{url}/train/p1/warmup", json=no_assistant, timeout=60))
    assert error["param"] == "examples" and "assistant" in error["message"]
    too_many = {**warm, "examples": HELLO, "steps": 10**9}
    assert error_of(httpx.post(f"{url}/train/p1/warmup", json=too_many, timeout=60))["param"] == "steps"


def test_live_trainers_stay_bounded_under_a_loop_of_new_policy_names(api: tuple[str, Path, Any]) -> None:
    url, home, trainers = api
    for i in range(5):
        body = {"project": f"proj{i % 2}", "examples": HELLO, "steps": 1}
        response = httpx.post(f"{url}/train/policy-{i}/warmup", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert len(trainers) <= 2
    # the dropped trainers' work is on disk: the first policy resumes from its checkpoint
    assert (home / "proj0" / "checkpoints" / "policy-0" / "step-000000").is_dir()
    body = {"project": "proj0", "examples": HELLO, "steps": 1}
    assert httpx.post(f"{url}/train/policy-0/warmup", json=body, timeout=120).json()["step"] == 0
    # the same policy name in two projects: two trainers, two checkpoint folders
    assert (home / "proj1" / "checkpoints" / "policy-1").is_dir() and not (
        home / "proj0" / "checkpoints" / "policy-1"
    ).exists()


def test_a_full_house_of_busy_trainers_answers_429(tiny_path: Path, tmp_path: Path) -> None:
    release, started = threading.Event(), threading.Event()

    class Slow:
        step_count = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def sft(self, examples: Any, **kwargs: Any) -> list[float]:
            started.set()
            release.wait(30)
            return [1.0]

        def save_checkpoint(self) -> Path:
            return tmp_path

        def close(self) -> None:
            pass  # holds nothing

    service = build_service(str(tiny_path), home=tmp_path, served_name="tiny", max_trainers=1, trainer_factory=Slow)
    server = EmbeddedServer(app=service.app)
    server.engine.load_adapter = _noop  # type: ignore[method-assign]
    with server:
        body = {"project": "p", "examples": HELLO, "steps": 1}
        first = threading.Thread(target=lambda: httpx.post(f"{server.base_url}/train/a/warmup", json=body, timeout=60))
        first.start()
        assert started.wait(30)
        response = httpx.post(f"{server.base_url}/train/b/warmup", json=body, timeout=60)
        release.set()
        first.join(60)
    assert response.status_code == 429 and response.headers["retry-after"]
    assert "--max-trainers" in response.json()["error"]["message"]


async def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def test_adapters_load_only_from_allowed_folders(api: tuple[str, Path, Any], tool_adapter: Path) -> None:
    url, home, _ = api
    response = httpx.post(f"{url}/adapters", json={"name": "x@1", "path": str(tool_adapter)}, timeout=60)
    error = error_of(response)
    assert error["param"] == "path" and "--adapter-root" in error["message"]
    import shutil

    inside = home / "adapters" / "weather"
    shutil.copytree(tool_adapter, inside)
    response = httpx.post(f"{url}/adapters", json={"name": "x@1", "path": str(inside)}, timeout=60)
    assert response.status_code == 200, response.text
    response = httpx.post(f"{url}/adapters", json={"name": "x@3", "path": f"{home}/a\x00b"}, timeout=60)
    assert error_of(response)["param"] == "path"  # found by the fuzz test below: it was a 500
    escaping = f"{home}/adapters/../../{tool_adapter.parent.name}"
    assert (
        error_of(httpx.post(f"{url}/adapters", json={"name": "x@2", "path": escaping}, timeout=60))["param"] == "path"
    )


@pytest.mark.slow
def test_fuzzing_the_openapi_schema_finds_no_5xx(api: tuple[str, Path, Any]) -> None:
    """Bounded: 50 generated requests per operation (Hypothesis's default is 100), on loopback, against the real
    engine and trainer."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import given

    url, _, _ = api
    schema = schemathesis.openapi.from_url(f"{url.removesuffix('/v1')}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10

    for operation in operations:

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            response = case.call(timeout=120)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} {case.body!r:.300} -> {response.text[:300]}")

        call()
    assert failures == []


def test_a_changed_config_reaches_the_live_trainer_through_the_service(api: tuple[str, Path, Any]) -> None:
    url, _, policies = api
    for lr in (1e-3, 2e-4):
        config = {"learning_rate": lr, "per_device_train_batch_size": 2}
        body = {"project": "cfg", "examples": HELLO, "steps": 1, "config": config}
        assert httpx.post(f"{url}/train/tuned/warmup", json=body, timeout=120).status_code == 200
        with policies.lease("cfg", "tuned") as trainer:
            assert trainer.config.learning_rate == lr and trainer.config.per_device_train_batch_size == 2
    body = {"project": "cfg", "examples": HELLO, "steps": 1, "config": {"lora_r": 4}}
    error = error_of(httpx.post(f"{url}/train/tuned/warmup", json=body, timeout=120))
    assert error["param"] == "config" and "lora_r" in error["message"]
