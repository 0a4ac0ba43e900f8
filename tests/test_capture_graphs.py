"""Capture over real graphs driven by the embedded tiny service (weather@1: a two-step tool agent)."""

from __future__ import annotations

import asyncio
import operator
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send

from langgraph_art.capture.callbacks import TrajectoryCallbackHandler
from langgraph_art.capture.chat_model import ChatART
from langgraph_art.types import Trajectory
from tests.helpers import WEATHER_ANSWER, WEATHER_PROMPTS, WEATHER_RESULT, get_weather, tool_loop_graph

pytestmark = pytest.mark.integration


@pytest.fixture
def weather_llm(server) -> ChatART:
    return ChatART(base_url=server.base_url, model="weather@1", temperature=0, max_tokens=48, max_retries=0)


@pytest.fixture
def tiny_llm(server) -> ChatART:
    return ChatART(base_url=server.base_url, model="tiny", max_tokens=8, max_retries=0)


def check_turns(trajectory: Trajectory, llm: ChatART, tokenizer: Any, expected_calls: int) -> None:
    """The checks every graph must pass: all calls captured, placed, and exact."""
    turns = trajectory.turns()
    recorded = llm.recorder.unclaimed() if llm.recorder else []
    assert not recorded, "every call the model made was also seen through callbacks"
    assert len(turns) == expected_calls
    for turn in turns:
        assert turn.node and turn.step is not None and turn.namespace, turn
        assert trajectory.span(next(s.id for s in trajectory.spans if turn in s.turns)).name == turn.node
        assert len(turn.token_ids) == len(turn.logprobs) > 0
        assert turn.trainable and turn.call_id and turn.finish_reason in ("stop", "length", "tool_calls")
        if not turn.output.get("tool_calls"):
            assert tokenizer.decode(turn.token_ids, skip_special_tokens=True) == turn.output["content"]


def react_agent(llm: ChatART):
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(llm, [get_weather])


