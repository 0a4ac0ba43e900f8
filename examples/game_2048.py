"""2048: a LangGraph agent learns to slide tiles, through a ``slide`` tool.

The game is code: a 4x4 board, two tiles to start, a new 2 (or 4) after every move, placed at random but fixed per
scenario and position. Node ``agent`` sees the board and calls ``slide(direction)``; node ``play`` applies it. A game
ends after ``MAX_MOVES`` moves, when no move is left, or at a move that changes nothing or is not a call (which
also costs the reward of the moves it did not make). Reward: the score (the sum of the merged tiles) and the largest
tile, each in [0, 1].

Offline, tiny model (a short SFT warm-up on valid moves teaches the shape of a call):
    OMP_NUM_THREADS=1 python examples/game_2048.py --steps 30
On a real model (GPU), with longer games:
    python examples/game_2048.py --base-model Qwen/Qwen2.5-1.5B-Instruct --warmup-steps 0 --steps 100 \\
        --learning-rate 1e-5 --temperature 1.0 --engine vllm
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, TypedDict

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, StateGraph

import langgraph_art as art

MAX_MOVES = 8
DIRECTIONS = ("left", "right", "up", "down")
SYSTEM = "You play 2048. Call slide with left, right, up or down to merge equal tiles."


@tool
def slide(direction: str) -> str:
    """Slide every tile left, right, up or down; equal tiles that meet merge."""
    return direction  # the graph's play node applies it; this is the schema the model sees


SLIDE_TOOL = convert_to_openai_tool(slide)


def slide_row(row: list[int]) -> tuple[list[int], int]:
    """One row slid to the left: the new row and the points its merges made."""
    tiles, out, points = [v for v in row if v], [], 0
    while tiles:
        if len(tiles) > 1 and tiles[0] == tiles[1]:
            out.append(2 * tiles[0])
            points += 2 * tiles[0]
            tiles = tiles[2:]
        else:
            out.append(tiles.pop(0))
    return out + [0] * (4 - len(out)), points


def apply(board: list[int], direction: str) -> tuple[list[int], int]:
    """The board after sliding (row-major, 16 cells) and the points made."""
    rows = [board[r * 4 : r * 4 + 4] for r in range(4)]
    if direction in ("up", "down"):
        rows = [list(col) for col in zip(*rows, strict=True)]
    if direction in ("right", "down"):
        rows = [row[::-1] for row in rows]
    moved = [slide_row(row) for row in rows]
    rows, points = [row for row, _ in moved], sum(p for _, p in moved)
    if direction in ("right", "down"):
        rows = [row[::-1] for row in rows]
    if direction in ("up", "down"):
        rows = [list(col) for col in zip(*rows, strict=True)]
    return [v for row in rows for v in row], points


def spawn(board: list[int], seed: int) -> list[int]:
    """A 2 (one time in ten a 4) on a random empty cell, the same for the same board and seed."""
    rng = random.Random(f"{seed}:{board}")
    empty = [i for i, v in enumerate(board) if not v]
    board = list(board)
    board[rng.choice(empty)] = 4 if rng.random() < 0.1 else 2
    return board


def show(board: list[int]) -> str:
    rows = [" ".join(f"{v or '.':>3}" for v in board[r * 4 : r * 4 + 4]) for r in range(4)]
    return "Board:\n" + "\n".join(rows) + "\nYour move."


def can_move(board: list[int]) -> bool:
    return any(apply(board, d)[0] != board for d in DIRECTIONS)


class Game(TypedDict):
    board: list[int]
    seed: int
    score: int
    moves: int
    over: str  # "", "stuck", "invalid", "moves"
    messages: list[Any]


def build_graph(llm: art.ChatART) -> Any:
    model = llm.bind_tools([slide])

    def agent(state: Game) -> dict[str, Any]:
        reply = model.invoke([("system", SYSTEM), ("user", show(state["board"]))])
        return {"messages": [*state["messages"], reply]}

    def play(state: Game) -> dict[str, Any]:
        reply = state["messages"][-1]
        calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        direction = str(calls[0]["args"].get("direction", "")).strip().lower() if calls else ""
        if direction not in DIRECTIONS:
            return {"over": "invalid"}
        board, points = apply(state["board"], direction)
        if board == state["board"]:
            return {"over": "invalid"}
        board, moves = spawn(board, state["seed"]), state["moves"] + 1
        over = "moves" if moves >= MAX_MOVES else ("" if can_move(board) else "stuck")
        return {"board": board, "score": state["score"] + points, "moves": moves, "over": over}

    graph = StateGraph(Game)
    graph.add_node("agent", agent)
    graph.add_node("play", play)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "play")
    graph.add_conditional_edges("play", lambda state: END if state["over"] else "agent")
    return graph.compile().with_config(recursion_limit=4 * MAX_MOVES)


@art.reward
def game_score(state) -> dict[str, float]:
    """Sub-scores in [0, 1]: the points made (64 in 8 moves is a good game) and the largest tile (32 is)."""
    largest = max(state["board"])
    return {"score": min(state["score"] / 64, 1.0), "largest_tile": min(math.log2(largest) / 5, 1.0)}


def scenarios(seeds: range) -> list[dict[str, Any]]:
    games = []
    for s in seeds:
        board = spawn(spawn([0] * 16, s), s + 1)
        games.append({"id": f"game-{s}", "input": {"board": board, "seed": s, "score": 0, "moves": 0, "over": "",
                                                   "messages": []}})  # fmt: skip
    return games


def warmup_conversations(count: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """Positions of games played by a simple teacher (the first of left, down, right, up that moves, the corner
    strategy), each answered with its move."""
    examples = []
    for game in scenarios(range(seed * 100, seed * 100 + count)):
        board = game["input"]["board"]
        for _ in range(random.Random(len(examples)).randrange(3)):  # some positions a few moves in
            direction = next(d for d in ("left", "down", "right", "up") if apply(board, d)[0] != board)
            board = spawn(apply(board, direction)[0], game["input"]["seed"])
        direction = next(d for d in ("left", "down", "right", "up") if apply(board, d)[0] != board)
        call = {"id": "call_1", "type": "function", "function": {"name": "slide"}}
        call["function"]["arguments"] = json.dumps({"direction": direction})
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": show(board)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        examples.append({"tools": [SLIDE_TOOL], "messages": messages})
    return examples


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv, steps=30, warmup_steps=40)
    with trainable_model(args, f"2048-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[game_score],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args),
            eval_scenarios=scenarios(range(5000, 5016)),
            eval_every=10,
        )
        warm_up(trainer, warmup_conversations(seed=args.seed), args, echo=echo)
        history = trainer.train(scenarios(range(args.seed * 1000, args.seed * 1000 + 64)), steps=args.steps)
        return report(trainer, history, echo=echo, shown="a game")


if __name__ == "__main__":
    main()
