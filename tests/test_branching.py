"""Branch groups: continuations resumed from checkpoints inside a step's runs (``capture/branching.py``).

The model is the embedded tiny service with the weather adapter (``weather@1``: it calls ``get_weather``, then
answers from the result: two decisions a run); the backend is the fake one (it records the groups it is given).
The last test trains for real (``LocalBackend``, the tiny model sampling at temperature 1): the branch groups are
counted among the trained sequences and the LoRA moves.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

import langgraph_art as art
from langgraph_art.capture.branching import (
    Branching,
    ForkPoint,
    acandidates,
    afork_points,
    find_pregel,
    with_checkpointer,
)
from langgraph_art.testing import FakeBackend, get_weather
from langgraph_art.train.advantages import Advantages
from langgraph_art.train.tokenize import build_sequences
from langgraph_art.types import Trajectory, Turn

SCENARIO = {"id": "paris", "input": {"messages": [("user", "What is the weather in Paris?")]}}


@art.reward
def answer_length(state: Any) -> float:
    return float(len(str(state["messages"][-1].content)))


@art.reward(node="agent")
def agent_turns(span: Any) -> float:
    return float(len(span.turns))


def weather_graph(llm: art.ChatART, *, checkpointer: Any = None, async_nodes: bool = False) -> Any:
    """agent <-> tools (the tool loop), with sync or async agent nodes, compiled with ``checkpointer``."""
    model = llm.bind_tools([get_weather])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", aagent if async_nodes else agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer).with_config(recursion_limit=8)


@pytest.fixture
def llm(server: Any) -> art.ChatART:
    return art.ChatART(base_url=server.base_url, model="weather@1", temperature=0, max_tokens=48, max_retries=0)  # type: ignore[call-arg]


def trainer_for(graph: Any, tmp_path: Path, **branching: Any) -> tuple[art.Trainer, FakeBackend]:
    backend = FakeBackend(tmp_path)
    model = art.TrainableModel(name="branchy", project="branching").register(backend)
    settings = Branching(**{"groups_per_step": 2, "num_generations": 3, "seed": 0, **branching})
    trainer = art.Trainer(graph, model, rewards=[answer_length, agent_turns], num_generations=2, branching=settings,
                          langfuse=False)  # fmt: skip
    return trainer, backend


def check_continuations(whole: art.TrajectoryGroup, branch: art.TrajectoryGroup) -> None:
    """Each continuation starts from exactly the parent's checkpointed state and captures only what came after."""
    fork = branch.metadata["branch"]
    parent = next(t for t in whole.trajectories if t.id == fork["parent_run"])
    assert fork["node"] == "agent" and fork["depth"] == 1 and fork["parent_group"] == whole.id
    assert fork["thread_id"] == parent.metadata["thread_id"] and fork["checkpoint_id"]
    parent_turns = parent.trainable_turns()
    assert len(parent_turns) == 2 and parent_turns[0].output["tool_calls"]  # the call, then the answer
    for run in branch.trajectories:
        assert run.status == "ok" and run.metadata["branch"] == fork and run.scenario_id == "paris"
        assert [s.name for s in run.spans] == ["agent"]  # the parent's first agent and tools spans are not here
        (turn,) = run.trainable_turns()
        # the state at the fork: the question, the parent's call and its tool's result, as the parent's second
        # call saw them; the node that runs next is the one the parent's second decision was made in
        assert turn.messages == parent_turns[1].messages and turn.node == "agent"
        assert turn.messages[-1]["role"] == "tool" and "Sunny" in turn.messages[-1]["content"]
        messages = run.final_state["messages"]
        assert [m.content for m in messages[:3]] == [m.content for m in parent.final_state["messages"][:3]]
        assert len(messages) == 4 and isinstance(messages[-1], AIMessage)
        # the same rewards: on the continuation's final state, and per node on its own spans
        assert run.rewards["answer_length"] == float(len(str(messages[-1].content)))
        assert run.spans[0].rewards == {"agent_turns": 1.0}