def test_prebuilt_react_agent(weather_llm, tokenizer) -> None:
    handler = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
    state = react_agent(weather_llm).invoke({"messages": [("user", WEATHER_PROMPTS[0])]}, {"callbacks": [handler]})
    assert state["messages"][-1].content == WEATHER_ANSWER
    (trajectory,) = handler.trajectories
    assert trajectory.status == "ok"
    assert [(s.name, s.step) for s in trajectory.spans] == [("agent", 1), ("tools", 2), ("agent", 3)]
    check_turns(trajectory, weather_llm, tokenizer, expected_calls=2)
    tools_span = trajectory.spans[1]
    (call,) = tools_span.tool_calls
    assert call.name == "get_weather" and call.arguments == {"city": "Paris"} and call.result == WEATHER_RESULT
    assert call.id == trajectory.spans[0].turns[0].output["tool_calls"][0]["id"]
    ((node, messages),) = trajectory.conversations()
    assert node == "agent" and [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert Trajectory.model_validate_json(trajectory.model_dump_json()) == trajectory


def test_hand_built_tool_loop_sync_async_and_streaming(weather_llm, tokenizer) -> None:
    graph = tool_loop_graph(weather_llm)
    inputs = {"messages": [("user", WEATHER_PROMPTS[1])]}
    sync = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
    graph.invoke(inputs, {"callbacks": [sync]})
    check_turns(sync.trajectories[0], weather_llm, tokenizer, expected_calls=2)

    asynchronous = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
    asyncio.run(graph.ainvoke(inputs, {"callbacks": [asynchronous]}))
    check_turns(asynchronous.trajectories[0], weather_llm, tokenizer, expected_calls=2)

    streamed = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
    tokens = [
        chunk
        for chunk, _ in graph.stream(inputs, {"callbacks": [streamed]}, stream_mode="messages")
        if isinstance(chunk, AIMessage)
    ]
    assert tokens, "stream_mode='messages' streamed the model's tokens"
    check_turns(streamed.trajectories[0], weather_llm, tokenizer, expected_calls=2)
    # the same exact ids whether the model was invoked or streamed (greedy decoding)
    ids = lambda h: [t.token_ids for t in h.trajectories[0].turns()]  # noqa: E731
    assert ids(sync) == ids(streamed) == ids(asynchronous)
    # the second call's prompt (the template rendering the first call's tool call back) starts with the first call's
    # prompt and sampled ids: the loop trains as one sequence
    from langgraph_art.train.advantages import Advantages
    from langgraph_art.train.tokenize import build_sequences

    run = sync.trajectories[0]
    (sequence,) = build_sequences([run], Advantages(by_trajectory={run.id: 1.0}), tokenizer)
    assert sequence.turns == 2


def test_subgraph_as_node_and_inside_a_node(weather_llm, tokenizer) -> None:
    inner = tool_loop_graph(weather_llm)

    def call_inner(state: MessagesState) -> dict:
        return {"messages": inner.invoke({"messages": state["messages"]})["messages"][len(state["messages"]) :]}

    as_node = StateGraph(MessagesState)
    as_node.add_node("weather_team", inner)
    as_node.add_edge(START, "weather_team")
    inside = StateGraph(MessagesState)
    inside.add_node("delegate", call_inner)
    inside.add_edge(START, "delegate")
    for outer, top in ((as_node.compile(), "weather_team"), (inside.compile(), "delegate")):
        handler = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
        state = outer.invoke({"messages": [("user", WEATHER_PROMPTS[2])]}, {"callbacks": [handler]})
        assert state["messages"][-1].content == WEATHER_ANSWER
        (trajectory,) = handler.trajectories
        (parent,) = trajectory.children(None)
        assert parent.name == top
        children = trajectory.children(parent.id)
        assert [c.name for c in children] == ["agent", "tools", "agent"]
        assert all(c.namespace.startswith(parent.namespace.split("|")[0]) and "|" in c.namespace for c in children)
        check_turns(trajectory, weather_llm, tokenizer, expected_calls=2)


class FanState(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]


def test_parallel_branches_and_send_map_reduce(tiny_llm, tokenizer) -> None:
    def ask(name: str):
        def node(state: FanState) -> dict:
            return {"answers": [tiny_llm.invoke(f"{name}: {state['topics']}").content]}

        return node

    parallel = StateGraph(FanState)
    for name in ("left", "right"):
        parallel.add_node(name, ask(name))
        parallel.add_edge(START, name)
        parallel.add_edge(name, END)

    def write(state: dict) -> dict:
        return {"answers": [tiny_llm.invoke(f"write about {state['topic']}").content]}

    mapped = StateGraph(FanState)
    mapped.add_node("write", write)
    mapped.add_conditional_edges(START, lambda s: [Send("write", {"topic": t}) for t in s["topics"]], ["write"])
    mapped.add_edge("write", END)
    for graph, names in ((parallel.compile(), {"left", "right"}), (mapped.compile(), {"write"})):
        handler = TrajectoryCallbackHandler(recorders=[tiny_llm.recorder])
        state = graph.invoke({"topics": ["a", "b", "c"], "answers": []}, {"callbacks": [handler]})
        (trajectory,) = handler.trajectories
        calls = len(state["answers"])
        assert {s.name for s in trajectory.spans} == names and len(trajectory.spans) == calls
        assert len({s.namespace for s in trajectory.spans}) == calls  # one span per task, same step
        assert len({s.step for s in trajectory.spans}) == 1
        check_turns(trajectory, tiny_llm, tokenizer, expected_calls=calls)


def test_supervisor_with_one_art_agent_flags_the_other_untrainable(weather_llm, tokenizer) -> None:
    supervisor_llm = FakeListChatModel(responses=["route: weather", "done"])

    def supervisor(state: MessagesState) -> dict:
        return {"messages": [AIMessage(supervisor_llm.invoke(state["messages"]).content, name="supervisor")]}

    def weather_agent(state: MessagesState) -> dict:
        question = [m for m in state["messages"] if isinstance(m, HumanMessage)]
        reply = react_agent(weather_llm).invoke({"messages": question})
        return {"messages": [AIMessage(reply["messages"][-1].content, name="weather")]}

    def route(state: MessagesState) -> str:
        return "weather" if state["messages"][-1].content == "route: weather" else END

    graph = StateGraph(MessagesState)
    graph.add_node("supervisor", supervisor)
    graph.add_node("weather", weather_agent)
    graph.add_edge(START, "supervisor")
    graph.add_conditional_edges("supervisor", route, ["weather", END])
    graph.add_edge("weather", "supervisor")
    handler = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])
    state = graph.compile().invoke({"messages": [("user", WEATHER_PROMPTS[0])]}, {"callbacks": [handler]})
    assert [m.content for m in state["messages"]][-2:] == [WEATHER_ANSWER, "done"]
    (trajectory,) = handler.trajectories
    other = [t for t in trajectory.turns() if t.source == "other"]
    assert len(other) == 2 and not any(t.trainable for t in other) and {t.node for t in other} == {"supervisor"}
    art = trajectory.trainable_turns()
    assert len(art) == 2 and {t.node for t in art} == {"agent"}  # the inner react agent's node
    assert trajectory.trainable_turns(nodes=["supervisor"]) == []
    weather_span = next(s for s in trajectory.spans if s.name == "weather")
    assert {s.name for s in trajectory.children(weather_span.id)} == {"agent", "tools"}


