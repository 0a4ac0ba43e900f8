"""An email agent in the style of ART·E, sized for SmolLM2-135M: it searches an inbox, reads an email, answers.

The inbox is generated from a seed into SQLite: 60 emails (senders, dates, subjects, bodies), half of them holding a
fact that one question asks for (a flight's confirmation code, an invoice's amount, a meeting's room). The fact is
only in the email's body, never in its subject or in the question, so it cannot be guessed: the agent has to call
``search_inbox(keywords)`` (ids and subjects of the best matches), ``read_email(email_id)`` (the body) and finally
``answer(text)``. The first call is forced to be a search; after it every turn must call one of the three
(``tool_choice="required"``), and the loop ends at ``answer`` or after ``MAX_TURNS`` turns. Questions on the last
emails are held out.

The untrained model rarely gets there on its own (it answers at once, or reads ids it made up), so besides the forced
search the conversation starts with one worked example: a question on another email, answered with the three calls.
That is the whole bootstrap: in context, no SFT. GRPO then trains on the agent's own runs with two rewards:
``correct_answer`` (1 when the answer holds the fact) and ``read_the_email`` (0.25 when the run read the email
holding it and then answered). The held-out score is ``correct_answer`` alone. What else was tried, and the numbers
on 3 seeds: benchmarks/README.md.

    python examples/email_agent.py                   # SmolLM2-135M, offline; seeds and numbers: benchmarks/README.md
    python examples/email_agent.py --judge openai:gpt-4.1-mini   # adds a RULER judge (network and a key)
    python examples/email_agent.py --teacher base    # distilled from the base model told where the fact is

``--teacher`` adds on-policy distillation (docs/guides/distillation.md): the teacher sees each call with the relevant
facts added to the question (``relevant_facts``: the email that holds the answer, the words that find it and the
fact itself) and scores every token the agent sampled. Measured, it does not help here (benchmarks/README.md, issue
37: a 135M model shown the facts is no better at the task, and the taught agent got worse).
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

from harness import (
    TEACHER_OPTIONS,
    THREADS_OPTION,
    eval_runs,
    held_out_trainer,
    parse_args,
    report,
    teacher_from,
    trainable_model,
    use_threads,
)
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import langgraph_art as art
from langgraph_art.teacher import hint_question

SYSTEM = (
    "You answer questions about the user's inbox with tools. First call search_inbox with words from the question, "
    "then read_email with the id of the email that matches, then answer with the fact from that email."
)
MAX_TURNS = 4  # agent turns per question: search, read, answer, and one to spare
CITIES = ["Lisbon", "Oslo", "Denver", "Kyoto", "Nairobi", "Quito", "Dublin", "Hanoi"]
COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark", "Wayne"]
PEOPLE = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana"]
FILLER = ["Weekly newsletter", "Your order has shipped", "Team lunch", "Password reminder", "Holiday schedule"]
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def make_inbox(path: Path, *, emails: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    """Write the inbox to ``path``; return one question per email that holds a fact (every other email)."""
    rng, rows, questions = random.Random(seed), [], []
    numbers = rng.sample(range(100, 1000), emails)  # the flight/invoice/meeting numbers: unique in the inbox
    for i, n in enumerate(numbers):
        email_id, date = f"e{i + 1}", f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        kind = (i // 2) % 3 if i % 2 == 0 else None
        if kind == 0:
            city, code = rng.choice(CITIES), "".join(rng.choice(CODE_LETTERS) for _ in range(5))
            subject, body = f"Flight {n} to {city}", f"Your flight {n} to {city} is booked. Confirmation code: {code}."
            question, fact = f"What is the confirmation code of flight {n}?", code
        elif kind == 1:
            company, amount = rng.choice(COMPANIES), f"{rng.randrange(100, 999)}.00"
            subject = f"Invoice {n} from {company}"
            body = f"Invoice {n} from {company}: the amount due is {amount} EUR."
            question, fact = f"How much is invoice {n}?", amount
        elif kind == 2:
            person, room = rng.choice(PEOPLE), f"room {rng.randrange(10, 99)}"
            subject, body = f"Meeting {n} with {person}", f"Meeting {n} with {person} will be held in {room}."
            question, fact = f"Which room is meeting {n} in?", room
        else:
            subject, body = f"{rng.choice(FILLER)} {n}", "Nothing that needs an answer."
        if kind is not None:
            keywords = " ".join(subject.split()[:2]).lower()  # "flight 964": what a good search asks for
            questions.append({"id": email_id, "question": question, "fact": fact, "email_id": email_id,
                              "keywords": keywords})  # fmt: skip
        sender = f"{rng.choice(PEOPLE).lower()}@{rng.choice(COMPANIES).lower()}.example"
        rows.append((email_id, sender, date, subject, body))
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS emails")
        db.execute("CREATE TABLE emails (id TEXT PRIMARY KEY, sender TEXT, date TEXT, subject TEXT, body TEXT)")
        db.executemany("INSERT INTO emails VALUES (?, ?, ?, ?, ?)", rows)
    return questions


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def inbox_tools(db: Path) -> dict[str, Any]:
    """The agent's tools over the inbox at ``db``, by name."""

    def rows() -> list[tuple[str, ...]]:
        with sqlite3.connect(db) as connection:
            return connection.execute("SELECT id, date, sender, subject, body FROM emails").fetchall()

    @tool
    def search_inbox(keywords: str) -> str:
        """Search the inbox: the ids, senders and subjects of the 3 emails that share the most words with the
        keywords."""
        query = words(keywords)
        scored = sorted(((len(query & words(f"{r[3]} {r[4]}")), r) for r in rows()), key=lambda s: -s[0])
        hits = [row for score, row in scored[:3] if score]
        return "\n".join(f"{r[0]} | {r[2]} | {r[3]}" for r in hits) or "No emails found."

    @tool
    def read_email(email_id: str) -> str:
        """Read one email by its id (such as e12)."""
        found = re.search(r"e\d+", email_id.lower())
        match = [r for r in rows() if found and r[0] == found.group()]
        if not match:
            return f"No email with id {email_id!r}: use an id that search_inbox returned."
        email_id, _, _, subject, body = match[0]
        return f"id: {email_id}\nsubject: {subject}\nbody: {body}"

    @tool
    def answer(text: str) -> str:
        """Give the final answer to the user's question."""
        return text

    return {"search_inbox": search_inbox, "read_email": read_email, "answer": answer}


