"""An email search agent in the style of ART·E: it answers questions about an inbox with three tools.

The inbox is synthetic, generated offline into SQLite: a few hundred emails (senders, dates, subjects, bodies),
some holding a fact a question asks for (a flight's confirmation code, an invoice's amount, a meeting's room).
The agent calls ``search_inbox(keywords)``, ``read_email(email_id)`` and finally ``answer(text)``. Two rewards:
``correct_answer`` (code: the answer holds the fact) and a ``RulerJudge`` that compares the runs of a group. Offline the
judge is ``GroundedJudge``, a scripted stand-in (a LangChain chat model that scores each run by what it did:
searched, read, answered with words from an email it read); on a real setup use any chat model.

Offline, tiny model (it learns the order of the calls; it rarely copies the fact right):
    OMP_NUM_THREADS=1 python examples/email_agent.py --steps 20
On a real model (GPU) with a real judge:
    python examples/email_agent.py --base-model Qwen/Qwen2.5-7B-Instruct --warmup-steps 0 --steps 100 \\
        --learning-rate 1e-5 --temperature 1.0 --engine vllm --judge openai:gpt-4.1-mini
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import langgraph_art as art

SYSTEM = "You answer questions about the user's inbox. Search it, read the email, then call answer."
CITIES = ["Lisbon", "Oslo", "Denver", "Kyoto", "Nairobi", "Quito", "Dublin", "Hanoi"]
COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark", "Wayne"]
PEOPLE = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana"]
FILLER = ["Weekly newsletter", "Your order has shipped", "Team lunch", "Password reminder", "Holiday schedule"]


def make_inbox(path: Path, *, emails: int = 300, seed: int = 0) -> list[dict[str, Any]]:
    """Write the synthetic inbox; return one question per fact email (three in ten hold one)."""
    rng, rows, questions = random.Random(seed), [], []
    for i in range(emails):
        date = f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        kind = i % 3 if i % 10 < 3 else None
        if kind == 0:
            city, code = rng.choice(CITIES), "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
            subject, body = f"Flight TP{i} to {city}", f"Flight TP{i} to {city} is booked. Confirmation code {code}."
            question, fact, keywords = f"What is the confirmation code of flight TP{i}?", code, f"flight TP{i}"
        elif kind == 1:
            company, amount = rng.choice(COMPANIES), f"{rng.randrange(100, 999)}.00"
            subject, body = f"Invoice INV{i} from {company}", f"Invoice INV{i}: the amount due is {amount} EUR."
            question, fact, keywords = f"How much is invoice INV{i} from {company}?", amount, f"invoice INV{i}"
        elif kind == 2:
            person, room = rng.choice(PEOPLE), f"room {rng.randrange(100, 500)}"
            subject, body = f"Meeting MT{i} with {person}", f"Meeting MT{i} with {person} is in {room}."
            question, fact, keywords = f"Which room is meeting MT{i} with {person} in?", room, f"meeting MT{i}"
        else:
            subject, body = rng.choice(FILLER), "Nothing that needs an answer."
        if kind is not None:
            scenario = {"id": f"q{i}", "question": question, "fact": fact, "keywords": keywords}
            questions.append({**scenario, "input": {"messages": [("system", SYSTEM), ("user", question)]}})
        sender = f"{rng.choice(PEOPLE).lower()}@{rng.choice(COMPANIES).lower()}.example"
        rows.append((f"m{i:03d}", sender, date, subject, body))
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS emails")
        db.execute("CREATE TABLE emails (id TEXT PRIMARY KEY, sender TEXT, date TEXT, subject TEXT, body TEXT)")
        db.executemany("INSERT INTO emails VALUES (?, ?, ?, ?, ?)", rows)
    return questions


def inbox_tools(db: Path) -> dict[str, Any]:
    """The agent's tools over the inbox at ``db``, by name."""

    def query(sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with sqlite3.connect(db) as connection:
            return connection.execute(sql, args).fetchall()

    @tool
    def search_inbox(keywords: str) -> str:
        """Search the inbox; returns up to 5 emails (id, date, sender, subject) holding every keyword, newest first."""
        words = {w for w in re.findall(r"\w+", keywords.lower()) if len(w) > 2}
        if not words:
            return "No keywords given."
        rows = query("SELECT id, date, sender, subject, body FROM emails ORDER BY date DESC, id", ())
        hits = [row[:4] for row in rows if words <= set(re.findall(r"\w+", f"{row[3]} {row[4]}".lower()))]
        return "\n".join(" | ".join(row) for row in hits[:5]) or "No emails found."

    @tool
    def read_email(email_id: str) -> str:
        """Read one email by its id."""
        rows = query("SELECT id, date, sender, subject, body FROM emails WHERE id = ?", (email_id.strip(),))
        if not rows:
            return f"No email with id {email_id!r}."
        return "\n".join(f"{k}: {v}" for k, v in zip(("id", "date", "from", "subject", "body"), rows[0], strict=True))

    @tool
    def answer(text: str) -> str:
        """Give the final answer to the user's question."""
        return text

    return {"search_inbox": search_inbox, "read_email": read_email, "answer": answer}


def build_graph(llm: art.ChatART, tools: dict[str, Any]) -> Any:
    model = llm.bind_tools(list(tools.values()))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        calls = getattr(state["messages"][-1], "tool_calls", None) or []
        if not calls or any(c["name"] == "answer" for c in calls):
            return END
        return "tools"

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tools["search_inbox"], tools["read_email"]]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile().with_config(recursion_limit=10)