def test_branch_groups_resume_from_the_checkpoint_and_train_only_the_continuation(
    llm: art.ChatART, tokenizer: Any, tmp_path: Path
) -> None:
    graph = weather_graph(llm)
    trainer, backend = trainer_for(graph, tmp_path)
    assert trainer.run_graph is not graph and trainer._own_checkpointer  # a copy with an InMemorySaver
    assert find_pregel(graph).checkpointer is None  # the user's graph is not changed
    assert trainer.run_graph.config["recursion_limit"] == 8  # type: ignore[attr-defined]  # its with_config wrapper is kept

    metrics = trainer.train_step([SCENARIO])
    (whole, *branches) = backend.received[0]
    assert "branch" not in whole.metadata and len(whole.trajectories) == 2
    assert len(branches) == 2 and all(len(b.trajectories) == 3 for b in branches)
    assert {b.metadata["branch"]["parent_run"] for b in branches} == {t.id for t in whole.trajectories}  # spread
    for branch in branches:
        check_continuations(whole, branch)
    assert metrics["branch/groups"] == 2 and metrics["branch/runs"] == 6 and metrics["branch/depth_mean"] == 1
    sampled = sum(len(turn.token_ids) for g in backend.received[0] for t in g.trajectories for turn in t.turns())
    assert metrics["rollout/sampled_tokens"] == sampled
    assert metrics["branch/sampled_tokens"] == sum(
        len(turn.token_ids) for g in branches for t in g.trajectories for turn in t.turns()
    )

    # trained tokens: exactly the continuation's sampled ones; the shared history (the parent's call) is context
    run = branches[0].trajectories[0]
    parent = next(t for t in whole.trajectories if t.id == run.metadata["branch"]["parent_run"])
    (sequence,) = build_sequences([run], Advantages(by_trajectory={run.id: 1.0}), tokenizer)
    (turn,) = run.trainable_turns()
    assert sum(sequence.mask) == len(turn.token_ids)
    trained = [i for i, m in zip(sequence.input_ids, sequence.mask, strict=True) if m]
    assert trained == list(turn.token_ids)
    call = list(parent.trainable_turns()[0].token_ids)
    start = next(i for i in range(len(sequence.input_ids)) if sequence.input_ids[i : i + len(call)] == call)
    assert not any(sequence.mask[start : start + len(call)])  # the parent's call is in the prompt, not trained

    # stored: every continuation once, with its fork point; the trainer's threads are gone from its checkpointer
    stored = {t.id: t for t in trainer.store.trajectories()}
    assert all(stored[t.id].metadata["branch"]["parent_run"] for b in branches for t in b.trajectories)
    saver = find_pregel(trainer.run_graph).checkpointer
    assert not list(saver.list(None))


def test_branch_groups_alone_and_a_prebuilt_agent(server: Any, tmp_path: Path) -> None:
    """``train_whole_runs=False``: the whole runs are parents only; and LangChain's ``create_agent`` (a graph we did
    not write, model node ``model``) branches like ours."""
    from langchain.agents import create_agent

    llm = art.ChatART(base_url=server.base_url, model="weather@1", temperature=0, max_tokens=48, max_retries=0)  # type: ignore[call-arg]
    graph = create_agent(model=llm, tools=[get_weather])
    trainer, backend = trainer_for(graph, tmp_path, groups_per_step=1, train_whole_runs=False)
    metrics = trainer.train_step([SCENARIO])
    (branch,) = backend.received[0]  # trained on: the branch group only
    fork = branch.metadata["branch"]
    assert fork["node"] == "model" and fork["depth"] == 1
    for run in branch.trajectories:
        assert run.status == "ok" and run.spans[0].name == "model"
        assert run.trainable_turns()[0].messages[-1]["role"] == "tool"
    assert metrics["branch/groups"] == 1 and metrics["reward/mean"] > 0  # the whole runs were still scored
    assert len(trainer.store.groups()) == 2


@pytest.mark.parametrize("async_nodes", [False, True], ids=["sync-nodes", "async-nodes"])
def test_a_graph_with_its_own_checkpointer_branches_and_keeps_its_threads(
    llm: art.ChatART, tmp_path: Path, async_nodes: bool
) -> None:
    saver = InMemorySaver()
    graph = weather_graph(llm, checkpointer=saver, async_nodes=async_nodes)
    trainer, backend = trainer_for(graph, tmp_path, groups_per_step=1)
    assert trainer.run_graph is graph and not trainer._own_checkpointer

    async def in_a_running_loop() -> dict[str, float]:  # a notebook: the sync call inside a running loop
        return trainer.train_step([SCENARIO])

    metrics = asyncio.run(in_a_running_loop())
    whole, branch = backend.received[0]
    check_continuations(whole, branch)
    assert metrics["branch/groups"] == 1
    threads = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
    assert threads == {t.metadata["thread_id"] for t in whole.trajectories}  # kept: your checkpointer, your data
    assert all(t.startswith("art-") for t in threads)


