"""A multi-turn tool agent on BFCL's ``multi_turn_base``: SmolLM2-135M-Instruct against its executable environments.

The graph is a tool loop over a conversation: ``setup`` loads the case's environments (a file system, a trading
bot, travel booking, ...: ``examples/bfcl_multi_turn.py``) into the run's state and puts the first user turn;
``agent`` is ChatART bound to the case's functions (3k-8k tokens of documentation), its first call of each user turn
forced (``tool_choice="required"``: every checked turn needs a call, and the 135M model rarely calls on its own),
later ones free (``"auto"``), at most ``--max-calls`` a turn; ``tools`` runs the calls on the environments and
answers with their results; ``next_turn`` puts the next user turn. Reward: the share of BFCL's checked turns that
pass (state and response checks, up to the first failure); evaluation: BFCL's accuracy, 1 when every turn passes.
The 200 cases are split by id (every fifth held out); a case whose documentation alone does not fit the model's
context is left out and counted.

    python examples/multi_turn.py --steps 0 --eval-cases 10     # the untrained model, measured (benchmarks/README.md)
    python examples/multi_turn.py --steps 10                    # GRPO on the training cases
"""

from __future__ import annotations

import random
from typing import Annotated, Any, TypedDict

import bfcl_multi_turn as mt
from harness import THREADS_OPTION, grpo_config, parse_args, report, trainable_model, use_threads
from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import langgraph_art as art
from langgraph_art.rewards.render import render_transcript

CONTEXT = 8192  # SmolLM2's


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    case: dict[str, Any]  # the scenario's case, as JSON
    envs: Any  # the live environments of this run (Python objects; captured as their repr)
    turn: int
    calls_this_turn: int
    calls: list[list[list[Any]]]  # per user turn: [name, arguments] of each call made


def to_case(data: dict[str, Any]) -> mt.MultiTurnCase:
    return mt.MultiTurnCase(**data)


def build_graph(llm: art.ChatART, max_calls: int = 4) -> Any:
    def setup(state: State) -> dict[str, Any]:
        case = to_case(state["case"])
        return {"envs": mt.environments(case), "turn": 0, "calls_this_turn": 0, "calls": [[]],
                "messages": list(case.turns[0])}  # fmt: skip

    def agent(state: State) -> dict[str, Any]:
        tools = mt.tools(to_case(state["case"]))
        choice = "required" if state["calls_this_turn"] == 0 else "auto"
        reply = llm.bind_tools(tools, tool_choice=choice, parallel_tool_calls=False).invoke(state["messages"])
        return {"messages": [reply], "calls_this_turn": state["calls_this_turn"] + 1}

    def run_tools(state: State) -> dict[str, Any]:
        calls = [list(turn) for turn in state["calls"]]
        answers = []
        for call in state["messages"][-1].tool_calls:
            name = call["name"]
            arguments = call["args"] if isinstance(call["args"], dict) else {}
            calls[-1].append([name, arguments])
            answers.append(ToolMessage(mt.execute(state["envs"], name, arguments), tool_call_id=call["id"]))
        return {"messages": answers, "calls": calls}

    def next_turn(state: State) -> dict[str, Any]:
        turn = state["turn"] + 1
        asked = [HumanMessage(m["content"]) for m in state["case"]["turns"][turn]]
        return {"turn": turn, "calls_this_turn": 0, "calls": [*state["calls"], []], "messages": asked}

    def route(state: State) -> str:
        if getattr(state["messages"][-1], "tool_calls", None) and state["calls_this_turn"] < max_calls:
            return "tools"
        return "next_turn" if state["turn"] + 1 < len(state["case"]["turns"]) else END

    graph = StateGraph(State)
    graph.add_node("setup", setup)
    graph.add_node("agent", agent)
    graph.add_node("tools", run_tools)
    graph.add_node("next_turn", next_turn)
    graph.add_edge(START, "setup")
    graph.add_edge("setup", "agent")
    graph.add_conditional_edges("agent", route, ["tools", "next_turn", END])
    graph.add_edge("tools", "agent")
    graph.add_edge("next_turn", "agent")
    return graph.compile()


def verdict(state: dict[str, Any]) -> mt.Verdict:
    calls = [[(name, args) for name, args in turn] for turn in state.get("calls", [])]
    return mt.check_conversation(to_case(state["case"]), calls)


