"""Langfuse export and import through the real SDK stack, against a local receiver that decodes what arrives."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from langfuse_receiver import PUBLIC_KEY, SECRET_KEY, LangfuseReceiver
from langgraph_art_langfuse import LangfuseExporter, LangfuseScoreReward, trace_id
from langgraph_art_langfuse.traces import observation_id
from typer.testing import CliRunner

import langgraph_art as art
from langgraph_art.cli import app
from langgraph_art.errors import ConfigError, RewardError
from langgraph_art.rewards.decorators import Score
from langgraph_art.testing import WEATHER_PROMPTS, one_agent_graph, tool_loop_graph
from langgraph_art.train.advantages import group_advantages
from langgraph_art.types import NodeSpan, ToolCallRecord, Turn

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver():
    with LangfuseReceiver() as running:
        yield running


@art.reward
def answered(state) -> dict:
    text = state["messages"][-1].content or ""
    used_tool = any(getattr(m, "type", "") == "tool" for m in state["messages"])
    return {"tool": float(used_tool), "sunny": float("sunny" in text.lower())}


@art.reward(node="agent")
def short_turns(span) -> float:
    return 1.0 / (1 + len(span.turns))


class Explainer:
    """A reward source that explains itself, like a judge."""

    name, weight, node = "critic", 0.5, None

    async def ascore_group(self, group: art.TrajectoryGroup) -> dict[str, Score]:
        return {t.id: Score(i / 4, {}, explanation=f"run {i} was fine") for i, t in enumerate(group.completed())}


@pytest.fixture
def groups(server, tmp_path: Path) -> tuple[art.TrajectoryStore, list[art.TrajectoryGroup]]:
    """Two scored groups of real tool-agent runs, stored like the trainer stores them."""
    llm = art.ChatART(base_url=server.base_url, model="weather@1", temperature=1.0, max_tokens=48, max_retries=0)
    store = art.TrajectoryStore(tmp_path / "store.sqlite")
    scenarios = [{"id": f"s{i}", "input": {"messages": [("user", p)]}} for i, p in enumerate(WEATHER_PROMPTS[:2])]
    found = art.gather_groups(
        tool_loop_graph(llm),
        scenarios,
        3,
        recorders=[llm.recorder],
        store=store,
        progress=False,
        metadata={"policy_step": 1, "training_run": "run-1"},
    )
    art.score_groups(found, [answered, short_turns, Explainer()])
    advantages = group_advantages(found).by_trajectory
    for group in found:
        for t in group.trajectories:
            if t.id in advantages:
                t.metadata["advantage"] = advantages[t.id]
        store.add_group(group)
    return store, found


def exporter_for(
    receiver: LangfuseReceiver, store: art.TrajectoryStore, timeout: float = 3, **kwargs: Any
) -> LangfuseExporter:
    return LangfuseExporter(
        store, public_key=PUBLIC_KEY, secret_key=SECRET_KEY, base_url=receiver.base_url, timeout=timeout, **kwargs
    )


def meta(span: dict[str, Any], key: str) -> Any:
    raw = span["attributes"].get(f"langfuse.observation.metadata.{key}")
    return None if raw is None else json.loads(raw)


def test_each_trajectory_is_a_trace_with_node_generation_and_tool_spans(receiver, groups) -> None:
    store, found = groups
    report = exporter_for(receiver, store).export()
    runs = [t for g in found for t in g.trajectories]
    assert report.ok and report.traces == len(runs) == 6, report
    traces = receiver.traces()
    assert set(traces) == {trace_id(t.id) for t in runs}
    for t in runs:
        spans = traces[trace_id(t.id)]
        by_id = {s["span_id"]: s for s in spans}
        assert all(s["scope"] == "langfuse-sdk" for s in spans)
        assert all(s["scope_attributes"]["public_key"] == PUBLIC_KEY for s in spans)
        (root,) = [s for s in spans if s["parent_id"] is None]
        attrs = root["attributes"]
        assert attrs["langfuse.trace.name"] == t.name and attrs["session.id"] == "run-1"
        assert {"step:1", f"group:{t.group_id}", f"scenario:{t.scenario_id}"} <= set(attrs["langfuse.trace.tags"])
        assert json.loads(attrs["langfuse.observation.input"]) == json.loads(json.dumps(t.input, default=str))
        assert meta(root, "trajectory_id") == t.id
        assert root["start"] == int(t.start_time * 1e9) and root["end"] == int(t.end_time * 1e9)
        # one span per node invocation, under the root, with the node's times
        nodes = [s for s in spans if s["attributes"]["langfuse.observation.type"] == "span" and s is not root]
        assert [n["name"] for n in nodes] == [s.name for s in t.spans]
        for node, span in zip(nodes, t.spans, strict=True):
            assert node["parent_id"] == root["span_id"] and node["span_id"] == observation_id(t.id, f"span:{span.id}")
            assert node["start"] == int(span.start_time * 1e9) and node["end"] == int(span.end_time * 1e9)
            assert meta(node, "langgraph_step") == span.step
        # one generation per LLM turn, under its node
        generations = [s for s in spans if s["attributes"]["langfuse.observation.type"] == "generation"]
        turns = [(span, turn) for span in t.spans for turn in span.turns]
        assert len(generations) == len(turns) == len(t.turns()) >= 1
        for gen, (span, turn) in zip(sorted(generations, key=lambda s: s["start"]), turns, strict=True):
            a = gen["attributes"]
            assert by_id[gen["parent_id"]]["name"] == span.name == "agent"
            assert a["langfuse.observation.model.name"] == "weather@1" and gen["name"] == "ChatART weather@1"
            usage = json.loads(a["langfuse.observation.usage_details"])
            assert usage == {
                "output": len(turn.token_ids),
                "input": len(turn.prompt_token_ids),
                "total": len(turn.token_ids) + len(turn.prompt_token_ids),
            }
            assert meta(gen, "sampled_tokens") == len(turn.token_ids) > 0
            assert math.isclose(meta(gen, "logprob_sum"), sum(turn.logprobs), rel_tol=1e-9)
            assert meta(gen, "policy_step") == 1 and meta(gen, "node") == "agent"
            assert meta(gen, "constrained") is False and meta(gen, "closing_tokens") == 0
            assert meta(gen, "unparsed_tool_calls") == turn.unparsed_tool_calls  # a broken block, now and then
            prompt = json.loads(a["langfuse.observation.input"])
            assert prompt["messages"] == turn.messages and prompt["tools"] == turn.tools
            assert json.loads(a["langfuse.observation.output"]) == turn.output
            assert gen["end"] - gen["start"] == pytest.approx(turn.latency_s * 1e9, abs=1e3)
        # one tool span per tool call, under the tools node
        tools = [s for s in spans if s["attributes"]["langfuse.observation.type"] == "tool"]
        assert len(tools) == len(t.tool_calls())
        for call in t.tool_calls():
            tool = by_id[observation_id(t.id, f"tool:{call.run_id or call.id or call.name}:{call.start_time}")]
            assert tool["name"] == call.name == "get_weather" and by_id[tool["parent_id"]]["name"] == "tools"
            assert json.loads(tool["attributes"]["langfuse.observation.input"]) == call.arguments
            assert tool["attributes"]["langfuse.observation.output"] == call.result
        assert len(spans) == 1 + len(t.spans) + len(generations) + len(tools)
    assert any(t.tool_calls() for t in runs), "the adapter's runs call the tool"


def test_rewards_become_scores_with_explanations_and_advantages(receiver, groups) -> None:
    store, found = groups
    exporter_for(receiver, store).export()
    scores = receiver.scores()
    assert len(scores) == len(receiver.score_posts), "every score id is unique"
    for t in (t for g in found for t in g.completed()):
        mine = [s for s in scores.values() if s["traceId"] == trace_id(t.id)]
        on_trace = {s["name"]: s for s in mine if "observationId" not in s}
        assert on_trace["reward"]["value"] == pytest.approx(t.reward)
        assert on_trace["reward"]["metadata"]["advantage"] == pytest.approx(t.metadata["advantage"])
        assert "critic: run" in on_trace["reward"]["comment"]
        assert on_trace["reward/critic"]["comment"].startswith("run ")
        for key in ("answered", "answered/tool", "answered/sunny", "critic"):
            assert on_trace[f"reward/{key}"]["value"] == pytest.approx(t.rewards[key])
        on_nodes = [s for s in mine if s.get("observationId")]
        agent_spans = [s for s in t.spans if s.name == "agent"]
        assert {s["observationId"] for s in on_nodes} == {observation_id(t.id, f"span:{s.id}") for s in agent_spans}
        assert all(s["metadata"]["node"] == "agent" for s in on_nodes)


def test_exports_send_each_thing_once_and_only_changes_again(receiver, groups) -> None:
    store, found = groups
    exporter = exporter_for(receiver, store)
    first = exporter.export()
    spans, posts = len(receiver.spans), len(receiver.score_posts)
    again = exporter_for(receiver, store).export()  # a new exporter (another process) reads the same store
    assert again.traces == again.scores == 0 and again.unchanged == first.traces + first.scores
    assert (len(receiver.spans), len(receiver.score_posts)) == (spans, posts)
    changed = found[0].completed()[0]
    changed.reward = 0.123
    store.add_trajectory(changed)
    third = exporter.export()
    assert third.traces == 0 and third.scores == 1
    (resent,) = receiver.score_posts[posts:]
    assert resent["name"] == "reward" and resent["value"] == 0.123 and resent["traceId"] == trace_id(changed.id)
    assert len(receiver.scores()) == len(receiver.score_posts) - 1  # same id: Langfuse updates the score


def test_a_503_is_retried(receiver, groups) -> None:
    store, found = groups
    receiver.fail_next(1, 503)  # the first trace request
    report = exporter_for(receiver, store).export()
    assert report.ok and report.traces == 6
    assert receiver.requests[0] == ("POST", "/api/public/otel/v1/traces", 503)
    assert receiver.requests[1] == ("POST", "/api/public/otel/v1/traces", 200)
    assert len({s["span_id"] for s in receiver.spans}) == len(receiver.spans)
    changed = found[0].completed()[0]
    changed.reward = -1.0
    store.add_trajectory(changed)
    receiver.fail_next(1, 503)  # the score upload
    report = exporter_for(receiver, store).export()
    assert report.ok and report.scores == 1 and receiver.score_posts[-1]["value"] == -1.0
    assert receiver.requests[-2:] == [("POST", "/api/public/scores", 503), ("POST", "/api/public/scores", 202)]


def test_langfuse_down_raises_nothing_and_a_later_export_delivers_everything_once(receiver, groups) -> None:
    store, _ = groups
    receiver.stop()
    down = exporter_for(receiver, store, max_batch_spans=20)
    report = down.export()
    assert not report.ok and report.traces == 0 and report.failed > 0 and report.errors
    assert store.delivered("langfuse") == {}
    receiver.start()
    later = exporter_for(receiver, store).export()
    assert later.ok and later.traces == 6 and later.unchanged == 0
    ids = [s["span_id"] for s in receiver.spans]
    assert len(ids) == len(set(ids)) == later.spans
    assert len(receiver.score_posts) == len(receiver.scores()) == later.scores


def test_background_exports_never_block_training_and_flush_per_step(receiver, groups) -> None:
    store, _ = groups
    receiver.fail_next(10_000, 503)  # Langfuse answering 5xx for as long as it takes
    exporter = exporter_for(receiver, store, timeout=1)
    receiver.hold()  # and as slow as it gets: nothing is answered until release()
    exporter.submit(step=1, record={"run": "r", "step": 2, "model": "m", "reward/mean": 0.25})
    # submit returned with its export still under way (flush(timeout=0): done yet?); an export done inside submit
    # would be over by now, delivered or given up
    assert not exporter.flush(timeout=0)
    receiver.release()
    assert exporter.flush(timeout=30)
    assert not exporter.total.ok and receiver.spans == []
    receiver._fail.clear()
    exporter.submit(step=2, record={"run": "r", "step": 3, "model": "m", "reward/mean": 0.5})  # retries step 1
    assert exporter.close(timeout=30)
    assert len(receiver.traces()) == 6 + 2  # six runs and two training steps
    step_traces = [s for s in receiver.spans if s["name"].startswith("train step")]
    assert sorted(s["name"] for s in step_traces) == ["train step 2", "train step 3"]
    assert {s["attributes"]["session.id"] for s in step_traces} == {"r"}
    with pytest.raises(RuntimeError, match="closed"):
        exporter.submit(step=3)


def test_wrong_keys_and_rejected_scores_are_reported(receiver, groups) -> None:
    store, _ = groups
    wrong = LangfuseExporter(store, public_key="pk", secret_key="nope", base_url=receiver.base_url, timeout=3)
    report = wrong.export()
    assert not report.ok and "401" in " ".join(report.errors)
    receiver.reject_scores = True
    report = exporter_for(receiver, store).export()
    assert report.traces == 6 and report.scores == 0 and report.rejected > 0 and report.ok
    assert "rejected" in str(report)


def test_configuration_errors_say_what_to_set(monkeypatch, tmp_path: Path) -> None:
    for name in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL", "LANGFUSE_HOST"):
        monkeypatch.delenv(name, raising=False)
    store = art.TrajectoryStore(tmp_path / "s.sqlite")
    with pytest.raises(ConfigError, match="LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY"):
        LangfuseExporter(store)
    with pytest.raises(ConfigError, match="http"):
        LangfuseExporter(store, public_key="a", secret_key="b", base_url="localhost:3000")
    assert LangfuseExporter.from_env(store) is None
    with pytest.raises(ConfigError, match="the name of the Langfuse score"):
        LangfuseScoreReward("", public_key="a", secret_key="b")


def test_scores_given_in_langfuse_become_rewards(receiver, groups) -> None:
    store, found = groups
    exporter_for(receiver, store).export()  # our own "reward" scores are there too: never read back as feedback
    runs = found[0].completed()
    receiver.annotate(trace_id(runs[0].id), "user-feedback", 1.0, comment="great")
    receiver.annotate(trace_id(runs[0].id), "user-feedback", 0.0, comment="meh")
    receiver.annotate(trace_id(runs[1].id), "user-feedback", True)
    receiver.annotate(trace_id(runs[1].id), "reward", 0.9)
    for _ in range(120):  # more than one page
        receiver.annotate(trace_id(runs[2].id), "user-feedback", 0.25)
    receiver.annotate(trace_id(runs[2].id), "other", 5.0)
    feedback = LangfuseScoreReward(
        "user-feedback", public_key=PUBLIC_KEY, secret_key=SECRET_KEY, base_url=receiver.base_url
    )
    report = art.score_groups([found[0]], [feedback])
    assert [t.reward for t in runs] == [0.5, 1.0, 0.25]
    assert runs[0].explanations["langfuse/user-feedback"] == "great\nmeh"
    assert report.metrics["reward/langfuse/user-feedback"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    own = LangfuseScoreReward("reward", public_key=PUBLIC_KEY, secret_key=SECRET_KEY, base_url=receiver.base_url)
    art.score_groups([found[0]], [own])
    assert [t.reward for t in runs] == [None, 0.9, None]  # our exported rewards are skipped, the person's is read


def test_scores_on_traces_the_user_points_at(receiver, groups) -> None:
    _, found = groups
    runs = found[1].completed()
    for i, t in enumerate(runs):
        t.metadata["langfuse_trace_id"] = f"{i:032x}"
    receiver.annotate(f"{0:032x}", "thumbs", "up", dataType="CATEGORICAL")
    receiver.annotate(f"{1:032x}", "thumbs", "down", dataType="CATEGORICAL")
    receiver.annotate(f"{2:032x}", "thumbs", "meh", dataType="CATEGORICAL")
    keys = {"public_key": PUBLIC_KEY, "secret_key": SECRET_KEY, "base_url": receiver.base_url}
    thumbs = LangfuseScoreReward(
        "thumbs", trace_id="langfuse_trace_id", categories={"up": 1.0, "down": 0.0}, **keys, name="thumbs"
    )
    with pytest.raises(RewardError, match="categories="):
        art.score_groups([found[1]], [thumbs])
    thumbs.categories["meh"] = 0.5
    art.score_groups([found[1]], [thumbs])
    assert [t.reward for t in runs] == [1.0, 0.0, 0.5]
    by_function = LangfuseScoreReward("thumbs", trace_id=lambda t: None, categories=thumbs.categories, **keys)
    art.score_groups([found[1]], [by_function])
    assert [t.reward for t in runs] == [None, None, None]


def test_cli_export_sends_what_is_missing(receiver, groups, monkeypatch, tmp_path: Path) -> None:
    store, _ = groups
    project = tmp_path / "home" / "proj"
    project.mkdir(parents=True)
    target = art.TrajectoryStore.for_project("proj", tmp_path / "home")
    target.add_trajectories(store.trajectories())
    runs_dir = project / "runs" / "agent"
    runs_dir.mkdir(parents=True)
    lines = [{"run": "abc", "model": "agent", "step": s, "policy_step": s - 1, "reward/mean": s / 10} for s in (1, 2)]
    (runs_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    for key, value in receiver.env().items():
        monkeypatch.setenv(key, value)
    args = ["export", "langfuse", "--project", "proj", "--home", str(tmp_path / "home")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "6 traces" in result.output and "2 training steps" in result.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "0 traces" in again.output and "0 scores" in again.output
    missing = CliRunner().invoke(app, ["export", "langfuse", "--project", "nope", "--home", str(tmp_path)])
    assert missing.exit_code == 2 and "No store" in missing.output


@art.reward
def variety(state) -> float:
    text = state["messages"][-1].content
    return len(set(text)) / (1 + len(text))


@pytest.mark.slow
def test_trainer_exports_by_configuration_alone_and_survives_an_outage(
    receiver, monkeypatch, tmp_path: Path, caplog
) -> None:
    for key, value in receiver.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LANGFUSE_TIMEOUT", "1")
    receiver.stop()  # Langfuse is down when training starts
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="digits", project="lf").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=12)
        config = art.GRPOConfig(learning_rate=1e-2, seed=0)
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[variety], num_generations=4, config=config)
        assert [s.name for s in trainer.sinks] == ["Langfuse"]  # on by LANGFUSE_* alone, through its entry point
        assert isinstance(trainer.sinks[0].sink.exporter, LangfuseExporter)
        scenarios = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]
        with caplog.at_level("WARNING"):
            history = trainer.train(scenarios, steps=2, progress=False)
        assert len(history) == 2 and receiver.spans == []
        assert "langgraph-art export langfuse --project lf" in caplog.text
        receiver.start()  # back up: the next step's export also sends what the outage held back
        history = trainer.train(scenarios, steps=1, progress=False)
        store = backend.store(model)
        runs = store.trajectories()
        assert len(runs) == 12
        traces = receiver.traces()
        assert {trace_id(t.id) for t in runs} <= set(traces)
        assert len(traces) == 12 + 3  # twelve rollouts and three training steps
        assert len({s["span_id"] for s in receiver.spans}) == len(receiver.spans)
        for t in runs:
            (root,) = [s for s in traces[trace_id(t.id)] if s["parent_id"] is None]
            assert root["attributes"]["session.id"] == trainer.run_id
        scores = receiver.scores()
        rewards = [s for s in scores.values() if s["name"] == "reward"]
        assert len(rewards) == 12 and len(receiver.score_posts) == len(scores)
        trained = [s for s in rewards if "advantage" in s["metadata"]]
        assert len(trained) == 4 * sum(int(m["train/updated"]) for m in trainer.history)
        step_means = sorted((s["metadata"]["step"], s["value"]) for s in scores.values() if s["name"] == "reward/mean")
        assert [v for _, v in step_means] == pytest.approx([m["reward/mean"] for m in trainer.history])
        before = len(receiver.spans), len(receiver.score_posts)
        result = CliRunner().invoke(app, ["export", "langfuse", "--project", "lf", "--home", str(tmp_path)])
        assert result.exit_code == 0 and "0 traces" in result.output, result.output
        assert (len(receiver.spans), len(receiver.score_posts)) == before


def test_trainer_langfuse_true_needs_keys(monkeypatch, tmp_path: Path) -> None:
    for name in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    model = art.TrainableModel(name="m", project="p").register(art.LocalBackend(home=tmp_path))
    with pytest.raises(ConfigError, match="LANGFUSE_PUBLIC_KEY"):
        art.Trainer(object(), model, rewards=[variety], langfuse=True)  # type: ignore[arg-type]
    assert art.Trainer(object(), model, rewards=[variety]).sinks == []  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="LangfuseExporter"):
        art.Trainer(object(), model, rewards=[variety], langfuse="yes")  # type: ignore[arg-type]


def test_a_step_bigger_than_the_default_otel_queue_loses_no_span(receiver, tmp_path: Path) -> None:
    """OpenTelemetry's default batch queue holds 2048 spans and drops the rest; our exporter has no such queue."""
    store = art.TrajectoryStore(tmp_path / "big.sqlite")
    now = time.time()
    runs = []
    for i in range(300):
        turns = [
            Turn(id=f"{i}-{k}", token_ids=[1, 2], logprobs=[-0.5, -0.5], model="m@0", start_time=now + k)
            for k in range(3)
        ]
        calls = [ToolCallRecord(name="tool", run_id=f"{i}-{k}", start_time=now + k) for k in range(4)]
        spans = [NodeSpan(id=f"{i}-a", name="agent", start_time=now, turns=turns)]
        spans.append(NodeSpan(id=f"{i}-t", name="tools", start_time=now + 1, tool_calls=calls))
        runs.append(art.Trajectory(id=f"run-{i}", spans=spans, status="ok", start_time=now, end_time=now + 5))
    store.add_trajectories(runs)
    report = exporter_for(receiver, store).export()
    assert report.ok and report.traces == 300 and report.spans == 300 * 10 > 2048
    assert len(receiver.spans) == len({s["span_id"] for s in receiver.spans}) == 3000
    span_posts = [r for r in receiver.requests if r[1].endswith("/traces")]
    assert len(span_posts) == 6  # at most 512 spans per request, whole trajectories per request