def test_concurrent_runs_sharing_one_handler(weather_llm) -> None:
    graph = tool_loop_graph(weather_llm)
    handler = TrajectoryCallbackHandler(recorders=[weather_llm.recorder])

    async def main() -> None:
        await asyncio.gather(
            *(graph.ainvoke({"messages": [("user", p)]}, {"callbacks": [handler]}) for p in WEATHER_PROMPTS * 2)
        )

    asyncio.run(main())
    assert len(handler.trajectories) == 6 and handler.errors == 0
    for trajectory in handler.trajectories:
        question = trajectory.input["messages"][0][1]
        turns = trajectory.turns()
        assert len(turns) == 2 and all(t.messages[0]["content"] == question for t in turns)


def test_calls_from_a_raw_thread_pool_are_adopted(tiny_llm) -> None:
    def fan_out(state: MessagesState) -> dict:
        with ThreadPoolExecutor(2) as pool:  # callbacks do not propagate into these threads
            replies = list(pool.map(lambda q: tiny_llm.invoke(q), ["one", "two"]))
        return {"messages": replies}

    graph = StateGraph(MessagesState)
    graph.add_node("fan_out", fan_out)
    graph.add_edge(START, "fan_out")
    handler = TrajectoryCallbackHandler(recorders=[tiny_llm.recorder])
    graph.compile().invoke({"messages": [("user", "go")]}, {"callbacks": [handler]})
    (trajectory,) = handler.trajectories
    (span,) = trajectory.spans
    assert len(span.turns) == 2 and {t.attribution for t in span.turns} == {"time"}
    assert sorted(t.messages[0]["content"] for t in span.turns) == ["one", "two"]
    assert tiny_llm.recorder.unclaimed() == []

    without = TrajectoryCallbackHandler()  # no recorder: the handler alone cannot see them
    graph.compile().invoke({"messages": [("user", "go")]}, {"callbacks": [without]})
    assert without.trajectories[0].turns() == []
    assert len(tiny_llm.recorder.unclaimed()) == 2  # ...but ChatART kept them: nothing is lost


def test_interrupt_is_control_flow_not_failure(tiny_llm) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import interrupt

    def draft(state: MessagesState) -> dict:
        return {"messages": [tiny_llm.invoke(state["messages"])]}

    def approve(state: MessagesState) -> dict:
        return {"messages": [HumanMessage(str(interrupt("approve?")))]}

    graph = StateGraph(MessagesState)
    graph.add_node("draft", draft)
    graph.add_node("approve", approve)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "approve")
    handler = TrajectoryCallbackHandler()
    app = graph.compile(checkpointer=InMemorySaver())
    app.invoke({"messages": [("user", "hi")]}, {"callbacks": [handler], "configurable": {"thread_id": "t1"}})
    (trajectory,) = handler.trajectories
    assert trajectory.status == "interrupted" and trajectory.error is None
    assert [(s.name, s.status) for s in trajectory.spans] == [("draft", "ok"), ("approve", "interrupted")]
    assert len(trajectory.turns()) == 1


