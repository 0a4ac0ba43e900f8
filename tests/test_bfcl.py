"""examples/bfcl.py: BFCL's argument rules for one Python call, reimplemented, checked by hand and against BFCL's own
ground truth (every answer it lists must pass; a changed value must not)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
bfcl = importlib.import_module("bfcl")

FUNCTION = {
    "name": "geometry.area",
    "description": "Area of a shape.",
    "parameters": {
        "type": "dict",
        "properties": {
            "shape": {"type": "string"},
            "size": {"type": "float"},
            "units": {"type": "string", "optional": True},
            "corners": {"type": "array", "items": {"type": "integer"}},
            "style": {"type": "dict", "properties": {"color": {"type": "string"}}},
        },
        "required": ["shape", "size"],
    },
}
ANSWER = {
    "geometry.area": {
        "shape": ["Square"],
        "size": [2.0],
        "units": ["", "meters"],
        "corners": [[1, 2], ""],
        "style": [{"color": ["red"]}, ""],
    }
}
CASE = bfcl.Case("simple_python_7", [[{"role": "user", "content": "?"}]], [FUNCTION], [ANSWER])


@pytest.mark.parametrize(
    ("name", "arguments", "valid", "right", "error"),
    [
        # 1 (the name) + 5 parameters = 6 checks
        ("geometry_area", {"shape": "square", "size": 2}, True, 6, ""),  # int for float; case and spaces ignored
        ("geometry_area", {"shape": "S-q_u.a re", "size": 2.0, "units": "Meters"}, True, 6, ""),
        ("geometry_area", {"shape": "circle", "size": 2.0}, False, 5, "'shape'='circle' is none of ['Square']"),
        ("geometry_area", {"shape": "square"}, False, 5, "missing required parameter 'size'"),
        ("geometry_area", {"shape": "square", "size": "2"}, False, 5, "'size' has type str, expected float"),
        ("geometry_area", {"shape": "square", "size": 2.0, "corners": [2, 1]}, False, 5, "'corners'=[2, 1]"),
        ("geometry_area", {"shape": "square", "size": 2.0, "corners": [1, 2]}, True, 6, ""),
        ("geometry_area", {"shape": "square", "size": 2.0, "corners": ["1", 2]}, False, 5, "'corners' holds items"),
        ("geometry_area", {"shape": "square", "size": 2.0, "style": {"color": "Red"}}, True, 6, ""),
        ("geometry_area", {"shape": "square", "size": 2.0, "style": {"color": "blue"}}, False, 5, "'style'="),
        ("geometry_area", {"shape": "square", "size": 2.0, "extra": 1}, False, 6, "unexpected parameter 'extra'"),
        ("geometry_area", {"shape": 1, "size": "x"}, False, 4, "'shape' has type int"),
        ("area", {"shape": "square", "size": 2.0}, False, 0, "called 'area', expected 'geometry_area'"),
    ],
)
def test_check_call_by_hand(name: str, arguments: dict[str, Any], valid: bool, right: int, error: str) -> None:
    check = bfcl.check_call(CASE, name, arguments)
    assert (check.valid, check.right) == (valid, right), check
    assert check.error.startswith(error), check
    assert check.total == (7 if "extra" in arguments else 6)


def test_an_optional_parameter_the_answer_sets_must_be_there() -> None:
    answer = {"geometry.area": {"shape": ["square"], "size": [2.0], "units": ["meters"]}}
    case = bfcl.Case("simple_python_1", CASE.question, [FUNCTION], [answer])
    check = bfcl.check_call(case, "geometry_area", {"shape": "square", "size": 2.0})
    assert not check.valid and "optional parameter 'units' left out" in check.error


def test_json_schema_maps_bfcl_types() -> None:
    schema = bfcl.json_schema(FUNCTION["parameters"])
    assert schema["type"] == "object" and schema["required"] == ["shape", "size"]
    assert schema["properties"]["size"] == {"type": "number"}
    assert schema["properties"]["corners"] == {"type": "array", "items": {"type": "integer"}}
    assert schema["properties"]["style"]["properties"] == {"color": {"type": "string"}}
    assert "optional" not in schema["properties"]["units"]
    assert bfcl.json_schema({"type": "any"}) == {}
    assert bfcl.json_schema({"type": "dict"}) == {"type": "object", "additionalProperties": True}
    assert bfcl.tools(CASE)[0]["function"]["name"] == "geometry_area"


def first(answer: Any) -> Any:
    """A call's value from an answer: nested dicts list their allowed values too; take the first of each."""
    if isinstance(answer, dict):
        return {k: first(options[0]) for k, options in answer.items() if options[0] != ""}
    if isinstance(answer, list):
        return [first(item) for item in answer]
    return answer


@pytest.mark.integration
def test_every_ground_truth_passes_and_a_changed_value_fails() -> None:
    """On BFCL's own data (from the wheel): 400 simple_python cases, split 320/80 by id; the first answer BFCL lists
    for each case passes; changing a string argument makes it fail."""
    cases = bfcl.load("simple_python")
    train, held_out = bfcl.split(cases)
    assert (len(cases), len(train), len(held_out)) == (400, 320, 80)
    assert {c.id for c in train}.isdisjoint(c.id for c in held_out)
    changed = 0
    for case in cases:
        ((name, allowed),) = case.answers[0].items()
        # the first value BFCL allows (a parameter the function requires is given even where "" comes first)
        given = {p: [o for o in options if o != ""] for p, options in allowed.items()}
        arguments = {p: first(options[0]) for p, options in given.items() if options}
        check = bfcl.check_call(case, bfcl.tool_name(name), arguments)
        assert check.valid and check.share == 1.0, (case.id, check)
        text = next((p for p, v in arguments.items() if isinstance(v, str) and v), None)
        if text is not None:
            wrong = bfcl.check_call(case, bfcl.tool_name(name), {**arguments, text: arguments[text] + " zz"})
            assert not wrong.valid and 0 < wrong.share < 1, (case.id, wrong)
            changed += 1
    assert changed > 200