def test_evaluations_are_traces_tagged_split_eval_and_their_metrics_scores(receiver, monkeypatch, tmp_path) -> None:
    from langgraph_art.testing import FakeBackend, echo_graph

    for key, value in receiver.env().items():
        monkeypatch.setenv(key, value)
    model = art.TrainableModel(name="fake", project="lf-eval").register(FakeBackend(tmp_path))
    held_out = [{"id": "h1", "input": {"messages": [("user", "held out")]}}]
    trainer = art.Trainer(
        echo_graph(), model, rewards=[variety], num_generations=2, eval_scenarios=held_out, eval_generations=2
    )
    trainer.train([{"id": "t1", "input": {"messages": [("user", "train")]}}], steps=2, progress=False)
    traces = receiver.traces()
    store = trainer.store
    tags = {}
    for t in store.trajectories():
        (root,) = [s for s in traces[trace_id(t.id)] if s["parent_id"] is None]
        tags[t.id] = set(root["attributes"]["langfuse.trace.tags"])
    assert {t.id for t in store.trajectories(split="eval")} == {i for i, tag in tags.items() if "split:eval" in tag}
    assert {t.id for t in store.trajectories(split="train")} == {i for i, tag in tags.items() if "split:train" in tag}
    assert len(store.trajectories(split="eval")) == 4  # before the first step and after the last, 2 runs each
    names = sorted(spans[0]["name"] for spans in traces.values() if spans[0]["parent_id"] is None)
    assert names.count("eval after step 0") == 1 and names.count("eval after step 2") == 1
    assert names.count("train step 1") == 1 and names.count("train step 2") == 1
    evals = sorted(s["value"] for s in receiver.scores().values() if s["name"] == "eval/reward/mean")
    assert evals == pytest.approx(sorted(e["eval/reward/mean"] for e in trainer.evals))


