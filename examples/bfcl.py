"""The Berkeley Function Calling Leaderboard (BFCL v4) offline: its questions and answers, its functions as OpenAI
tools, and its AST checker's rules for one call, reimplemented.

The data comes out of the PyPI wheel ``bfcl-eval`` (``langgraph_art.cache.wheel_files``: downloaded once with ``pip
download --no-deps``, never installed: its dependency tree pins numpy and a dozen provider SDKs, and its checker
imports every model handler). The rules below are the ones its ``ast_checker.py`` applies to Python functions
(``simple_function_checker``): the function's name; every required parameter present; no parameter the function or
the answer does not know; each value of the documented type (an int is accepted for a float; a value of the
answer's type counts as a variable); strings compared after removing spaces and ``,./-_*^`` and lower-casing, lists
element-wise likewise, dicts key by key; and every parameter left out must be one the answer marks optional
(``""`` among its allowed values).

Names: OpenAI tool names may not contain dots, so ``math.factorial`` is offered as ``math_factorial`` and mapped
back (what BFCL's ``underscore_to_dot`` does for OpenAI models).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

WHEEL = "bfcl-eval==2026.3.23"
_DATA = "bfcl_eval/data"
TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list, "dict": dict}
JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


@dataclass(frozen=True)
class Case:
    """One BFCL case: its id, the conversation (turns of messages), the functions offered and the ground truth
    (one ``{function name: {parameter: [allowed values]}}`` per expected call)."""

    id: str
    question: list[list[dict[str, Any]]]
    functions: list[dict[str, Any]]
    answers: list[dict[str, dict[str, list[Any]]]]

    @property
    def number(self) -> int:
        return int(self.id.rsplit("_", 1)[1])


@cache
def data_folder() -> Path:
    from langgraph_art.cache import wheel_files

    return wheel_files(WHEEL, f"{_DATA}/*") / _DATA


def load(category: str = "simple_python") -> list[Case]:
    """Every case of a BFCL v4 category that has a possible answer (``simple_python``: 400)."""
    folder = data_folder()
    questions = _lines(folder / f"BFCL_v4_{category}.json")
    answers = {
        row["id"]: row["ground_truth"] for row in _lines(folder / "possible_answer" / f"BFCL_v4_{category}.json")
    }
    return [Case(q["id"], q["question"], q["function"], answers[q["id"]]) for q in questions if q["id"] in answers]


def split(cases: list[Case], every: int = 5) -> tuple[list[Case], list[Case]]:
    """A fixed train / held-out split by id: every ``every``-th case (by its number) is held out."""
    held = [c for c in cases if c.number % every == 0]
    return [c for c in cases if c.number % every], held


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- functions as OpenAI tools ------------------------------------------------------------------------------------
def tool_name(name: str) -> str:
    return name.replace(".", "_")


def json_schema(parameter: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema: ``dict`` -> object, ``float`` -> number, ``tuple`` -> array,
    ``any`` -> no type; nested properties and items alike. BFCL's own keys beside JSON Schema's (``optional``) go."""
    out: dict[str, Any] = {}
    for key, value in parameter.items():
        if key == "type":
            mapped = JSON_TYPES.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: json_schema(spec) for name, spec in value.items()}
        elif key == "items" and isinstance(value, dict):
            out["items"] = json_schema(value)
        elif key in ("description", "enum", "required", "default", "format", "maximum", "minimum"):
            out[key] = value
    if out.get("type") == "object" and "properties" not in out:
        out["additionalProperties"] = True  # a free-form dict: the grammar must not close it
    return out