@pytest.mark.integration
def test_the_required_hint_leaves_out_only_what_the_checker_lets_a_call_leave_out() -> None:
    """The teacher's two BFCL hints (examples/function_calling.py) on BFCL's data: the full reference call, and the
    call with its required arguments only. Each argument the required hint drops may be left out (the first allowed
    values without it still pass BFCL's checks), and the hint keeps the rest."""
    import json

    function_calling = importlib.import_module("function_calling")
    cases = bfcl.load("simple_python")
    scenarios = function_calling.scenarios(cases)
    dropped_somewhere = 0
    for case, scenario in zip(cases, scenarios, strict=True):
        ((name, allowed),) = case.answers[0].items()
        full, required = (json.loads(function_calling.reference_call(scenario, optional=o).split("(", 1)[1][:-1])
                          for o in (True, False))  # fmt: skip
        assert set(required) <= set(full) and all(required[k] == full[k] for k in required), case.id
        given = {p: [o for o in options if o != ""] for p, options in allowed.items()}
        arguments = {p: first(options[0]) for p, options in given.items() if options}
        dropped = set(full) - set(required)
        check = bfcl.check_call(case, bfcl.tool_name(name), {k: v for k, v in arguments.items() if k not in dropped})
        assert check.valid, (case.id, dropped, check)
        for kept in set(required):  # and what the hint keeps, the call may not leave out
            without = bfcl.check_call(case, bfcl.tool_name(name), {k: v for k, v in arguments.items() if k != kept})
            assert not without.valid, (case.id, kept)
        dropped_somewhere += bool(dropped)
    assert dropped_somewhere > 100  # BFCL fills an optional argument in ~2 of 5 reference answers
    hinted = function_calling.required_hint(scenarios[0], [{"role": "user", "content": "Q?"}])
    assert hinted[-1]["content"].startswith("Q? (The call: ")


# -- multi_turn_base ----------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_multi_turn_ground_truth_passes_and_a_missing_call_fails() -> None:
    """BFCL's own ground truth, executed on the environments from the wheel, passes all 200 cases; a turn that
    lacks its last call leaves a different state; an empty turn fails at once."""
    mt = importlib.import_module("bfcl_multi_turn")
    cases = mt.load("multi_turn_base")
    assert len(cases) == 200
    for case in cases:
        verdict = mt.check_conversation(case, mt.ground_truth_calls(case))
        assert verdict.valid and verdict.share == 1.0, (case.id, verdict.error)
    case = cases[0]  # cd, mkdir, mv | cd, grep | sort | cd, mv, cd, diff
    calls = mt.ground_truth_calls(case)
    assert calls[0][1] == ("mkdir", {"dir_name": "temp"}) and calls[2] == [("sort", {"file_name": "final_report.pdf"})]
    wrong = mt.check_conversation(case, [calls[0][:-1], *calls[1:]])
    assert (wrong.turns_right, wrong.turns) == (0, 4) and "GorillaFileSystem differs in root" in wrong.error
    late = mt.check_conversation(case, [*calls[:2], [], calls[3]])
    assert (late.turns_right, late.error) == (2, "turn 2: no call")
    assert mt.execute(mt.environments(case), "no_such_function", {}).startswith("Error during execution:")


class ScriptedModel:
    """Stands in for ChatART in the multi-turn graph: answers each user turn with the ground truth's calls, then a
    closing message; records the tool_choice of every call."""

    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.turns, self.choices, self.turn = turns, [], -1

    def bind_tools(self, tools: list[Any], *, tool_choice: str, parallel_tool_calls: bool) -> ScriptedModel:
        self.choices.append(tool_choice)
        return self

    def invoke(self, messages: list[Any]) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage

        if isinstance(messages[-1], HumanMessage):
            self.turn += 1
            calls = [
                {"name": n, "args": a, "id": f"c{self.turn}-{i}"} for i, (n, a) in enumerate(self.turns[self.turn])
            ]
            return AIMessage("", tool_calls=calls)
        return AIMessage("done")


@pytest.mark.integration
def test_the_multi_turn_graph_runs_the_calls_on_its_environments_and_is_scored() -> None:
    """examples/multi_turn.py's tool loop without a model: the scripted answers are BFCL's ground truth, so the
    conversation must score 1; with a turn's calls left out, less."""
    mt = importlib.import_module("bfcl_multi_turn")
    example = importlib.import_module("multi_turn")
    case = mt.load("multi_turn_base")[0]
    (scenario,) = example.scenarios([case])
    model = ScriptedModel(mt.ground_truth_calls(case))
    state = example.build_graph(model).invoke(scenario["input"])
    assert [len(turn) for turn in state["calls"]] == [3, 2, 1, 4]
    assert model.choices == ["required", "auto"] * 4  # the first call of each user turn forced
    assert example.bfcl_accuracy.fn(state) == 1.0 and example.turns_right.fn(state) == 1.0
    broken = ScriptedModel([*mt.ground_truth_calls(case)[:1], [], *mt.ground_truth_calls(case)[2:]])
    state = example.build_graph(broken).invoke(scenario["input"])
    assert example.bfcl_accuracy.fn(state) == 0.0 and example.turns_right.fn(state) == 0.25
