"""Codenames, two roles in one graph: a clue giver and a guesser share the model; only the guesser is trained.

The board shows nine words from three topics. Node ``clue_giver`` knows which three are the team's and the three
topics, and gives a one-word clue; node ``guesser`` sees the board and the clue and calls ``guess(words)`` (the call
is forced: the graph reads it). Both call the same ``ChatART``, but ``GRPOConfig(trainable_nodes=["guesser"])`` makes
the update learn from the guesser's turns only: the clue giver's turns are captured (and shown in Langfuse) but never
trained on. Reward: +1/3 per team word guessed (a guess of another board word earns nothing).

SmolLM2-135M (the default, offline, no warm-up): the untrained clue giver names a topic, often the wrong one, and the
untrained guesser mostly names words that are not on the board; 20 GRPO steps of 2 rounds x 8 runs raise the
held-out score from 0.04-0.13 to 0.31-0.35 on seeds 0-2, ~7.5 min each on 2 cores (benchmarks/README.md):
    python examples/codenames.py [--seed 0]
The tiny model, offline (an SFT warm-up teaches the clue giver to name the topic and both roles the shape of their
answers; which words belong to a topic is beyond it: 0.06 -> 0.08):
    OMP_NUM_THREADS=1 python examples/codenames.py --base-model tiny --warmup-steps 150 --steps 30
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, TypedDict

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph

import langgraph_art as art

TOPICS = {
    "animal": ["cat", "dog", "horse", "tiger", "mouse", "eagle"],
    "color": ["red", "green", "blue", "yellow", "purple", "orange"],
    "food": ["bread", "apple", "cheese", "rice", "soup", "honey"],
}
GIVER = "You give Codenames clues. Answer with one word: the topic that links your team's words."
TOPIC_HINT = f"\nThe topics: {', '.join(sorted(TOPICS))}."  # a real model's clue giver picks one (no warm-up)
GUESSER = "You guess Codenames words. Call guess with the three board words that fit the clue."


@tool
def guess(words: str) -> str:
    """Guess board words that fit the clue, separated by commas."""
    return words  # the graph reads the call; this is the schema the model sees


GUESS_TOOL = convert_to_openai_tool(guess)


class Round(TypedDict):
    board: list[str]
    team: list[str]
    clue: str
    guesses: list[str]


def build_graph(llm: art.ChatART) -> Any:
    guesser_model = llm.bind_tools([guess], tool_choice="guess")  # the graph reads the call: it must be made

    def clue_giver(state: Round) -> dict[str, Any]:
        prompt = f"Board: {' '.join(state['board'])}\nYour team's words: {' '.join(state['team'])}{TOPIC_HINT}\nClue:"
        reply = llm.invoke([("system", GIVER), ("user", prompt)])
        words = re.findall(r"[a-z]+", str(reply.content).lower())
        named = [w for w in words if w in TOPICS]  # "The topic is food." names one; else the first word is the clue
        return {"clue": named[0] if named else words[0] if words else ""}

    def guesser(state: Round) -> dict[str, Any]:
        prompt = f"Board: {' '.join(state['board'])}\nClue: {state['clue']} 3"
        reply = guesser_model.invoke([("system", GUESSER), ("user", prompt)])
        calls = [c for c in reply.tool_calls if c["name"] == "guess"]
        text = str(calls[0]["args"].get("words", "")) if calls else ""
        return {"guesses": [w for w in re.findall(r"[a-z]+", text.lower()) if w in state["board"]][:3]}

    graph = StateGraph(Round)
    graph.add_node("clue_giver", clue_giver)
    graph.add_node("guesser", guesser)
    graph.add_edge(START, "clue_giver")
    graph.add_edge("clue_giver", "guesser")
    graph.add_edge("guesser", END)
    return graph.compile()


@art.reward
def team_words(state) -> float:
    """+1/3 per team word guessed (three guesses at most: any other word takes the place of one)."""
    return sum(word in state["team"] for word in set(state["guesses"])) / 3


def deal(rng: random.Random) -> dict[str, Any]:
    """Three words of each topic, one topic the team's."""
    topic = rng.choice(sorted(TOPICS))
    picked = {name: rng.sample(words, 3) for name, words in TOPICS.items()}
    board = [w for words in picked.values() for w in words]
    rng.shuffle(board)
    return {"topic": topic, "board": board, "team": picked[topic]}


def scenarios(count: int, seed: int) -> list[dict[str, Any]]:
    rng, rounds = random.Random(seed), []
    for i in range(count):
        dealt = deal(rng)
        state = {"board": dealt["board"], "team": dealt["team"], "clue": "", "guesses": []}
        rounds.append({"id": f"round-{seed}-{i}", "topic": dealt["topic"], "input": state})
    return rounds


def warmup_conversations(count: int = 36, seed: int = 0) -> list[dict[str, Any]]:
    """The clue giver naming the topic; the guesser calling guess with three board words (any three: which ones
    is what RL teaches)."""
    rng, examples = random.Random(seed + 7), []
    for _ in range(count):
        dealt = deal(rng)
        board = " ".join(dealt["board"])
        examples.append({"messages": [
            {"role": "system", "content": GIVER},
            {"role": "user", "content": f"Board: {board}\nYour team's words: {' '.join(dealt['team'])}\nClue:"},
            {"role": "assistant", "content": dealt["topic"]},
        ]})  # fmt: skip
        call = {"id": "call_1", "type": "function", "function": {"name": "guess"}}
        call["function"]["arguments"] = json.dumps({"words": ", ".join(rng.sample(dealt["board"], 3))})
        examples.append({"tools": [GUESS_TOOL], "messages": [
            {"role": "system", "content": GUESSER},
            {"role": "user", "content": f"Board: {board}\nClue: {dealt['topic']} 3"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]})  # fmt: skip
    return examples


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv, steps=20, warmup_steps=0, warmup_lr=5e-3, max_tokens=32,
                      base_model="smollm2-135m")  # fmt: skip
    with trainable_model(args, f"codenames-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[team_words],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args, trainable_nodes=["guesser"]),  # the clue giver's turns are not trained on
            eval_scenarios=scenarios(16, seed=10_000 + args.seed),
            eval_every=10,
        )
        warm_up(trainer, warmup_conversations(seed=args.seed), args, echo=echo)
        history = trainer.train(scenarios(64, seed=args.seed), steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a round")
        trained = [m.get("train/sequences", 0.0) for m in history]
        echo(f"sequences trained per step (guesser turns only): {trained[:5]} ...")
        return summary


if __name__ == "__main__":
    main()