def worked_example(tools: dict[str, Any], example: dict[str, Any]) -> list[Any]:
    """One question answered with the three calls, as messages (the real tools' results): the in-context example
    every conversation starts with."""
    calls = [
        ("search_inbox", {"keywords": example["keywords"]}),
        ("read_email", {"email_id": example["email_id"]}),
        ("answer", {"text": example["fact"]}),
    ]
    messages: list[Any] = [HumanMessage(example["question"])]
    for n, (name, arguments) in enumerate(calls):
        call_id = f"example_{n}"
        messages.append(AIMessage("", tool_calls=[{"id": call_id, "name": name, "args": arguments}]))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tools[name].invoke(arguments)})
    return messages


def scenarios(questions: list[dict[str, Any]], example: list[Any]) -> list[dict[str, Any]]:
    """Each question as a scenario whose ``input`` is the system prompt, the worked example and the question."""
    return [{**q, "input": {"messages": [("system", SYSTEM), *example, ("user", q["question"])]}} for q in questions]


def relevant_facts(scenario: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A privileged prompt for a teacher (``art.Teacher(prompt=relevant_facts)``): the question with what the agent
    has to find: the email holding the answer, the search that finds it and the fact."""
    hint = (f" (Search {scenario['keywords']!r}: email {scenario['email_id']} holds the answer, "
            f"{scenario['fact']}.)")  # fmt: skip
    return hint_question(messages, hint)


def turns_since_question(messages: list[Any]) -> int:
    last_question = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    return sum(isinstance(m, AIMessage) for m in messages[last_question:])


def build_graph(llm: art.ChatART, tools: dict[str, Any]) -> Any:
    """The agent: a forced search first, then one call a turn among the three tools; ``answer`` ends the run, so
    does the ``MAX_TURNS``-th turn."""
    every = list(tools.values())
    searching = llm.bind_tools(every, tool_choice="search_inbox", parallel_tool_calls=False)
    choosing = llm.bind_tools(every, tool_choice="required", parallel_tool_calls=False)

    def agent(state: MessagesState) -> dict[str, Any]:
        model = choosing if tool_calls(state) else searching
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        calls = getattr(state["messages"][-1], "tool_calls", None) or []
        if not calls or any(c["name"] == "answer" for c in calls):
            return END
        return END if turns_since_question(state["messages"]) >= MAX_TURNS else "tools"

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tools["search_inbox"], tools["read_email"]]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


def final_answer(state: Any) -> str:
    for call in getattr(state["messages"][-1], "tool_calls", None) or []:
        if call["name"] == "answer":
            return str(call["args"].get("text", ""))
    return ""


def tool_calls(state: Any) -> list[dict[str, Any]]:
    """The calls the agent made for the question (the worked example's excluded)."""
    messages = state["messages"]
    last_question = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    return [c for m in messages[last_question:] for c in getattr(m, "tool_calls", None) or []]


@art.reward
def correct_answer(state, scenario) -> float:
    """1 when the answer holds the fact the question asks for."""
    return float(scenario["fact"].lower() in final_answer(state).lower())


@art.reward(weight=0.25)
def read_the_email(state, scenario) -> float:
    """1 when the run read the email that holds the fact and then answered (a step on the way, worth a quarter of
    the right answer; a run that only reads and never answers gets nothing: without that condition the agent learnt
    to read the right email until its turns ran out)."""
    if not any(c["name"] == "answer" for c in tool_calls(state)):
        return 0.0
    reads = [c for c in tool_calls(state) if c["name"] == "read_email"]
    return float(any(re.search(rf"\b{scenario['email_id']}\b", str(c["args"].get("email_id", ""))) for c in reads))


@art.reward(weight=0)
def calls_before_answer(state) -> float:
    """How many searches and reads the run made (weight 0: reported, not rewarded)."""
    return float(sum(c["name"] != "answer" for c in tool_calls(state)))


def held_out_summary(trainer: art.Trainer) -> list[dict[str, float]]:
    """Per evaluation: the share answered right, the share that read the right email, and the searches and reads
    of the runs that answered right (mean)."""
    rows = []
    for e in trainer.evals:
        runs = eval_runs(trainer, e)
        right = [r for r in runs if r.rewards.get("correct_answer") == 1]
        calls = [r.rewards.get("calls_before_answer", 0.0) for r in right]
        rows.append({"step": e["iteration"], "right": e["eval/reward/correct_answer"],
                     "read": e["eval/reward/read_the_email"], "calls_when_right": sum(calls) / max(len(calls), 1),
                     "calls": e["eval/reward/calls_before_answer"], "runs": len(runs)})  # fmt: skip
    return rows


def reward_only(fn: Any) -> Any:
    """``fn`` reported at weight 0 (the held-out score is the answer alone)."""
    return art.reward(fn.fn, name=fn.name, weight=0)


def judge_model(spec: str | None) -> Any:
    """``provider:model`` through LangChain's ``init_chat_model`` (network and a key), or None."""
    if not spec:
        return None
    from langchain.chat_models import init_chat_model

    return init_chat_model(spec)


def inbox_path(home: str | Path, seed: int) -> Path:
    return Path(home) / "email-agent" / f"inbox-{seed}.sqlite"


def open_inbox(home: str | Path, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The inbox written under ``home``: its questions and the tools over it."""
    db = inbox_path(home, seed)
    return make_inbox(db, seed=seed), inbox_tools(db)


def split(questions: list[dict[str, Any]], tools: dict[str, Any], held_out: int) -> tuple[list, list]:
    """The worked example (the first question), the training questions and the ``held_out`` last ones, as
    scenarios."""
    example = worked_example(tools, questions[0])
    rest = scenarios(questions[1:], example)
    return rest[:-held_out], rest[-held_out:]


EVAL_REWARDS = [correct_answer, reward_only(read_the_email), calls_before_answer]  # held out: the fact alone
DEFAULTS = {"steps": 15, "warmup_steps": 0, "max_tokens": 48, "base_model": "smollm2-135m", "learning_rate": 4e-4,
            "num_generations": 6, "scenarios_per_step": 2}  # fmt: skip
OPTIONS = [
    ("--held-out", {"type": int, "default": 10, "help": "questions held out for evaluation"}),
    ("--eval-generations", {"type": int, "default": 4, "help": "runs per held-out question"}),
    ("--eval-every", {"type": int, "default": None,
                      "help": "steps between held-out evaluations (default: before the first and after the last)"}),
    *TEACHER_OPTIONS,
    THREADS_OPTION,
]  # fmt: skip


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    judge_option = ("--judge", {"default": None, "help": "provider:model of a RULER judge (e.g. openai:gpt-4.1-mini)"})
    args = parse_args(__doc__ or "", argv, options=[*OPTIONS, judge_option], **DEFAULTS)
    if args.warmup_steps:
        raise SystemExit("--warmup-steps: this example learns without SFT (its bootstrap is the worked example)")
    use_threads(args)
    questions, tools = open_inbox(args.home, args.seed)
    train, held_out = split(questions, tools, args.held_out)
    rewards: list[Any] = [correct_answer, read_the_email]
    judge = judge_model(args.judge)
    if judge is not None:
        rewards.append(art.RulerJudge(judge, cache=False, on_error="skip", weight=0.5))
    with trainable_model(args, f"email-agent-{args.seed}", "examples") as (model, llm):
        graph = build_graph(llm, tools)
        trainer = held_out_trainer(graph, model, args, rewards=rewards, held_out=held_out, eval_rewards=EVAL_REWARDS,
                                   teacher=teacher_from(args, relevant_facts))  # fmt: skip
        history = trainer.train(train, steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a held-out run")
        summary["held_out"] = held_out_summary(trainer)
        for row in summary["held_out"]:
            echo(json.dumps(row))
        return summary


if __name__ == "__main__":
    main()