@art.reward
def turns_right(state) -> float:
    """Partial credit: the share of checked turns that pass, up to the first that fails."""
    return verdict(state).share


@art.reward
def bfcl_accuracy(state) -> float:
    """BFCL's accuracy: 1 when every turn passes."""
    return float(verdict(state).valid)


@art.reward(name="turns_right", weight=0.0)
def turns_right_shown(state) -> float:
    """The partial credit beside the accuracy in evaluations (logged as eval/reward/turns_right, not added)."""
    return verdict(state).share


def fits(case: mt.MultiTurnCase, tokenizer: Any, room: int) -> bool:
    """The case's tool documentation and its first turn, rendered, leave ``room`` tokens of context."""
    prompt = tokenizer.apply_chat_template(list(case.turns[0]), tools=mt.tools(case), tokenize=True,
                                           add_generation_prompt=True)  # fmt: skip
    ids = prompt["input_ids"] if isinstance(prompt, dict) else prompt
    return len(ids) + room <= CONTEXT


def scenarios(cases: list[mt.MultiTurnCase]) -> list[dict[str, Any]]:
    return [{"id": c.id, "input": {"case": {k: getattr(c, k) for k in mt.MultiTurnCase.__dataclass_fields__}}}
            for c in cases]  # fmt: skip


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(
        __doc__ or "",
        argv,
        steps=10,
        warmup_steps=0,
        base_model="smollm2-135m",
        learning_rate=2e-4,
        temperature=0.7,
        num_generations=4,
        scenarios_per_step=1,
        max_tokens=128,
        options=[
            ("--eval-cases", {"type": int, "default": 10, "help": "held-out cases evaluated (of those that fit)"}),
            ("--eval-every", {"type": int, "default": 10, "help": "steps between held-out evaluations"}),
            ("--max-calls", {"type": int, "default": 4, "help": "model calls per user turn"}),
            THREADS_OPTION,
        ],
    )
    from transformers import AutoTokenizer

    from langgraph_art.models.loading import resolve_model

    use_threads(args)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.base_model))
    room = args.max_tokens * 4 * args.max_calls  # what a conversation adds: calls, results, later turns
    cases = mt.load()
    usable = [c for c in cases if fits(c, tokenizer, room)]
    train = [c for c in usable if c.number % 5]
    held_out = [c for c in usable if c.number % 5 == 0]
    evaluated = min(args.eval_cases, len(held_out))
    echo(f"{len(usable)} of {len(cases)} cases fit {CONTEXT} tokens with {room} to spare: "
         f"{len(train)} to train on, {len(held_out)} held out (evaluated: {evaluated})")  # fmt: skip
    random.Random(args.seed).shuffle(train)
    with trainable_model(args, f"bfcl-multi-turn-{args.seed}", "examples") as (model, llm):
        if args.steps == 0:  # the untrained model only
            graph, held = build_graph(llm, args.max_calls), scenarios(held_out[: args.eval_cases])
            result = art.evaluate(graph, held, [bfcl_accuracy, turns_right_shown], max_concurrency=16)
            m = result.metrics
            runs = f"{m['eval/runs']:.0f} runs, {m['eval/runs/failed']:.0f} failed, {m['eval/time_s']:.0f} s"
            echo(f"untrained: accuracy {m['eval/reward/mean']:.3f}, "
                 f"turns right {m['eval/reward/turns_right']:.3f} ({runs})")  # fmt: skip
            for group in result.groups[:1]:
                run = group.trajectories[0]
                echo(f"a held-out conversation (reward {run.reward or 0:.2f}):\n{render_transcript(run)}")
            return {"evals": [m], "curve": [], "run_dir": None, "last_run": None}
        trainer = art.Trainer(
            build_graph(llm, args.max_calls),
            model,
            rewards=[turns_right],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args, max_length=CONTEXT),  # whole conversations: 4-6k tokens, not cut at 4096
            eval_scenarios=scenarios(held_out[: args.eval_cases]),
            eval_rewards=[bfcl_accuracy, turns_right_shown],
            eval_generations=1,
            eval_every=args.eval_every,
            max_concurrency=16,
        )
        history = trainer.train(scenarios(train), steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a held-out conversation")
    for e in trainer.evals:
        echo(f"eval after step {e['iteration']:>3}: turns right {e['eval/reward/turns_right']:.3f}")
    return summary


if __name__ == "__main__":
    main()
