"""BFCL's multi-turn category (``multi_turn_base``) offline: its executable environments and its checker.

Each case is a conversation of 1-7 user turns against stateful Python environments (a file system, a trading bot,
travel booking, vehicle control, a ticket system, messaging, posting, a math API) with 3k-8k tokens of tool
documentation; the ground truth is the calls that serve each turn. The environments' source comes out of the
``bfcl-eval`` wheel (``bfcl_eval/eval_checker/multi_turn_eval/func_source_code``, standard library only for these
eight classes) and is imported under its own package name without the package's ``__init__`` files (which import
its whole dependency tree).

The checker follows BFCL's ``multi_turn_checker``: the model's calls and the ground truth's are executed turn by
turn on two fresh copies of the environments; after each turn whose ground truth is not empty, the model must have
called something in it, every environment must be in the same state (the public attributes compared), and every
result the ground truth's calls returned in that turn must be among the results of the model's calls so far
(unordered). A case is right when every turn passes. Calls run as methods of the environments (BFCL ``eval``s call
strings; here a tool call is ``getattr(instance, name)(**args)`` and a ground-truth string is parsed with ``ast``),
and results become text as BFCL's do.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bfcl

_CODE = "bfcl_eval/eval_checker/multi_turn_eval/func_source_code"
PACKAGE = _CODE.replace("/", ".")
MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = {"MathAPI"}


@dataclass(frozen=True)
class MultiTurnCase:
    """One ``multi_turn_base`` case: user turns, the environments' starting state, the functions offered and the
    ground truth (a list of call strings per turn)."""

    id: str
    turns: list[list[dict[str, Any]]]
    initial_config: dict[str, Any]
    classes: list[str]
    functions: list[dict[str, Any]]
    answers: list[list[str]]

    @property
    def number(self) -> int:
        return int(self.id.rsplit("_", 1)[1])


def load(category: str = "multi_turn_base") -> list[MultiTurnCase]:
    """Every case of a multi-turn category with its functions (the involved classes' docs, less any excluded)."""
    folder = bfcl.data_folder()
    answers = {
        row["id"]: row["ground_truth"] for row in _lines(folder / "possible_answer" / f"BFCL_v4_{category}.json")
    }
    docs = {
        path.stem: _lines(path) for path in (folder / "multi_turn_func_doc").glob("*.json")
    }  # gorilla_file_system -> [function docs]
    cases = []
    for row in _lines(folder / f"BFCL_v4_{category}.json"):
        excluded = set(row.get("excluded_function", []))
        functions = [f for c in row["involved_classes"] for f in docs[MODULES[c]] if f["name"] not in excluded]
        cases.append(
            MultiTurnCase(
                row["id"],
                row["question"],
                row["initial_config"],
                row["involved_classes"],
                functions,
                answers[row["id"]],
            )
        )
    return cases


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tools(case: MultiTurnCase) -> list[dict[str, Any]]:
    return bfcl.tools(bfcl.Case(case.id, [], case.functions, []))


# -- the environments ---------------------------------------------------------------------------------------------
def _import_environments() -> None:
    """Make ``bfcl_eval.eval_checker.multi_turn_eval.func_source_code`` importable from the unpacked wheel, with
    empty parent packages (the real ``__init__`` files import the leaderboard's dependencies)."""
    if PACKAGE in sys.modules:
        return
    from langgraph_art.cache import wheel_files

    root = wheel_files(bfcl.WHEEL, f"{_CODE}/*")
    parts = PACKAGE.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(root.joinpath(*parts[:depth]))]
            sys.modules[name] = module


def environments(case: MultiTurnCase) -> dict[str, Any]:
    """Fresh instances of the case's classes, loaded with its starting state."""
    _import_environments()
    made = {}
    for name in case.classes:
        instance = getattr(importlib.import_module(f"{PACKAGE}.{MODULES[name]}"), name)()
        if name not in STATELESS:
            instance._load_scenario(copy.deepcopy(case.initial_config.get(name, {})), long_context=False)
        made[name] = instance
    return made


