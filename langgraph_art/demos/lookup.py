"""The tiny demo (`langgraph-art demo --tiny`): a small tool-using LangGraph agent on the embedded tiny model, on CPU.

The agent answers "What is the value of <key>?" by calling a ``lookup`` tool and reporting its result. The tiny
model first gets an SFT warm-up on one example conversation per key, then GRPO with two rewards: it called
``lookup`` with the right key, and its final answer contains the value. The same six questions are evaluated (4
runs each, never trained on) before the first step, every quarter of the steps and after the last; the demo prints
the reward curve, the evaluations and one question's run before and after training, and writes the curve as a PNG.

Why this recipe (measured on 2 cores; ``benchmarks/demo_recipe.py``, numbers in benchmarks/README.md, issues 16, 27):
- The warm-up is 50 SFT steps, short on purpose: it gets the agent to call the tool on some runs of a question and
  not on others (evaluation 0.25-0.54 of 2 on seeds 0-2), so GRPO's groups differ and every step learns; 60 steps
  took it to 0.92-1.33 (updating on 58-60 of them). After 100 SFT steps the agent already scored 2 of 2 on every
  run (1.88-2.0): every group scored the same and no GRPO step updated, so what the demo showed was SFT's. After 5
  or 20 every run scored 0: the same. RL cannot teach a key whose right call it never samples.
- At 1e-2 (the old rate) the warm-up sometimes never finds the tool: seed 2 stayed at a loss of ~5 and a reward of 0
  for 90 steps; 5e-3 converged on every seed tried.
- ``num_iterations=2`` (two updates on each step's runs): after a weaker warm-up, one update a step at 3e-4 moved
  the policy little (0.39 -> 1.09 in 150 steps of 16 runs), a higher rate made it worse (6e-4: 0.28 -> 0.42) and four
  updates a step helped (0.50 -> 1.21 in 60 steps); after this warm-up four pushed one seed down (evaluation 2.00 ->
  1.75), two did not (2.00 -> 2.00).
- Temperature 0.7, not 1.0: a tiny model's tail at 1.0 spoils a good share of otherwise right runs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import langgraph_art as art
from langgraph_art.rewards.render import render_transcript
from langgraph_art.types import ModelRef

VALUES = {
    "alpha": "river",
    "bravo": "copper",
    "charlie": "maple",
    "delta": "orbit",
    "echo": "lantern",
    "foxtrot": "velvet",
}


@tool
def lookup(key: str) -> str:
    """Look up the value stored under a key."""
    return VALUES.get(key.strip().lower(), "unknown key")


def tool_loop(model: Any, tools: list[Any]) -> Any:
    """The usual LangGraph agent: node "agent" calls ``model`` (a chat model that can emit calls of ``tools``),
    node "tools" runs them, back to "agent" until it answers without a tool call. Compiled."""

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def build_agent(llm: art.ChatART) -> Any:
    return tool_loop(llm.bind_tools([lookup]), [lookup]).with_config(recursion_limit=6)


@art.reward
def called_lookup(trajectory, scenario) -> float:
    """1 when the agent's first call is lookup with the asked key."""
    first = trajectory.turns()[0].output if trajectory.turns() else {}
    for call in first.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, TypeError):
            return 0.0
        return float(call["function"]["name"] == "lookup" and arguments.get("key") == scenario["key"])
    return 0.0


@art.reward
def answered(state, scenario) -> float:
    """1 when the final answer contains the value."""
    return float(VALUES[scenario["key"]] in str(state["messages"][-1].content))


def scenarios() -> list[dict[str, Any]]:
    return [
        {"id": key, "key": key, "input": {"messages": [("user", f"What is the value of {key}?")]}} for key in VALUES
    ]


def warmup_conversations() -> list[dict[str, Any]]:
    """One example per key; the warm-up is kept short, so the agent gets it right only part of the time."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up the value stored under a key.",
                "parameters": {"properties": {"key": {"type": "string"}}, "required": ["key"], "type": "object"},
            },
        }
    ]
    examples = []
    for key in VALUES:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"key": key})},
        }
        examples.append(
            {
                "tools": tools,
                "messages": [
                    {"role": "user", "content": f"What is the value of {key}?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": VALUES[key]},
                    {"role": "assistant", "content": f"The value of {key} is {VALUES[key]}."},
                ],
            }
        )
    return examples


def run_demo(
    *,
    steps: int = 60,
    warmup_steps: int = 50,
    warmup_lr: float = 5e-3,
    learning_rate: float = 3e-4,
    num_iterations: int = 2,
    num_generations: int = 16,
    scenarios_per_step: int = 2,
    temperature: float = 0.7,
    seed: int = 0,
    home: str | Path = ".art",
    engine: str = "hf",
    echo: Any = print,
) -> dict:
    """``engine="vllm"`` samples with vLLM (its CPU build here) on ``tiny-128``, the tiny model with head_dim 32.
    ``seed``: the LoRA's initialisation (sampling is not seeded)."""
    started = time.perf_counter()
    base_model = "tiny-128" if engine == "vllm" else "tiny"
    if engine == "vllm":  # the demo prints its own lines; vLLM's start-up notes and progress bars are noise here
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TQDM_DISABLE", "1")
    with art.LocalBackend(home=home, engine=engine) as backend:
        model = art.TrainableModel(name=f"demo-{int(time.time())}-{seed}", project="demo", base_model=base_model)
        model.register(backend)
        llm = art.ChatART(model=model, temperature=temperature, max_tokens=40)  # type: ignore[call-arg,arg-type]  # pydantic aliases
        config = art.GRPOConfig(
            learning_rate=learning_rate,
            num_iterations=num_iterations,
            lora_r=8,
            lora_alpha=16,
            per_device_train_batch_size=8,
            seed=seed,
        )
        agent = build_agent(llm)
        trainer = art.Trainer(
            agent,
            model,
            rewards=[called_lookup, answered],
            num_generations=num_generations,
            config=config,
            scenarios_per_step=scenarios_per_step,
            eval_scenarios=scenarios(),  # the same questions: these runs are scored, never trained on
            eval_generations=4,
            eval_every=max(steps // 4, 1),
        )
        question = scenarios()[0]  # one run of it before any training is shown next to one after
        untrained = art.evaluate(agent, scenarios(), [called_lookup, answered], num_generations=4,
                                 recorders=[model.recorder])  # fmt: skip
        first_run = next(g for g in untrained.groups if g.scenario_id == question["id"]).trajectories[0]
        losses = trainer.warmup(warmup_conversations(), steps=warmup_steps, learning_rate=warmup_lr)
        echo(f"warm-up: {warmup_steps} SFT steps, loss {losses[0]:.2f} -> {losses[-1]:.2f}")
        history = trainer.train(scenarios(), steps=steps)
        curve = [m["reward/mean"] for m in history]
        echo("\nsteps    reward (5-step mean, of 2)  " + "-" * 30)
        for first in range(0, len(curve), 5):
            value = statistics.fmean(curve[first : first + 5])
            echo(f"{first + 1:>3}-{min(first + 5, len(curve)):<3}  {value:5.2f}  " + "#" * round(value * 20))
        head, tail = statistics.fmean(curve[:5]), statistics.fmean(curve[-5:])
        evals = ", ".join(f"after step {e['iteration']}: {e['eval/reward/mean']:.2f}" for e in trainer.evals)
        echo(f"\nmean reward, first 5 steps: {head:.3f}; last 5 steps: {tail:.3f}")
        echo("evaluation (each question 4 times, runs not trained on): untrained: "
             f"{untrained.metrics['eval/reward/mean']:.2f}; after the warm-up, GRPO {evals}")  # fmt: skip
        after = one_run(trainer, trainer.evals[-1]["policy_step"], question["id"])
        echo(f"\none question before training (the untrained model, reward {first_run.reward or 0:.0f} of 2):")
        echo(render_transcript(first_run) or "  (no model call)")
        if after is not None:
            echo(f"\nthe same question after the warm-up and {len(curve)} GRPO steps (reward {after.reward:.0f} of 2):")
            echo(render_transcript(after))
        png = trainer.run_dir / "reward_curve.png"
        echo(f"\nreward curve: {png}\nmetrics: {trainer.run_dir / 'metrics.jsonl'}")
        echo(
            f"served now as {model.served_name!r} (= {ModelRef(model.served_name, backend.current_step(model))}); "
            f"{time.perf_counter() - started:.0f} s in all"
        )
        return {
            "curve": curve,
            "png": png,
            "first": head,
            "last": tail,
            "untrained": untrained.metrics["eval/reward/mean"],
            "evals": [e["eval/reward/mean"] for e in trainer.evals],
            "seconds": time.perf_counter() - started,
        }


def one_run(trainer: art.Trainer, policy_step: int, question: str) -> Any:
    """The first evaluation run of ``question`` at ``policy_step`` (None if there is none)."""
    runs = trainer.store.trajectories(split="eval", step=policy_step, scenario_id=question)
    return min(runs, key=lambda t: t.metadata.get("generation", 0), default=None)
