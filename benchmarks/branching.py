"""Branch groups vs whole-run groups at equal sampled tokens, on the real model (SmolLM2-135M-Instruct), 2 tasks.

- ``tictactoe``: examples/tic_tac_toe.py's game against a random opponent, its move forced as a ``move(square)`` call;
  reward win 1, draw 0.5, loss or an illegal move 0; held out: 72 other opponents, the same score.
- ``units``: a two-question conversation with the unit-conversion tool of the demo (``demos/units.py``): each user
  turn asks one conversion, the agent's call is forced; reward: the share of the six arguments right; held out:
  24 conversations in phrasings training never uses.

Arms, each from the same untrained model with the same seed: ``whole``: 2 scenarios x 4 runs a step; ``branch``:
1 scenario x 4 runs and 2 branch groups of 4 continuations (``art.Branching``), forked at a random later decision of
the step's runs. A continuation is shorter than a run, so both arms sample about the same tokens a step (measured:
``rollout/sampled_tokens``, summed, is in the table). Held-out evaluations after steps 0, half the steps and all
(tictactoe 16, units 12 steps). The evaluations sample at the training temperature, 0.7.

    python benchmarks/branching.py --seeds 0 1 2            # ~60 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import langgraph_art as art
from langgraph_art.demos import units

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import tic_tac_toe as ttt

# -- tic-tac-toe -------------------------------------------------------------------------------------------------


def ttt_graph(llm: art.ChatART) -> Any:
    """examples/tic_tac_toe.py's graph with the move forced (the 135M model rarely calls on its own)."""

    class Forced:
        def bind_tools(self, tools: list[Any]) -> Any:
            return llm.bind_tools(tools, tool_choice="required", parallel_tool_calls=False)

    return ttt.build_graph(Forced())


@art.reward
def game_score(state) -> float:
    return {"win": 1.0, "draw": 0.5}.get(state["result"], 0.0)


# -- three unit conversions in one conversation ---------------------------------------------------------------------


class Talk(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    questions: list[str]
    turn: int


def units_graph(llm: art.ChatART) -> Any:
    caller = llm.bind_tools([units.convert], tool_choice="required", parallel_tool_calls=False)

    def agent(state: Talk) -> dict[str, Any]:
        return {"messages": [caller.invoke(state["messages"])]}

    def next_turn(state: Talk) -> dict[str, Any]:
        turn = state["turn"] + 1
        return {"turn": turn, "messages": [HumanMessage(state["questions"][turn])]}

    graph = StateGraph(Talk)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([units.convert]))
    graph.add_node("next_turn", next_turn)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_conditional_edges("tools", lambda s: END if s["turn"] + 1 >= len(s["questions"]) else "next_turn")
    graph.add_edge("next_turn", "agent")
    return graph.compile().with_config(recursion_limit=16)


TURNS = 2  # questions per conversation (3 took 100 s a step here)


def conversations(count: int, phrasings: list[str], seed: int) -> list[dict[str, Any]]:
    asked = units.questions(count * TURNS, phrasings, seed)
    out = []
    for i in range(count):
        these = asked[i * TURNS : (i + 1) * TURNS]
        texts = [q["input"]["messages"][0][1] for q in these]
        out.append({"id": f"c{seed}-{i}", "questions": these,
                    "input": {"messages": [("user", texts[0])], "questions": texts, "turn": 0}})  # fmt: skip
    return out


@art.reward
def arguments_right(state, scenario) -> float:
    """The share of the conversation's arguments right (three per question; a missing call gets none)."""
    calls = [m.tool_calls[0]["args"] for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    right = 0
    for question, call in zip(scenario["questions"], calls, strict=False):
        right += sum(call.get(key) == question[key] for key in ("value", "from_unit", "to_unit"))
    return right / (3 * len(scenario["questions"]))


GENERATIONS = 4  # runs a group (8 was twice the time this CPU had)
TASKS: dict[str, dict[str, Any]] = {
    "tictactoe": dict(
        graph=ttt_graph,
        reward=game_score,
        train=lambda s: ttt.scenarios(range(s * 1000, s * 1000 + 64)),
        held_out=lambda: ttt.scenarios(range(500, 572)),
        max_tokens=64,
        steps=16,
    ),
    "units": dict(
        graph=units_graph,
        reward=arguments_right,
        train=lambda s: conversations(60, units.TRAIN_PHRASINGS, 1000 + s),
        held_out=lambda: conversations(24, units.HELD_OUT_PHRASINGS, 7),
        max_tokens=48,
        steps=12,
    ),
}


def run_arm(task: str, arm: str, seed: int, steps: int, home: Path) -> dict[str, Any]:
    spec = TASKS[task]
    started = time.perf_counter()
    with art.LocalBackend(home=home) as backend:
        model = art.TrainableModel(name=f"{task}-{arm}-{seed}", project="branching", base_model="smollm2-135m")
        model.register(backend)
        llm = art.ChatART(model=model, temperature=0.7, max_tokens=spec["max_tokens"])  # type: ignore[call-arg,arg-type]
        branching = (
            art.Branching(groups_per_step=2, num_generations=GENERATIONS, seed=seed) if arm == "branch" else None
        )
        trainer = art.Trainer(
            spec["graph"](llm),
            model,
            rewards=[spec["reward"]],
            num_generations=GENERATIONS,
            scenarios_per_step=1 if branching else 2,
            config=art.GRPOConfig(learning_rate=4e-4, per_device_train_batch_size=8, seed=seed),
            eval_scenarios=spec["held_out"](),
            eval_every=max(steps // 2, 1),
            max_concurrency=64,
            branching=branching,
            langfuse=False,
            wandb=False,
        )
        history = trainer.train(spec["train"](seed), steps=steps, progress=False)
        tokens = [0.0]
        for m in history:
            tokens.append(tokens[-1] + m["rollout/sampled_tokens"])
        evals = [{"step": e["iteration"], "tokens": tokens[e["iteration"]], "reward": e["eval/reward/mean"]}
                 for e in trainer.evals]  # fmt: skip
        return {"task": task, "arm": arm, "seed": seed, "evals": evals, "tokens": tokens[-1],
                "train_reward": [m["reward/mean"] for m in history],
                "branch_reward": [m.get("branch/reward/mean") for m in history],
                "depth_mean": [m.get("branch/depth_mean") for m in history],
                "step_s": statistics.median(m["time/step_s"] for m in history),
                "wall_s": time.perf_counter() - started}  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| task | arm | seed | held-out after steps (tokens sampled) | gain | step median | wall |",
             "|---|---|---:|---|---:|---:|---:|"]  # fmt: skip
    for r in results:
        curve = ", ".join(f"{e['reward']:.3f} ({e['tokens'] / 1000:.1f}k)" for e in r["evals"])
        gain = r["evals"][-1]["reward"] - r["evals"][0]["reward"]
        lines.append(f"| {r['task']} | {r['arm']} | {r['seed']} | {curve} | {gain:+.3f} | {r['step_s']:.1f} s | "
                     f"{r['wall_s'] / 60:.1f} min |")  # fmt: skip
    lines += ["", "| task | arm | mean gain (min, max) | tokens sampled (mean) | final held-out (mean) |",
              "|---|---|---|---:|---:|"]  # fmt: skip
    for task in dict.fromkeys(r["task"] for r in results):
        for arm in ("whole", "branch"):
            mine = [r for r in results if r["task"] == task and r["arm"] == arm]
            if not mine:
                continue
            gains = [r["evals"][-1]["reward"] - r["evals"][0]["reward"] for r in mine]
            lines.append(f"| {task} | {arm} | {statistics.fmean(gains):+.3f} ({min(gains):+.3f}, {max(gains):+.3f}) | "
                         f"{statistics.fmean(r['tokens'] for r in mine) / 1000:.1f}k | "
                         f"{statistics.fmean(r['evals'][-1]['reward'] for r in mine):.3f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="steps a run (default: tictactoe 16, units 12)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--home", type=Path, default=Path("runs/branching"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("branching.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    for task in args.tasks:
        for seed in args.seeds:
            for arm in ("whole", "branch"):
                results.append(run_arm(task, arm, seed, args.steps or TASKS[task]["steps"], args.home))
                args.out.write_text(json.dumps(results, indent=1))  # kept as it goes: a killed run keeps its arms
                print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