def execute(envs: dict[str, Any], name: str, args: dict[str, Any] | list[Any], *positional: Any) -> str:
    """One call on the environments, its result as BFCL writes it: text as is, a dict as JSON, anything else with
    ``str``; an exception (or a function no environment has) as ``Error during execution: ...``."""
    method = next((getattr(e, name) for e in envs.values() if not name.startswith("_") and hasattr(e, name)), None)
    try:
        if method is None or not callable(method):
            raise AttributeError(f"no function {name!r}")
        result = method(*positional, **args) if isinstance(args, dict) else method(*args)
    except Exception as error:  # noqa: BLE001 - the environment's error is the tool's answer, as in BFCL
        return f"Error during execution: {error}"
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """A ground-truth call string, ``mv(source='a.pdf', destination='temp')``: name, positional and keyword values."""
    call = ast.parse(text.strip(), mode="eval").body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ValueError(f"not a call: {text!r}")
    return (
        call.func.id,
        [ast.literal_eval(a) for a in call.args],
        {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None},
    )


def ground_truth_calls(case: MultiTurnCase) -> list[list[tuple[str, dict[str, Any]]]]:
    """The ground truth as tool calls (positional values bound to their parameter names)."""
    envs = environments(case)
    turns = []
    for answer in case.answers:
        calls = []
        for text in answer:
            name, positional, keywords = parse_call(text)
            method = next(getattr(e, name) for e in envs.values() if hasattr(e, name))
            calls.append((name, dict(inspect.signature(method).bind(*positional, **keywords).arguments)))
        turns.append(calls)
    return turns


# -- BFCL's checker -----------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """How a conversation fared: ``turns_right`` of ``turns`` (checked turns passed, up to the first failure),
    ``valid`` when every turn passed, ``error`` for the first failure."""

    turns: int
    turns_right: int = 0
    error: str = ""
    results: list[list[str]] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.error

    @property
    def share(self) -> float:
        return self.turns_right / self.turns if self.turns else float(self.valid)


def check_conversation(case: MultiTurnCase, calls: list[list[tuple[str, dict[str, Any]]]]) -> Verdict:
    """BFCL's multi-turn check of the calls the model made in each turn (``calls[t]``: (name, arguments) in order)."""
    model_envs, truth_envs = environments(case), environments(case)
    checked = sum(1 for answer in case.answers if answer)
    verdict = Verdict(turns=checked)
    so_far: list[str] = []
    for turn, answer in enumerate(case.answers):
        made = calls[turn] if turn < len(calls) else []
        results = [execute(model_envs, name, args) for name, args in made]
        so_far.extend(results)
        verdict.results.append(results)
        expected = []
        for text in answer:
            name, positional, keywords = parse_call(text)
            expected.append(execute(truth_envs, name, keywords, *positional))
        if not answer:
            continue  # BFCL: a turn the ground truth leaves empty is checked for irrelevance elsewhere
        if not made:
            verdict.error = f"turn {turn}: no call"
            return verdict
        for class_name, truth in truth_envs.items():
            differences = [
                k for k, v in vars(truth).items() if not k.startswith("_") and getattr(model_envs[class_name], k) != v
            ]
            if differences:
                verdict.error = f"turn {turn}: {class_name} differs in {', '.join(differences)}"
                return verdict
        missing = _missing(expected, so_far)
        if missing:
            verdict.error = f"turn {turn}: results missing: {missing[:2]}"
            return verdict
        verdict.turns_right += 1
    return verdict


def _missing(expected: list[str], got: list[str]) -> list[str]:
    """The expected results that ``got`` lacks, each matched at most once (BFCL's unordered subsequence)."""
    pool = list(got)
    missing = []
    for item in expected:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing
