"""When to call a tool: LangChain's ``create_agent`` under ``tool_choice="auto"`` learns which questions need its tool.

The agent has one tool, ``check_stock(item)``, over a warehouse's private stock list. Half of the questions ask how
many of an item are in stock (only the tool knows); the other half are general questions the model answers on its
own ("What is the capital of France?"), where the tool knows nothing. The model decides each turn: call the tool, or
answer. Rewards: ``right_answer`` (the final answer holds the expected word or number) and ``wasted_call`` (-0.25 for
each call the tool could not answer). Held out: questions on other items and other general questions.

The untrained SmolLM2-135M answers every question in prose, never calling, even with two worked examples at the
start of the conversation (a stock question answered with a call, a general one answered directly), so GRPO alone
has nothing to compare. The bootstrap is a short SFT warm-up, 3 steps on 8 demonstrations: enough for the model to
call on some stock questions, not enough to have learnt when (8 steps would: measured, it then calls on every stock
question and none of the others, and GRPO has nothing left to teach). The example evaluates three times and prints
each: untrained, after the warm-up, after GRPO; the rates of calling on each kind of question are what to read.

    python examples/when_to_call.py                # SmolLM2-135M, offline; seeds and numbers: benchmarks/README.md
"""

from __future__ import annotations

import json
import random
from typing import Any

from harness import (
    THREADS_OPTION,
    eval_runs,
    held_out_trainer,
    parse_args,
    report,
    trainable_model,
    use_threads,
    warm_up,
)
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

import langgraph_art as art
from langgraph_art.evaluation import evaluate

SYSTEM = (
    "You are a warehouse assistant. Only the check_stock tool knows how many of an item are in stock: call it for "
    "stock questions. Answer other questions directly, without a tool."
)
ITEMS = ["bolts", "hinges", "pulleys", "gaskets", "rivets", "washers", "springs", "brackets", "valves", "sprockets",
         "clamps", "pistons", "levers", "nozzles", "axles", "couplings"]  # fmt: skip
GENERAL = [  # questions SmolLM2-135M answers right on its own most of the time, with the word that must appear
    ("What is the capital of France?", "paris"),
    ("What is the capital of Japan?", "tokyo"),
    ("What is the capital of Italy?", "rome"),
    ("What is the capital of Germany?", "berlin"),
    ("What is the capital of England?", "london"),
    ("What is the capital of Spain?", "madrid"),
    ("What color is the sky on a clear day?", "blue"),
    ("What color is grass?", "green"),
    ("How many days are in a week?", "seven|7"),
    ("How many legs does a spider have?", "eight|8"),
    ("What is the opposite of hot?", "cold"),
    ("What do bees make?", "honey"),
    ("What is frozen water called?", "ice"),
    ("Which animal barks?", "dog"),
    ("What is the largest ocean on Earth?", "pacific"),
    ("How many hours are in a day?", "24|twenty-four"),
]


