"""A real model learns a public benchmark: SmolLM2-135M-Instruct on BFCL's ``simple_python`` function calls.

The graph is one LangGraph node, ``agent``, whose LLM is ChatART bound to the case's function with
``tool_choice="required"`` (one call): the service decodes the call under the function's JSON schema, so every
answer is a well-formed call, and what the model has to get right are the arguments. The 400 cases are split once
by id (every fifth held out: 320 to train on, 80 held out). Reward while training: the share of BFCL's checks the call
passes (its name, then each parameter: present when required, left out when the answer allows it, of the right
type, among the allowed values); evaluation: BFCL's accuracy, 1 when every check passes (``examples/bfcl.py``
reimplements its AST checker's rules). The model is SmolLM2-135M-Instruct, offline from PyPI (``smollm2-135m``).

    python examples/function_calling.py                      # defaults: the numbers in benchmarks/README.md
    python examples/function_calling.py --steps 2 --eval-cases 8    # a quick look
    python examples/function_calling.py --teacher base              # distilled from the base model told the answer

``--teacher base`` (or ``policy``, or a served model's name) adds on-policy distillation (docs/guides/distillation.md):
the teacher is shown the case's reference call with its required arguments (``required_hint``; ``--hint call``: the
whole call, optional arguments too, ``answer_hint``) and scores each token the student sampled; the reverse KL to it
is a per-token advantage beside the reward's, weighted by ``--kl-coef``. ``--dynamic-sampling N`` samples up to N
further cases a step in place of groups whose runs all scored the same. Measured on 3 seeds over 10 steps
(benchmarks/README.md, issue 37): shown the whole call the teacher did not help (+0.02; a fifth of its signal
penalised calls BFCL scores right, calls that leave an optional argument out among them); shown the required
arguments, +0.11 (+0.09 .. +0.15), level with GRPO, not faster; dynamic sampling was about level per sampled token.
"""

from __future__ import annotations

import json
import random
from typing import Annotated, Any, TypedDict

import bfcl
from harness import (
    TEACHER_OPTIONS,
    THREADS_OPTION,
    grpo_config,
    parse_args,
    report,
    teacher_from,
    trainable_model,
    use_threads,
)
from langchain_core.messages import AnyMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

import langgraph_art as art
from langgraph_art.teacher import hint_question


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    tools: list[dict[str, Any]]


def build_graph(llm: art.ChatART) -> Any:
    """One node: the case's tools bound, one call forced."""

    def agent(state: State) -> dict[str, Any]:
        bound = llm.bind_tools(state["tools"], tool_choice="required", parallel_tool_calls=False)
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    return graph.compile()


def scenarios(cases: list[bfcl.Case]) -> list[dict[str, Any]]:
    """A scenario per case (plain JSON: the case's functions and answers ride along for the rewards)."""
    return [
        {
            "id": case.id,
            "functions": case.functions,
            "answers": case.answers,
            "input": {"messages": case.question[0], "tools": bfcl.tools(case)},
        }
        for case in cases
    ]


def check(state: dict[str, Any], scenario: dict[str, Any]) -> bfcl.Check:
    """BFCL's verdict on the run's call (no call, or arguments that are not a JSON object: nothing right)."""
    calls = getattr(state["messages"][-1], "tool_calls", None) or []
    case = bfcl.Case(scenario["id"], [], scenario["functions"], scenario["answers"])
    if len(calls) != 1 or not isinstance(calls[0].get("args"), dict):
        return bfcl.Check(False, 0, 1, f"{len(calls)} calls")
    return bfcl.check_call(case, calls[0]["name"], calls[0]["args"])


def reference_call(scenario: dict[str, Any], *, optional: bool = True) -> str:
    """The case's first reference answer as the JSON call the schema decodes: each parameter's first allowed value
    (a parameter whose only allowed value is "" may be left out, and is; with ``optional=False`` every parameter
    BFCL's checker lets the call leave out is left out: ``bfcl.optional_parameters``)."""
    (name, parameters), *_ = scenario["answers"][0].items()
    leave_out = set() if optional else bfcl.optional_parameters(scenario["functions"], scenario["answers"][0])
    arguments = {
        key: next(v for v in values if v != "")
        for key, values in parameters.items()
        if any(v != "" for v in values) and key not in leave_out
    }
    return f"{bfcl.tool_name(name)}({json.dumps(arguments)})"


def answer_hint(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A privileged prompt for the teacher (``art.Teacher(prompt=answer_hint)``): the question, followed by the call
    that answers it."""
    return hint_question(messages, f" (The call: {reference_call(scenario)}.)")


def required_hint(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``answer_hint`` with only the arguments the answer requires: BFCL accepts an optional argument left out, so a
    teacher shown the reference's optional values would penalise the calls that leave them out and score right."""
    return hint_question(messages, f" (The call: {reference_call(scenario, optional=False)}.)")


@art.reward
def arguments_right(state, scenario) -> float:
    """Partial credit: the share of BFCL's checks the call passes."""
    return check(state, scenario).share


@art.reward
def bfcl_accuracy(state, scenario) -> float:
    """BFCL's accuracy: 1 when the call passes every check."""
    return float(check(state, scenario).valid)


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(
        __doc__ or "",
        argv,
        steps=30,
        warmup_steps=0,
        base_model="smollm2-135m",
        learning_rate=2e-4,
        temperature=0.7,
        num_generations=8,
        scenarios_per_step=4,
        max_tokens=96,
        options=[
            ("--eval-cases", {"type": int, "default": 80, "help": "held-out cases evaluated (of 80)"}),
            ("--eval-every", {"type": int, "default": 10, "help": "steps between held-out evaluations"}),
            *TEACHER_OPTIONS,
            (
                "--hint",
                {
                    "choices": ["call", "required"],
                    "default": "required",
                    "help": "what the teacher is shown: the reference call's required arguments, or the whole call",
                },
            ),
            ("--dynamic-sampling", {"type": int, "default": 0, "help": "further cases a step for uniform groups"}),
            THREADS_OPTION,
        ],
    )
    use_threads(args)
    train, held_out = bfcl.split(bfcl.load("simple_python"))
    random.Random(args.seed).shuffle(train)  # each seed its own order of the training cases
    teacher = teacher_from(args, answer_hint if args.hint == "call" else required_hint)
    with trainable_model(args, f"bfcl-simple-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[arguments_right],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args),
            eval_scenarios=scenarios(held_out[: args.eval_cases]),
            eval_rewards=[bfcl_accuracy],
            eval_generations=1,
            eval_every=args.eval_every,
            max_concurrency=64,
            teacher=teacher,
            dynamic_sampling=args.dynamic_sampling,
        )
        history = trainer.train(scenarios(train), steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a held-out case")
    if summary["last_run"] is not None:
        call = summary["last_run"].turns()[-1].output.get("tool_calls") or []
        echo(json.dumps([c["function"] for c in call]))
    return summary


if __name__ == "__main__":
    main()
