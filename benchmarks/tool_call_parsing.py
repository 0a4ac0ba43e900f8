"""Does a real model's tool call come back as a call? Qwen2.5-Coder (or any base model) bound to four tools through
``ChatART.bind_tools`` under ``tool_choice="auto"``, untrained, on 24 questions that each need one of them.

Each reply's raw text (its sampled tokens, from the logprobs) is judged apart from any parser: it *contains a call*
when it names a bound tool the way a call does (``"name": "<tool>"``, ``<tool>(``). The table gives, of those
replies, the share that came back as ``tool_calls``: with the service's parser (``tool_call_parser``, by default
``"auto"``), and, on the same replies in the same run, with the hermes parser alone (what the project had before,
and what vLLM is told for Qwen2.5).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/tool_call_parsing.py --base-model qwen2.5-coder-0.5b \
        --temperatures 0 0.7 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool

import langgraph_art as art
from langgraph_art.serve.parsers.tool_calls import Hermes


@tool
def lookup(project: str) -> str:
    """Look up an internal project's owner, status and budget by its name."""
    return "{}"


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """Current weather in a city; unit is 'celsius' or 'fahrenheit'."""
    return "{}"


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money between two currencies (ISO codes such as USD, EUR, JPY)."""
    return "{}"


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights between two cities on a date (YYYY-MM-DD)."""
    return "{}"


TOOLS = [lookup, get_weather, convert_currency, search_flights]
QUESTIONS = [
    "Who owns the Onyx Forge project?",
    "What is the status of project Blue Lantern?",
    "How much budget is left on the Quartz Mill project?",
    "Look up the Silver Finch project for me.",
    "Is project Amber Gate on track?",
    "Who is responsible for Red Harbor?",
    "What's the weather in Paris right now?",
    "Tell me the current temperature in Tokyo in fahrenheit.",
    "Is it raining in Seattle?",
    "How warm is it in Cairo today?",
    "Weather in Buenos Aires, please, in celsius.",
    "Do I need a coat in Oslo today?",
    "Convert 250 US dollars to euros.",
    "How many yen is 40 euros?",
    "What is 1000 GBP in USD?",
    "Change 75.5 Swiss francs into Canadian dollars.",
    "How much is 12 euros in Indian rupees?",
    "I have 300 AUD; how many NZD is that?",
    "Find flights from Berlin to Madrid on 2026-03-14.",
    "Are there flights from Boston to Denver on 2026-05-02?",
    "Search flights Lisbon to Rome for 2026-07-21.",
    "I need to fly from Chicago to Miami on 2026-11-30; what is there?",
    "Show me flights from Sydney to Auckland on 2026-01-09.",
    "Look for a flight from Toronto to Vancouver on 2026-02-17.",
]


def raw_text(message: AIMessage) -> str:
    entries = (message.response_metadata.get("logprobs") or {}).get("content") or []
    return "".join(entry["token"] for entry in entries)


def contains_call(text: str, names: list[str]) -> bool:
    """A call to a bound tool in the raw text, judged without any parser."""
    return any(re.search(rf'"name"\s*:\s*"{name}"|\b{name}\s*\(', text) for name in names)


def run(base_model: str, temperature: float, max_tokens: int, seed: int | None) -> dict[str, Any]:
    names = [t.name for t in TOOLS]
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home) as backend:
        model = art.TrainableModel(name="parsing", project="bench", base_model=base_model).register(backend)
        llm = art.ChatART(model=model, temperature=temperature, max_tokens=max_tokens, seed=seed).bind_tools(TOOLS)
        started = time.perf_counter()
        replies = [llm.invoke([("user", q)]) for q in QUESTIONS]
        seconds = time.perf_counter() - started
        parser = backend.service(base_model)[0].app.state.chat_completions.reader.describe()
    rows = []
    for question, reply in zip(QUESTIONS, replies, strict=True):
        text = raw_text(reply)
        hermes = Hermes().parse(text, names)
        rows.append(
            {
                "question": question,
                "raw": text,
                "contains_call": contains_call(text, names),
                "parsed": [(c["name"], c["args"]) for c in reply.tool_calls],
                "hermes_parsed": len(hermes.calls),
            }
        )
    with_call = [r for r in rows if r["contains_call"]]
    return {
        "base_model": base_model,
        "temperature": temperature,
        "seed": seed,
        "parser": parser,
        "replies": len(rows),
        "with_call": len(with_call),
        "parsed": sum(1 for r in with_call if r["parsed"]),
        "hermes_parsed": sum(1 for r in with_call if r["hermes_parsed"]),
        "calls_without_call_text": sum(1 for r in rows if r["parsed"] and not r["contains_call"]),
        "seconds": seconds,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one sampled run per seed (T > 0)")
    parser.add_argument("--out", help="write every reply and verdict as JSON here")
    args = parser.parse_args()
    runs = [(t, None) if t == 0 else (t, seed) for t in args.temperatures for seed in args.seeds]
    results = [run(args.base_model, t, args.max_tokens, seed) for t, seed in dict.fromkeys(runs)]
    print(f"\n{args.base_model}, tool_choice='auto', {len(QUESTIONS)} questions needing a tool, 4 tools bound")
    print("| temperature | seed | parser (auto) | replies with a call | as tool_calls | share | hermes alone | s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        share = r["parsed"] / r["with_call"] if r["with_call"] else float("nan")
        hermes = r["hermes_parsed"] / r["with_call"] if r["with_call"] else float("nan")
        print(f"| {r['temperature']} | {r['seed'] if r['seed'] is not None else '-'} | "
              f"{r['parser']['tool_call_parser']} | {r['with_call']}/{r['replies']} | {r['parsed']} | {share:.2f} | "
              f"{hermes:.2f} | {r['seconds']:.0f} |")  # fmt: skip
    for r in results:
        for row in r["rows"]:
            if row["contains_call"] and not row["parsed"]:
                print(f"not read (T={r['temperature']}): {row['question']!r} -> {row['raw']!r}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