def test_interrupted_runs_and_their_continuations_resume(llm: art.ChatART, tmp_path: Path) -> None:
    """A graph that asks a human (``interrupt()``) before each answer: ``resume`` answers, as ``Command(resume=...)``
    would; whole runs and continuations are each one trajectory over their resumed parts."""
    model = llm.bind_tools([get_weather])
    asked: list[Any] = []

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def human(state: MessagesState) -> dict[str, Any]:
        note = interrupt("anything to add?")
        return {"messages": [HumanMessage(f"note: {note}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_node("human", human)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "human")
    graph.add_edge("human", "agent")
    compiled = graph.compile(checkpointer=InMemorySaver())

    def resume(interrupts: Any, state: Any) -> str:
        asked.append(interrupts[0].value)
        return "ok"

    backend = FakeBackend(tmp_path)
    trained = art.TrainableModel(name="asks", project="branching").register(backend)
    branching = Branching(groups_per_step=1, num_generations=2, seed=0)
    trainer = art.Trainer(compiled, trained, rewards=[answer_length], num_generations=2, resume=resume,
                          branching=branching, langfuse=False)  # fmt: skip
    trainer.train_step([SCENARIO])
    whole, branch = backend.received[0]
    for run in whole.trajectories:
        assert run.status == "ok" and run.metadata["resumes"] == 1
        # as LangGraph resumes: the interrupted node runs again from its start, interrupt() returning the value
        assert [(s.name, s.status) for s in run.spans] == [("agent", "ok"), ("tools", "ok"), ("human", "interrupted"),
                                                           ("human", "ok"), ("agent", "ok")]  # fmt: skip
        assert run.final_state["messages"][3].content == "note: ok"
    fork = branch.metadata["branch"]
    assert fork["node"] == "agent" and fork["depth"] == 1
    for run in branch.trajectories:  # forked after the human's note: nothing left to ask
        assert run.status == "ok" and [s.name for s in run.spans] == ["agent"]
        assert run.trainable_turns()[0].messages[-1]["content"] == "note: ok"
    assert asked == ["anything to add?"] * 2

    with pytest.raises(art.ConfigError, match="rollouts=None"):
        art.Trainer(compiled, trained, rewards=[answer_length], resume=resume, rollouts=art.RayRollouts(1))
    with pytest.raises(art.ConfigError, match="compile the graph with a checkpointer"):
        art.Trainer(graph.compile(), trained, rewards=[answer_length], resume=resume)


# -- fork points without a model: a counting graph whose spans get stand-in decisions ------------------------------


def counting_graph(checkpointer: Any = None) -> Any:
    async def think(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"move {len(state['messages'])}")]}

    def judge(state: MessagesState) -> dict[str, Any]:
        return {"messages": [HumanMessage("next")]}

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("judge", judge)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", lambda s: "__end__" if len(s["messages"]) >= 9 else "judge")
    graph.add_edge("judge", "think")
    return graph.compile(checkpointer=checkpointer or InMemorySaver())


def with_decisions(run: Trajectory) -> Trajectory:
    """Give each ``think`` span one trainable turn (what ChatART would have captured there)."""
    for span in run.spans:
        if span.name == "think":
            span.turns.append(Turn(id=span.id, token_ids=[1, 2], logprobs=[-0.1, -0.2], start_time=span.start_time,
                                   node="think"))  # fmt: skip
    return run


async def runs_of(graph: Any, count: int) -> list[Trajectory]:
    found = []
    for _ in range(count):
        run = await art.arollout(graph, {"messages": [("user", "go")]}, metadata={"scenario_id": "s", "group_id": "g"})
        found.append(with_decisions(run))
    return found


def test_fork_points_follow_every_and_rule_and_spread_over_runs() -> None:
    graph = counting_graph()
    runs = asyncio.run(runs_of(graph, 3))
    assert [len(r.trainable_turns()) for r in runs] == [5, 5, 5]

    points = asyncio.run(acandidates(graph, runs[0], Branching()))
    assert [p.depth for p in points] == [1, 2, 3, 4]  # not 0 (the whole run's) nor after the last decision
    assert all(p.node == "think" and p.run_id == runs[0].id for p in points)
    # the state the k-th decision saw: the question, then a move and a "next" each
    assert [len(p.state["messages"]) for p in points] == [3, 5, 7, 9]
    assert [p.step for p in points] == [2, 4, 6, 8]
    assert [p.depth for p in asyncio.run(acandidates(graph, runs[0], Branching(every=2)))] == [2, 4]
    odd = Branching(rule=lambda p: len(p.state["messages"]) in (3, 7))
    assert [p.depth for p in asyncio.run(acandidates(graph, runs[0], odd))] == [1, 3]
    before_judge = asyncio.run(acandidates(graph, runs[0], Branching(nodes=["judge"])))
    assert [(p.node, p.step, p.depth) for p in before_judge] == [("judge", 1, 1), ("judge", 3, 2), ("judge", 5, 3),
                                                                  ("judge", 7, 4)]  # fmt: skip

    chosen = asyncio.run(afork_points(graph, runs, Branching(groups_per_step=5), random.Random(0)))
    per_run = [sum(p.run_id == r.id for p in chosen) for r in runs]
    assert len(chosen) == 5 and sorted(per_run) == [1, 2, 2] and len(set(chosen)) == 5
    assert len(asyncio.run(afork_points(graph, runs, Branching(groups_per_step=50), random.Random(0)))) == 12

    failed = runs[0].model_copy(update={"status": "failed"})
    assert asyncio.run(acandidates(graph, failed, Branching())) == []


def test_a_continuation_is_the_graph_resumed_from_the_fork_point() -> None:
    graph = counting_graph()
    (run,) = asyncio.run(runs_of(graph, 1))
    point = asyncio.run(acandidates(graph, run, Branching(every=3)))[0]
    assert isinstance(point, ForkPoint) and point.depth == 3
    continuation = asyncio.run(art.arollout(graph, None, point.config()))
    assert [s.name for s in continuation.spans] == ["think", "judge", "think"]
    assert continuation.final_state["messages"][:7] == point.state["messages"]
    assert continuation.metadata["thread_id"] == run.metadata["thread_id"]


class Environment:
    """A live object in the state, as BFCL's multi-turn environments are (msgpack cannot hold it)."""

    def __init__(self) -> None:
        self.files = ["a.txt"]


class EnvState(MessagesState):
    env: Environment


def test_the_supplied_checkpointer_holds_plain_python_objects() -> None:
    async def think(state: EnvState) -> dict[str, Any]:
        state["env"].files.append(f"{len(state['messages'])}.txt")
        return {"messages": [AIMessage("move")], "env": state["env"]}

    def judge(state: EnvState) -> dict[str, Any]:
        return {"messages": [HumanMessage("next")]}

    builder = StateGraph(EnvState)
    builder.add_node("think", think)
    builder.add_node("judge", judge)
    builder.add_edge(START, "think")
    builder.add_conditional_edges("think", lambda s: "__end__" if len(s["messages"]) >= 4 else "judge")
    builder.add_edge("judge", "think")
    graph, own = with_checkpointer(builder.compile())
    assert own
    run = asyncio.run(art.arollout(graph, {"messages": [("user", "go")], "env": Environment()}))
    assert run.status == "ok", run.error
    (point,) = asyncio.run(acandidates(graph, with_decisions(run), Branching()))
    assert run.final_state["env"].files == ["a.txt", "1.txt", "3.txt"]  # changed in place by the run
    assert point.state["env"].files == ["a.txt", "1.txt"]  # the object as it was at the fork, not as it ended
    continuation = asyncio.run(art.arollout(graph, None, point.config()))
    assert continuation.final_state["env"].files == ["a.txt", "1.txt", "3.txt"]
    assert continuation.final_state["env"] is not run.final_state["env"]


def test_bad_branching_settings_say_what_to_change(llm: art.ChatART) -> None:
    with pytest.raises(art.ConfigError, match="groups_per_step"):
        Branching(groups_per_step=0)
    with pytest.raises(art.ConfigError, match="num_generations"):
        Branching(num_generations=1)
    with pytest.raises(art.ConfigError, match="node names"):
        Branching(nodes=[1])  # type: ignore[list-item]
    assert Branching(nodes="agent").nodes == ["agent"]
    with pytest.raises(art.ConfigError, match="compiled LangGraph graph"):
        with_checkpointer(llm)
    with pytest.raises(art.ConfigError, match="rollouts=None"):
        art.Trainer(counting_graph(), art.TrainableModel(name="x", project="y").register(FakeBackend(Path("/tmp"))),
                    rewards=[answer_length], branching=Branching(), rollouts=art.RayRollouts(1))  # fmt: skip


# -- a real trainer: the embedded LocalBackend on the tiny model, sampling at temperature 1 -------------------------


def two_decisions_graph(llm: art.ChatART) -> Any:
    """``think`` answers, ``judge`` asks for more, ``think`` answers again: two sampled decisions a run."""

    def think(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def judge(state: MessagesState) -> dict[str, Any]:
        return {"messages": [HumanMessage("Say more.")]}

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("judge", judge)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", lambda s: "__end__" if len(s["messages"]) >= 4 else "judge")
    graph.add_edge("judge", "think")
    return graph.compile()


@art.reward
def visible_characters(state: Any) -> float:
    """Non-blank characters of the last answer: the untrained tiny model often answers only newlines (0), and
    otherwise anything from 5 to 50 (measured at 16 tokens: a quarter of the answers are blank)."""
    return float(len("".join(str(state["messages"][-1].content).split())))


@pytest.mark.integration
def test_a_real_trainer_trains_on_the_branch_groups(tmp_path: Path, tokenizer: Any) -> None:
    """Sampled at temperature 1, the continuations' answers (and so their rewards) differ; the step's record counts
    their sequences among the trained ones and the LoRA moves. A trainer or loop that dropped the branch groups would
    train on the whole runs alone and fail here (the fake-backend tests above cannot tell)."""
    from safetensors.torch import load_file

    from langgraph_art.train import checkpoint
    from langgraph_art.train.advantages import group_advantages

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="branchy", project="branching").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=16)  # unseeded: the continuations differ
        settings = Branching(groups_per_step=2, num_generations=4, seed=0)
        trainer = art.Trainer(two_decisions_graph(llm), model, rewards=[visible_characters], num_generations=2,
                              branching=settings, langfuse=False)  # fmt: skip
        sent: list[list[art.TrajectoryGroup]] = []
        train_step = backend.train_step

        def recording_train_step(*args: Any, **kwargs: Any) -> Any:  # what the loop hands the trainer
            sent.append(list(args[1]))
            return train_step(*args, **kwargs)

        backend.train_step = recording_train_step  # type: ignore[method-assign]
        metrics = trainer.train_step([{"id": "hi", "input": {"messages": [("user", "Hello!")]}}])
        folder = checkpoint.step_dir(backend.checkpoint_dir(model), 1)
        lora = load_file(folder / "adapter_model.safetensors") if folder.is_dir() else {}

    (groups,) = sent
    whole = [g for g in groups if "branch" not in g.metadata]
    branches = [g for g in groups if "branch" in g.metadata]
    assert len(whole) == 1 and len(branches) == metrics["branch/groups"] == 2  # one fork point in each whole run
    assert metrics["branch/runs"] == 8
    spread = [g for g in branches if len({t.reward for t in g.completed()}) > 1]
    # temperature 1: the answers differ (all 4 blank in both groups: ~(1/4)^8, once in 65,000 runs)
    assert spread, [[t.reward for t in g.trajectories] for g in branches]

    # trained on: each continuation made one decision (one sequence); the whole runs' sequences as the trainer
    # builds them; the record counts both
    continuations = [t for g in spread for t in g.completed()]
    assert all(len(t.trainable_turns()) == 1 for t in continuations)
    whole_runs = [t for g in whole for t in g.completed()]
    whole_sequences = build_sequences(whole_runs, group_advantages(whole), tokenizer)
    assert metrics["train/updated"] == 1 and metrics["step"] == 1
    assert metrics["train/sequences"] == len(whole_sequences) + len(continuations), metrics
    assert metrics["train/tokens"] >= sum(len(t.trainable_turns()[0].token_ids) for t in continuations)
    assert any(t.metadata.get("advantage") for t in continuations)  # the trainer's advantages, not zero

    # the update moved the LoRA: peft starts lora_B at zero, the step-1 checkpoint's is not
    b_weights = [w for name, w in lora.items() if "lora_B" in name]
    assert b_weights and any(w.abs().max() > 0 for w in b_weights)


@pytest.mark.integration
def test_a_teacher_scores_the_branch_groups_continuations_too(tmp_path: Path) -> None:
    """With branching and a privileged teacher, the continuations' turns are shown the scenario's hint (a branch
    group keeps its scenario) and scored with the whole runs' turns: the teacher scored every trained token."""

    def hint(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": f"Greet back: {scenario['id']}."}, *messages]

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="taught", project="branching").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=16)
        trainer = art.Trainer(two_decisions_graph(llm), model, rewards=[visible_characters], num_generations=2,
                              branching=Branching(groups_per_step=2, num_generations=4, seed=0), langfuse=False,
                              teacher=art.Teacher(model="policy", prompt=hint))  # fmt: skip
        metrics = trainer.train_step([{"id": "hi", "input": {"messages": [("user", "Hello!")]}}])
        runs = trainer.store.trajectories()
    assert metrics["branch/runs"] == 8 and metrics["train/updated"] == 1
    assert metrics["train/teacher/tokens"] == metrics["train/tokens"] > 0  # free text: every trained token scored
    turns = [turn for run in runs for turn in run.trainable_turns()]
    assert len(turns) >= 8 and all("Greet back: hi." in (t.teacher_messages or [{}])[0]["content"] for t in turns)
