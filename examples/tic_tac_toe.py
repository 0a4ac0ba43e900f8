"""Tic-tac-toe: a LangGraph agent learns to beat a random opponent, playing through a ``move`` tool.

The board is code. The agent plays X: each turn node ``agent`` sees the board and calls ``move(square)``; node
``play`` puts the X there, then the opponent's O on a random free square (random but fixed per scenario: the same
position always gets the same answer, so the runs of one group face the same opponent). Reward: win 1, draw 0.5,
loss 0; an illegal move (a taken square, no call) loses at once. The held-out evaluation (other opponents) scores
wins only, so its curve is the win rate.

Offline, tiny model (a short SFT warm-up on sensible moves teaches the shape of a call; RL does the rest):
    OMP_NUM_THREADS=1 python examples/tic_tac_toe.py --steps 30
Credit per move (branch groups resumed from the game's checkpoints: docs/guides/branching.md):
    OMP_NUM_THREADS=1 python examples/tic_tac_toe.py --steps 30 --branch-groups 2 --scenarios-per-step 1
On a real model (GPU; the warm-up is not needed):
    python examples/tic_tac_toe.py --base-model Qwen/Qwen2.5-1.5B-Instruct --warmup-steps 0 --steps 100 \\
        --learning-rate 1e-5 --temperature 1.0 --engine vllm
"""

from __future__ import annotations

import json
import random
from typing import Any, TypedDict

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph

import langgraph_art as art

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
SYSTEM = "You play tic-tac-toe as X. Call move with the number of a free square."


@tool
def move(square: int) -> str:
    """Put your X on a free square (1-9)."""
    return f"X on {square}"  # the graph's play node applies it; this is the schema the model sees


MOVE_TOOL = convert_to_openai_tool(move)


def winner(board: list[str]) -> str | None:
    """'X' or 'O' when a line is full of one, 'draw' when the board is full, else None."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


def show(board: list[str]) -> str:
    """The board as the agent sees it: free squares by number."""
    cells = [str(i + 1) if v == "." else v for i, v in enumerate(board)]
    rows = [" ".join(cells[r : r + 3]) for r in (0, 3, 6)]
    free = " ".join(str(i + 1) for i, v in enumerate(board) if v == ".")
    return "Board:\n" + "\n".join(rows) + f"\nFree: {free}\nYour move."


def opponent(board: list[str], seed: int) -> int:
    """A random free square, the same one for the same position and seed."""
    free = [i for i, v in enumerate(board) if v == "."]
    return random.Random(f"{seed}:{''.join(board)}").choice(free)


class Game(TypedDict):
    board: list[str]
    seed: int
    result: str  # "", "win", "draw", "loss", "illegal"
    messages: list[Any]


def build_graph(llm: art.ChatART) -> Any:
    model = llm.bind_tools([move])

    def agent(state: Game) -> dict[str, Any]:
        reply = model.invoke([("system", SYSTEM), ("user", show(state["board"]))])
        return {"messages": [*state["messages"], reply]}

    def play(state: Game) -> dict[str, Any]:
        board, reply = list(state["board"]), state["messages"][-1]
        calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        square = calls[0]["args"].get("square") if calls and calls[0]["name"] == "move" else None
        try:
            index = int(square) - 1  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return {"result": "illegal"}
        if not 0 <= index < 9 or board[index] != ".":
            return {"result": "illegal"}
        board[index] = "X"
        if (done := winner(board)) is None:
            board[opponent(board, state["seed"])] = "O"
            done = winner(board)
        outcome = {"X": "win", "O": "loss", "draw": "draw", None: ""}[done]
        return {"board": board, "result": outcome}

    graph = StateGraph(Game)
    graph.add_node("agent", agent)
    graph.add_node("play", play)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "play")
    graph.add_conditional_edges("play", lambda state: END if state["result"] else "agent")
    return graph.compile().with_config(recursion_limit=12)


@art.reward
def game_result(state) -> float:
    """Win 1, draw 0.5, loss or illegal move 0."""
    return {"win": 1.0, "draw": 0.5}.get(state["result"], 0.0)


@art.reward
def won(state) -> float:
    """1 for a win: the evaluation's mean is the win rate."""
    return float(state["result"] == "win")


def scenarios(seeds: range) -> list[dict[str, Any]]:
    """One game per opponent seed, from the empty board."""
    return [
        {"id": f"opponent-{s}", "input": {"board": ["."] * 9, "seed": s, "result": "", "messages": []}} for s in seeds
    ]


def good_move(board: list[str], rng: random.Random) -> int:
    """The warm-up's teacher: win if possible, else block, else the centre, else a random free square."""
    free = [i for i, v in enumerate(board) if v == "."]
    for mark in ("X", "O"):
        for i in free:
            trial = list(board)
            trial[i] = mark
            if winner(trial) == mark:
                return i
    return 4 if 4 in free else rng.choice(free)


def warmup_conversations(count: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """Positions from games of the teacher against a random opponent, each answered with the teacher's move."""
    rng, examples = random.Random(seed), []
    while len(examples) < count:
        board = ["."] * 9
        while winner(board) is None and len(examples) < count:
            square = good_move(board, rng)
            call = {"id": "call_1", "type": "function", "function": {"name": "move"}}
            call["function"]["arguments"] = json.dumps({"square": square + 1})
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": show(board)},
                {"role": "assistant", "content": "", "tool_calls": [call]},
            ]
            examples.append({"tools": [MOVE_TOOL], "messages": messages})
            board[square] = "X"
            if winner(board) is None:
                board[rng.choice([i for i, v in enumerate(board) if v == "."])] = "O"
    return examples


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    help_text = "branch groups a step, forked at later moves of the step's games (0: none)"
    branch_option = ("--branch-groups", {"type": int, "default": 0, "help": help_text})
    args = parse_args(__doc__ or "", argv, steps=40, warmup_steps=120, num_iterations=2, options=[branch_option])
    with trainable_model(args, f"tic-tac-toe-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[game_result],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args),
            eval_scenarios=scenarios(range(1000, 1032)),
            eval_every=10,
            eval_rewards=[won],
            branching=art.Branching(groups_per_step=args.branch_groups, seed=args.seed) if args.branch_groups else None,
        )
        warm_up(trainer, warmup_conversations(seed=args.seed), args, echo=echo)
        history = trainer.train(scenarios(range(args.seed * 1000, args.seed * 1000 + 64)), steps=args.steps)
        summary = report(trainer, history, echo=echo, shown="a game")
        echo("win rate (held-out opponents): " + " -> ".join(f"{e['eval/reward/mean']:.0%}" for e in trainer.evals))
        return summary


if __name__ == "__main__":
    main()
