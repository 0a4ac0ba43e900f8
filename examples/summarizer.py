"""A summarizer: SFT on reference summaries first, then RL for what the references do not say outright.

Documents are synthetic company reports: one sentence with the key facts (company, what was reported, the figure,
the quarter) among filler sentences. The graph is one node. Step one is supervised: ``trainer.warmup`` on
(document, reference summary) pairs. Step two is GRPO with two rewards: ``key_facts`` (the share of the four facts
the summary keeps) and ``length_in_range`` (6 to 16 words; longer or shorter loses credit linearly).

Offline, tiny model:
    OMP_NUM_THREADS=1 python examples/summarizer.py --steps 30
On a real model (GPU), with real documents in place of ``documents()``:
    python examples/summarizer.py --base-model Qwen/Qwen2.5-1.5B-Instruct --warmup-steps 50 --steps 100 \\
        --learning-rate 1e-5 --warmup-lr 1e-4 --temperature 1.0 --engine vllm
"""

from __future__ import annotations

import random
import re
from typing import Any

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art

SYSTEM = "Summarize the report in one sentence: the company, what it reported, the figure and the quarter."
COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark", "Wayne", "Tyrell", "Cyberdyne"]
METRICS = ["revenue", "profit", "sales", "orders"]
FILLER = [
    "The weather at the annual meeting was mild.",
    "Analysts had expected a quiet quarter.",
    "The board thanked its staff.",
    "A new office opened last spring.",
    "Shares traded in a narrow range.",
    "The company plans to hire engineers.",
]


def documents(count: int, seed: int) -> list[dict[str, Any]]:
    """Reports with their facts and a reference summary."""
    rng, docs = random.Random(seed), []
    for i in range(count):
        facts = {
            "company": rng.choice(COMPANIES),
            "metric": rng.choice(METRICS),
            "figure": f"{rng.randrange(2, 99)} million",
            "quarter": f"Q{rng.randrange(1, 5)}",
        }
        key = f"{facts['company']} reported {facts['metric']} of {facts['figure']} in {facts['quarter']}."
        sentences = rng.sample(FILLER, 3)
        sentences.insert(rng.randrange(4), key)
        text = " ".join(sentences)
        docs.append({
            "id": f"report-{seed}-{i}", "facts": facts, "reference": key,
            "input": {"messages": [("system", SYSTEM), ("user", text)]},
        })  # fmt: skip
    return docs


def build_graph(llm: art.ChatART) -> Any:
    def summarize(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "summarize")
    return graph.compile()


@art.reward
def key_facts(state, scenario) -> float:
    """The share of the four facts (company, metric, figure, quarter) the summary keeps."""
    summary = str(state["messages"][-1].content).lower()
    return sum(value.lower() in summary for value in scenario["facts"].values()) / 4


@art.reward(weight=0.5)
def length_in_range(state) -> float:
    """1 for 6 to 16 words, losing 0.1 per word outside."""
    words = len(re.findall(r"\S+", str(state["messages"][-1].content)))
    return max(0.0, 1.0 - 0.1 * max(6 - words, words - 16, 0))


def reference_conversations(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SFT examples: each document answered with its reference summary."""
    examples = []
    for doc in docs:
        (_, system), (_, text) = doc["input"]["messages"]
        examples.append({"messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": text},
            {"role": "assistant", "content": doc["reference"]},
        ]})  # fmt: skip
    return examples


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv, steps=30, warmup_steps=60, max_tokens=32)
    train, held_out = documents(64, seed=args.seed), documents(16, seed=50_000 + args.seed)
    with trainable_model(args, f"summarizer-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[key_facts, length_in_range],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args),
            eval_scenarios=held_out,
            eval_every=10,
        )
        warm_up(trainer, reference_conversations(train), args, echo=echo)  # step one: supervised, on the references
        history = trainer.train(train, steps=args.steps)  # step two: RL
        return report(trainer, history, echo=echo, shown="a summary")


if __name__ == "__main__":
    main()