def make_questions(seed: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The stock list and the questions (a stock question per item, the general ones), shuffled by ``seed``."""
    rng = random.Random(seed)
    stock = {item: rng.randrange(11, 99) for item in ITEMS}
    stock_questions = [{"id": f"stock-{item}", "question": f"How many {item} are in stock?", "expected": str(n),
                        "needs_tool": True} for item, n in stock.items()]  # fmt: skip
    general = [{"id": f"general-{i}", "question": q, "expected": a, "needs_tool": False}
               for i, (q, a) in enumerate(GENERAL)]  # fmt: skip
    rng.shuffle(stock_questions)
    rng.shuffle(general)
    return stock, [q for pair in zip(stock_questions, general, strict=True) for q in pair]


def stock_tool(stock: dict[str, int]) -> Any:
    @tool
    def check_stock(item: str) -> str:
        """How many of an item are in stock (items such as bolts, hinges)."""
        key = item.strip().lower()
        key = key if key in stock else key + "s"
        if key not in stock:
            return f"No item called {item!r} in the stock list."
        return f"{stock[key]} {key} in stock."

    return check_stock


def worked_examples(check_stock: Any, stock_item: str, general: tuple[str, str]) -> list[Any]:
    """Two solved questions at the start of every conversation: one with a call, one answered directly."""
    result = check_stock.invoke({"item": stock_item})
    count = result.split()[0]
    return [
        HumanMessage(f"How many {stock_item} are in stock?"),
        AIMessage("", tool_calls=[{"id": "example_0", "name": "check_stock", "args": {"item": stock_item}}]),
        ToolMessage(result, tool_call_id="example_0"),
        AIMessage(f"There are {count} {stock_item} in stock."),
        HumanMessage(general[0]),
        AIMessage(f"The answer is {general[1].split('|')[0].capitalize()}."),
    ]


def demonstrations(questions: list[dict[str, Any]], check_stock: Any, examples: list[Any]) -> list[dict[str, Any]]:
    """SFT conversations for the warm-up: each question answered as it should be (a stock question with a call and
    the count, a general one directly), after the same system prompt and worked examples as the runs."""
    from langchain_core.messages import SystemMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai.chat_models.base import _convert_message_to_dict

    conversations = []
    for q in questions:
        if q["needs_tool"]:
            item = q["question"].split()[2]
            reply = worked_examples(check_stock, item, ("", "x"))[1:4]  # the call, its result, the answer
        else:
            reply = [AIMessage(f"The answer is {q['expected'].split('|')[0].capitalize()}.")]
        messages = [SystemMessage(SYSTEM), *examples, HumanMessage(q["question"]), *reply]
        conversations.append({"tools": [convert_to_openai_tool(check_stock)],
                              "messages": [_convert_message_to_dict(m) for m in messages]})  # fmt: skip
    return conversations


def scenarios(questions: list[dict[str, Any]], examples: list[Any]) -> list[dict[str, Any]]:
    return [{**q, "input": {"messages": [*examples, HumanMessage(q["question"])]}} for q in questions]


def after_question(state: Any) -> list[Any]:
    messages = state["messages"]
    last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    return messages[last + 1 :]


def calls(state: Any) -> list[dict[str, Any]]:
    return [c for m in after_question(state) for c in getattr(m, "tool_calls", None) or []]


def final_text(state: Any) -> str:
    last = state["messages"][-1]
    return str(last.content) if isinstance(last, AIMessage) and not last.tool_calls else ""


@art.reward
def right_answer(state, scenario) -> float:
    """1 when the final answer holds the expected word or number."""
    text = final_text(state).lower()
    return float(any(word in text for word in scenario["expected"].split("|")))


@art.reward(weight=0.25)
def wasted_call(state) -> float:
    """-1 per call the tool could not answer (the tool's result says so)."""
    results = [m for m in after_question(state) if isinstance(m, ToolMessage)]
    return -float(sum(str(m.content).startswith("No item") for m in results))


@art.reward(weight=0)
def called(state) -> float:
    """1 when the run called the tool (weight 0: reported, not rewarded)."""
    return float(bool(calls(state)))


EVAL_REWARDS = [right_answer, called]


def rates(runs: list[Any], step: int) -> dict[str, float]:
    """The share of ``runs`` answered right, and per kind of question the share that called the tool and the share
    answered right."""
    row: dict[str, float] = {"step": step, "runs": len(runs)}
    row["right"] = sum(r.rewards.get("right_answer", 0) for r in runs) / max(len(runs), 1)
    for prefix, label in (("stock-", "needs_tool"), ("general-", "no_tool")):
        kind = [r for r in runs if str(r.metadata.get("scenario_id", "")).startswith(prefix)]
        row[f"called_{label}"] = sum(r.rewards.get("called", 0) for r in kind) / max(len(kind), 1)
        row[f"right_{label}"] = sum(r.rewards.get("right_answer", 0) for r in kind) / max(len(kind), 1)
    return row


def call_rates(trainer: art.Trainer) -> list[dict[str, float]]:
    """``rates`` of each of the trainer's evaluations (the first: after the warm-up, before any GRPO step)."""
    return [rates(eval_runs(trainer, e), e["iteration"])
            for e in trainer.evals]  # fmt: skip


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    held_out_option = ("--held-out", {"type": int, "default": 8, "help": "questions held out (half of each kind)"})
    eval_every_option = ("--eval-every", {"type": int, "default": None, "help": "steps between held-out evaluations"})
    demonstrations_option = ("--demonstrations", {"type": int, "default": 8, "help": "SFT warm-up conversations"})
    eval_generations_option = ("--eval-generations", {"type": int, "default": 8, "help": "runs per held-out question"})
    options = [held_out_option, eval_every_option, eval_generations_option, demonstrations_option, THREADS_OPTION]
    args = parse_args(__doc__ or "", argv, steps=40, warmup_steps=3, warmup_lr=1e-3, max_tokens=32,
                      base_model="smollm2-135m", learning_rate=4e-4, num_generations=6, scenarios_per_step=2,
                      options=options)  # fmt: skip
    use_threads(args)
    stock, questions = make_questions(args.seed)
    check_stock = stock_tool(stock)
    (example_stock, example_general), rest = questions[:2], questions[2:]
    examples = worked_examples(
        check_stock,
        example_stock["question"].split()[2],
        next((q, a) for q, a in GENERAL if q == example_general["question"]),
    )
    train_questions = rest[: -args.held_out]
    train, held_out = scenarios(train_questions, examples), scenarios(rest[-args.held_out :], examples)
    with trainable_model(args, f"when-to-call-{args.seed}", "examples") as (model, llm):
        graph = create_agent(model=llm, tools=[check_stock], system_prompt=SYSTEM)
        before = evaluate(graph, held_out, EVAL_REWARDS, num_generations=args.eval_generations)
        untrained = rates([t for g in before.groups for t in g.trajectories], -1)  # no warm-up, no step
        rewards = [right_answer, wasted_call, called]
        trainer = held_out_trainer(graph, model, args, rewards=rewards, held_out=held_out, eval_rewards=EVAL_REWARDS)
        warm_up(trainer, demonstrations(train_questions[: args.demonstrations], check_stock, examples), args, echo=echo)
        history = trainer.train(train, steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a held-out run")
        summary["held_out"] = [untrained, *call_rates(trainer)]
        for row in summary["held_out"]:
            echo(json.dumps(row))
        return summary


if __name__ == "__main__":
    main()