def test_failing_node_marks_the_trajectory_failed_and_keeps_it(tiny_llm) -> None:
    def think(state: MessagesState) -> dict:
        return {"messages": [tiny_llm.invoke(state["messages"])]}

    def explode(state: MessagesState) -> dict:
        raise ValueError("tool backend down")

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("explode", explode)
    graph.add_edge(START, "think")
    graph.add_edge("think", "explode")
    handler = TrajectoryCallbackHandler()
    with pytest.raises(ValueError, match="tool backend down"):
        graph.compile().invoke({"messages": [("user", "hi")]}, {"callbacks": [handler]})
    (trajectory,) = handler.trajectories
    assert trajectory.status == "failed" and "tool backend down" in (trajectory.error or "")
    assert [(s.name, s.status) for s in trajectory.spans] == [("think", "ok"), ("explode", "error")]
    assert trajectory.spans[1].error == "ValueError: tool backend down"
    assert len(trajectory.turns()) == 1


def test_handler_never_raises_into_the_graph(tiny_llm, monkeypatch) -> None:
    import langgraph_art.capture.assembly as assembly
    import langgraph_art.capture.callbacks as callbacks

    graph = StateGraph(MessagesState)
    graph.add_node("think", lambda s: {"messages": [tiny_llm.invoke(s["messages"])]})
    graph.add_edge(START, "think")
    app = graph.compile()

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("capture bug")

    monkeypatch.setattr(callbacks, "SpanRecord", broken)  # fails inside a callback, during the run
    handler = TrajectoryCallbackHandler()
    state = app.invoke({"messages": [("user", "hi")]}, {"callbacks": [handler]})
    assert isinstance(state["messages"][-1], AIMessage)
    assert handler.errors >= 1 and handler.trajectories[0].status == "ok"
    monkeypatch.undo()

    monkeypatch.setattr(assembly, "build_turns", broken)  # fails while assembling, after the run
    handler = TrajectoryCallbackHandler()
    app.invoke({"messages": [("user", "hi")]}, {"callbacks": [handler]})
    assert handler.trajectories == [] and handler.errors == 1


def test_nodes_langgraph_hides_are_not_spans() -> None:
    """A task tagged langgraph.constants.TAG_HIDDEN ("langsmith:hidden") is internal: no span of its own."""
    from langgraph.channels import EphemeralValue, LastValue
    from langgraph.constants import TAG_HIDDEN
    from langgraph.pregel import NodeBuilder, Pregel

    visible = NodeBuilder().subscribe_only("a").do(lambda x: x + "!").write_to("b")
    hidden = NodeBuilder().subscribe_only("b").do(lambda x: x + "?").write_to("c").meta(TAG_HIDDEN)
    app = Pregel(
        nodes={"visible": visible, "helper": hidden},
        channels={"a": EphemeralValue(str), "b": EphemeralValue(str), "c": LastValue(str)},
        input_channels=["a"],
        output_channels=["c"],
    )
    handler = TrajectoryCallbackHandler()
    assert app.invoke({"a": "x"}, {"callbacks": [handler]}) == {"c": "x!?"}
    assert [span.name for span in handler.trajectories[0].spans] == ["visible"]
    assert handler.errors == 0


def test_a_long_run_keeps_few_objects_per_call_until_it_is_read() -> None:
    """Per-event cost must stay flat in a run's length: every object the handler keeps alive until the run ends
    is scanned by each garbage collection. Holding each call's LLMResult (32 logprob dicts for 32 tokens) kept
    ~127 objects per node step; the compact records keep ~13."""
    import gc

    from langgraph_art.testing import long_run_graph

    steps = 300
    app = long_run_graph(steps)
    handler = TrajectoryCallbackHandler()
    app.invoke({"count": 0}, {"callbacks": [handler]})
    gc.collect()
    kept = len(gc.get_objects())
    finished = handler._finished
    handler._finished = []
    del finished
    gc.collect()
    per_step = (kept - len(gc.get_objects())) / steps
    assert per_step < 20, per_step
