"""Trajectory types: turn selection, conversations per agent, JSON round trip (hand-built data, no model)."""

from __future__ import annotations

from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn


def turn(i: int, node: str, messages: list[dict], answer: str, **kw: object) -> Turn:
    return Turn(
        id=f"t{i}",
        node=node,
        messages=messages,
        output={"role": "assistant", "content": answer},
        token_ids=[1, 2],
        logprobs=[-0.1, -0.2],
        start_time=float(i),
        **kw,
    )


def build() -> Trajectory:
    q = [{"role": "user", "content": "q"}]
    a1 = turn(1, "agent", q, "call")
    loop = [*q, {"role": "assistant", "content": "call"}, {"role": "tool", "content": "r", "tool_call_id": "c"}]
    a2 = turn(3, "agent", loop, "done")
    critic = turn(2, "critic", [{"role": "user", "content": "judge"}], "ok", trainable=False, source="other")
    fresh = turn(4, "agent", [{"role": "user", "content": "new task"}], "x")
    no_ids = Turn(id="t5", node="agent", messages=q, output={"role": "assistant", "content": "?"}, start_time=5.0)
    return Trajectory(
        id="r",
        status="ok",
        spans=[
            NodeSpan(id="s1", name="agent", turns=[a1]),
            NodeSpan(id="s2", name="critic", turns=[critic]),
            NodeSpan(id="s3", name="agent", turns=[a2, fresh, no_ids]),
        ],
    )


def test_turns_in_call_order_and_trainable_selection_by_node() -> None:
    t = build()
    assert [x.id for x in t.turns()] == ["t1", "t2", "t3", "t4", "t5"]
    assert [x.id for x in t.turns(nodes=["critic"])] == ["t2"]
    assert [x.id for x in t.trainable_turns()] == ["t1", "t3", "t4"]  # not the other model's, not id-less
    assert t.trainable_turns(nodes=["critic"]) == []


def test_conversations_merge_continuations_and_split_fresh_starts() -> None:
    chains = build().conversations()
    assert [name for name, _ in chains] == ["agent", "critic", "agent", "agent"]
    agent, _, fresh, retry = chains
    assert [m["content"] for m in agent[1]] == ["q", "call", "r", "done"]
    assert [m["content"] for m in fresh[1]] == ["new task", "x"]
    assert [m["content"] for m in retry[1]] == ["q", "?"]  # starts over: not a continuation of the loop


def test_json_round_trip_keeps_everything_but_python_state() -> None:
    t = build()
    t.final_state = {"messages": [object()]}
    back = Trajectory.model_validate_json(t.model_dump_json())
    assert back.model_dump() == t.model_dump() and back.final_state is None
    group = TrajectoryGroup(id="g", scenario_id="s", trajectories=[t, Trajectory(id="f", status="failed")])
    assert [x.id for x in group.completed()] == ["r"] and [x.id for x in group.failed] == ["f"]
    assert TrajectoryGroup.model_validate_json(group.model_dump_json()).model_dump() == group.model_dump()


def test_turn_recorder_claims_adopts_and_bounds() -> None:
    from langgraph_art.capture.recorder import TurnRecorder

    recorder = TurnRecorder(capacity=3)
    made = lambda i: [Turn(id=f"t{i}", start_time=float(i))]  # noqa: E731
    for i in range(5):
        recorder.record(f"call{i}", {"langgraph_art_run": "r1"} if i == 4 else {}, float(i), lambda i=i: made(i))
    assert recorder.evicted_unclaimed == 2 and [t.id for t in recorder.unclaimed()] == ["t2", "t3", "t4"]
    recorder.claim("call2")
    taken = recorder.take_unclaimed("r1", 0.0, 3.5)
    assert [(t.id, by_metadata) for t, by_metadata in taken] == [("t3", False), ("t4", True)]
    assert recorder.unclaimed() == []


def test_model_ref_reads_and_prints_name_at_step() -> None:
    from langgraph_art.types import ModelRef

    assert ModelRef.parse("agent@12") == ModelRef("agent", 12) and str(ModelRef("agent", 12)) == "agent@12"
    assert ModelRef.parse("agent") == ModelRef("agent") and ModelRef.parse("agent").latest
    assert ModelRef.parse("a@b@3") == ModelRef("a@b", 3)
    for plain in ("org/model@main", "@5", "agent@", "gpt-4.1"):  # no step number after the last '@'
        assert ModelRef.parse(plain) == ModelRef(plain) and str(ModelRef.parse(plain)) == plain
    assert str(ModelRef.parse("agent@12").at(None)) == "agent" and str(ModelRef("agent").at(3)) == "agent@3"