def tools(case: Case) -> list[dict[str, Any]]:
    """The case's functions as OpenAI tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool_name(f["name"]),
                "description": f.get("description", ""),
                "parameters": json_schema(f["parameters"]),
            },
        }
        for f in case.functions
    ]


# -- BFCL's checker for one Python call ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """How one call fared: ``valid`` when BFCL would count it right; ``right`` of ``total`` parameter checks passed
    (partial credit for training); ``error`` says the first thing that was wrong."""

    valid: bool
    right: int
    total: int
    error: str = ""

    @property
    def share(self) -> float:
        return self.right / self.total if self.total else float(self.valid)


def standardize(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def optional_parameters(functions: list[dict[str, Any]], answer: dict[str, dict[str, list[Any]]]) -> set[str]:
    """The parameters of ``answer``'s call (``{name: {parameter: allowed values}}``) that ``check_call`` lets a call
    leave out: "" among the allowed values, and not required by the function."""
    name, allowed = next(iter(answer.items()))
    (function,) = (f for f in functions if f["name"] == name)
    required = function["parameters"].get("required", [])
    return {param for param, values in allowed.items() if "" in values and param not in required}


def check_call(case: Case, name: str, arguments: dict[str, Any]) -> Check:
    """BFCL's ``simple_function_checker`` for one call ``name(**arguments)`` (``name`` as offered: dots as ``_``)
    against the case's first expected call; ``right``/``total`` count its parameter checks."""
    (expected_name, allowed), description = next(iter(case.answers[0].items())), case.functions[0]
    if name != tool_name(expected_name):
        return Check(False, 0, 1 + len(allowed), f"called {name!r}, expected {tool_name(expected_name)!r}")
    details = description["parameters"].get("properties", {})
    required = description["parameters"].get("required", [])
    names = list(dict.fromkeys([*allowed, *required, *arguments]))
    errors = [error for param in names if (error := _check_parameter(param, arguments, allowed, details, required))]
    right = 1 + len(names) - len(errors)  # the name, then each parameter either side knows
    return Check(not errors, right, 1 + len(names), errors[0] if errors else "")


def _check_parameter(
    param: str, arguments: dict[str, Any], allowed: dict[str, list[Any]], details: dict[str, Any], required: list[str]
) -> str:
    if param not in arguments:
        if param in required:
            return f"missing required parameter {param!r}"
        if "" not in allowed.get(param, [""]):
            return f"optional parameter {param!r} left out, but the answer sets it"
        return ""
    if param not in details or param not in allowed:
        return f"unexpected parameter {param!r}"
    value, kind, answers = arguments[param], details[param].get("type", "any"), allowed[param]
    if kind == "float" and type(value) is int:
        value = float(value)
    expected = TYPES.get(kind, str)
    nested = TYPES.get(details[param].get("items", {}).get("type", "")) if kind in ("array", "tuple") else None
    variable = _answer_type(answers) not in (None, expected)
    if type(value) is not expected:
        if type(value) is _answer_type(answers):
            variable = True
        else:
            return f"{param!r} has type {type(value).__name__}, expected {kind}"
    elif nested is not None and not _nested_ok(value, answers, nested):
        return f"{param!r} holds items of the wrong type (expected {details[param]['items']['type']})"
    if not variable:
        if expected is dict:
            return "" if _dict_ok(value, answers) else f"{param!r}={value!r} is none of {answers}"
        if expected is list and nested is dict:
            return "" if _list_of_dicts_ok(value, answers) else f"{param!r}={value!r} is none of {answers}"
        if expected is str:
            ok = standardize(value) in [standardize(a) for a in answers if isinstance(a, str)]
            return "" if ok else f"{param!r}={value!r} is none of {answers}"
        if expected is list:
            ok = _standard_list(value) in [_standard_list(a) for a in answers if isinstance(a, list)]
            return "" if ok else f"{param!r}={value!r} is none of {answers}"
    return "" if value in answers else f"{param!r}={value!r} is none of {answers}"


def _answer_type(answers: list[Any]) -> type | None:
    return next((type(a) for a in answers if a != ""), None)


def _nested_ok(value: list[Any], answers: list[Any], nested: type) -> bool:
    """BFCL checks one level of nesting: each item of the value has the item type, where the answer is a list."""
    lists = [answer for answer in answers if isinstance(answer, list)]  # "" marks "may be left out", not a type
    return not lists or any(all(type(item) in (nested, _answer_type(a)) for item in value) for a in lists)


def _standard_list(items: list[Any]) -> list[Any]:
    return [standardize(item) if isinstance(item, str) else item for item in items]


def _dict_ok(value: dict[str, Any], answers: list[Any]) -> bool:
    for answer in answers:
        if answer == "" or not isinstance(answer, dict):
            continue
        if all(
            key in answer and (standardize(v) if isinstance(v, str) else v) in _standard_list(answer[key])
            for key, v in value.items()
        ) and all(key in value or "" in options for key, options in answer.items()):
            return True
    return False


def _list_of_dicts_ok(value: list[Any], answers: list[Any]) -> bool:
    return any(
        isinstance(answer, list)
        and len(answer) == len(value)
        and all(isinstance(v, dict) and _dict_ok(v, [a]) for v, a in zip(value, answer, strict=True))
        for answer in answers
    )