def test_a_continuation_is_a_trace_linked_to_the_run_it_forked_from(receiver, server, tmp_path: Path) -> None:
    import asyncio
    import random

    from langgraph_art.capture.branching import Branching, abranch_groups, afork_points, with_checkpointer

    llm = art.ChatART(base_url=server.base_url, model="weather@1", temperature=0, max_tokens=48, max_retries=0)
    graph, _ = with_checkpointer(tool_loop_graph(llm))
    store = art.TrajectoryStore(tmp_path / "store.sqlite")
    scenario = {"id": "s0", "input": {"messages": [("user", WEATHER_PROMPTS[0])]}}
    metadata = {"policy_step": 1, "training_run": "run-1"}

    async def branch() -> tuple[art.TrajectoryGroup, art.TrajectoryGroup]:
        (whole,) = await art.agather_groups(graph, [scenario], 1, store=store, progress=False, metadata=metadata)
        points = await afork_points(graph, whole.trajectories, Branching(groups_per_step=1), random.Random(0))
        (forked,) = await abranch_groups(graph, points, {"s0": scenario}, 2, store=store, metadata=metadata)
        return whole, forked

    whole, forked = asyncio.run(branch())
    assert exporter_for(receiver, store).export().ok
    traces = receiver.traces()
    (parent,) = whole.trajectories
    for run in forked.trajectories:
        (root,) = [s for s in traces[trace_id(run.id)] if s["parent_id"] is None]
        assert {"branch", "fork:agent@1", "scenario:s0"} <= set(root["attributes"]["langfuse.trace.tags"])
        assert meta(root, "branch_parent_trace_id") == trace_id(parent.id) and trace_id(parent.id) in traces
        assert meta(root, "branch_parent_run") == parent.id and meta(root, "branch_depth") == 1
        assert meta(root, "branch_checkpoint_id") == run.metadata["branch"]["checkpoint_id"]
    # and the export keeps the fork point with each continuation
    exported = tmp_path / "runs.jsonl"
    store.export_jsonl(exported)
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    forks = [r["metadata"]["branch"] for r in rows if "branch" in r["metadata"]]
    assert len(forks) == 2 and all(f["parent_run"] == parent.id and f["node"] == "agent" for f in forks)