def final_answer(state: Any) -> str:
    for call in getattr(state["messages"][-1], "tool_calls", None) or []:
        if call["name"] == "answer":
            return str(call["args"].get("text", ""))
    return ""


@art.reward
def correct_answer(state, scenario) -> float:
    """1 when the answer holds the fact the question asks for."""
    return float(scenario["fact"].lower() in final_answer(state).lower())


class GroundedJudge(BaseChatModel):
    """The offline stand-in for a judge model: reads the group as ``RulerJudge`` renders it and scores each run by
    what it did (0.2 searched, +0.3 read an email, +0.5 answered with a word of an email it read). A real judge
    (``--judge``) reads the same prompt."""

    @property
    def _llm_type(self) -> str:
        return "grounded-judge"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        prompt = str(messages[-1].content)
        scores = []
        for run_id, body in re.findall(r'<run id="([^"]+)">(.*?)</run>', prompt, re.S):
            read = " ".join(re.findall(r"body: (.*)", body))
            answered = re.findall(r"-> calls answer\((.*)\)", body)
            grounded = bool(answered) and any(w in read for w in re.findall(r"[\w.]{3,}", answered[-1]))
            score = 0.2 * ("-> calls search_inbox" in body) + 0.3 * bool(read) + 0.5 * grounded
            scores.append({"trajectory_id": run_id, "explanation": f"read={bool(read)} grounded={grounded}",
                           "score": round(score, 2)})  # fmt: skip
        message = AIMessage(json.dumps({"scores": scores}))
        return ChatResult(generations=[ChatGeneration(message=message)])


def judge_model(spec: str | None) -> BaseChatModel:
    """``provider:model`` through LangChain's ``init_chat_model`` (network and a key), or the offline stand-in."""
    if not spec:
        return GroundedJudge()
    from langchain.chat_models import init_chat_model

    return init_chat_model(spec)


def warmup_conversations(
    questions: list[dict[str, Any]], tools: dict[str, Any], count: int = 24
) -> list[dict[str, Any]]:
    """The right sequence for some questions: search with the question's keywords, read the newest hit, answer."""
    schemas = [convert_to_openai_tool(t) for t in tools.values()]
    examples = []
    for q in questions[:count]:
        found = tools["search_inbox"].invoke({"keywords": q["keywords"]})
        email_id = found.split(" | ")[0]
        calls = [("search_inbox", {"keywords": q["keywords"]}), ("read_email", {"email_id": email_id})]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": q["question"]},
        ]
        for n, (name, arguments) in enumerate(calls):
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = tools[name].invoke(arguments)
            messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": result})
        final = {
            "id": "call_9",
            "type": "function",
            "function": {"name": "answer", "arguments": json.dumps({"text": q["fact"]})},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [final]})
        examples.append({"tools": schemas, "messages": messages})
    return examples


def open_inbox(home: str | Path, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The inbox written under ``home``: its questions and the tools over it."""
    db = Path(home) / "email-agent" / f"inbox-{seed}.sqlite"
    return make_inbox(db, seed=seed), inbox_tools(db)


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    judge_option = ("--judge", {"default": None, "help": "provider:model of a judge (e.g. openai:gpt-4.1-mini)"})
    args = parse_args(__doc__ or "", argv, steps=20, warmup_steps=150, max_tokens=64, options=[judge_option])
    questions, tools = open_inbox(args.home, args.seed)
    train, held_out = questions[:-12], questions[-12:]
    judge = art.RulerJudge(judge_model(args.judge), cache=False, on_error="skip", weight=0.5)
    with trainable_model(args, f"email-agent-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm, tools),
            model,
            rewards=[correct_answer, judge],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args),
            eval_scenarios=held_out,
            eval_every=10,
            eval_rewards=[correct_answer],  # held out: the fact, no judge
        )
        warm_up(trainer, warmup_conversations(train, tools), args, echo=echo)
        history = trainer.train(train, steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a run")
        echo(f"judge calls: {judge.usage['calls']:.0f}")
        return summary


if __name__ == "__main__":
    main()
