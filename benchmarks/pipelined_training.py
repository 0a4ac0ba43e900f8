"""Pipelined training: ``Trainer(max_steps_off_policy=1)`` against the synchronous loop (``=0``), same task, same run.

    OMP_NUM_THREADS=1 python benchmarks/pipelined_training.py [--model tiny] [--steps 16] [--pairs 2]

The digits task (reward: the share of digits in the answer; the untrained tiny model writes almost none) with the
embedded default: ``LocalBackend``, a one-node LangGraph agent calling ``ChatART``, 8 runs per step, lr 5e-3.
Each pair runs both settings from a fresh model (same seed), alternating which goes first. Reported per setting:
wall time of ``train(steps)``, mean reward of the first and last 4 steps, the mean staleness of the trained
runs (policy steps between the sampler's checkpoint and the one trained on), and how many steps updated (a step
whose group has all-equal rewards skips its update, so a run that collapses early has less to overlap and is
faster in either mode). ``--model tiny-5m --reward vowels --lr 1e-4``: every step is ~0.4 s of rollout and up
to ~0.4 s of learning, what pipelining can overlap.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art


@art.reward
def digits(state, scenario) -> float:  # type: ignore[no-untyped-def]
    text = "".join(str(state["messages"][-1].content).split())
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


@art.reward
def vowels(state, scenario) -> float:  # type: ignore[no-untyped-def]
    """The share of vowels: random models' runs differ in it, so every step trains (digits stay at 0 on tiny-5m)."""
    text = "".join(str(state["messages"][-1].content).split())
    return sum(c in "aeiouAEIOU" for c in text) / len(text) if text else 0.0


REWARDS = {"digits": digits, "vowels": vowels}


def agent(llm: art.ChatART) -> object:
    def answer(state: MessagesState) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", answer)
    graph.add_edge(START, "agent")
    return graph.compile()


def run(model_name: str, steps: int, lag: int, seed: int, reward: str, lr: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home) as backend:
        model = art.TrainableModel(name=f"digits-{lag}", project="bench", base_model=model_name).register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=32)  # type: ignore[call-arg,arg-type]
        config = art.GRPOConfig(learning_rate=lr, lora_r=8, lora_alpha=16, seed=seed)
        trainer = art.Trainer(
            agent(llm), model, rewards=[REWARDS[reward]], num_generations=8, config=config, max_steps_off_policy=lag
        )
        trainer.backend.trainer(model, trainer.config)  # load outside the timed part (both settings alike)
        scenarios = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]
        start = time.perf_counter()
        history = trainer.train(scenarios, steps=steps, progress=False)
        wall = time.perf_counter() - start
        rewards = [m["reward/mean"] for m in history]
        return {
            "wall_s": wall,
            "first": statistics.fmean(rewards[:4]),
            "last": statistics.fmean(rewards[-4:]),
            "stale": statistics.fmean(m["off_policy/steps_mean"] for m in history),
            "updates": sum(m["train/updated"] for m in history),
            "rollout_s": statistics.fmean(m["time/rollout_s"] for m in history),
            "learn_s": statistics.fmean(m["time/learn_s"] for m in history),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--reward", choices=sorted(REWARDS), default="digits")
    parser.add_argument("--lr", type=float, default=5e-3)
    args = parser.parse_args()
    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for pair in range(args.pairs):
        for lag in (0, 1) if pair % 2 == 0 else (1, 0):
            results[lag].append(run(args.model, args.steps, lag, seed=pair, reward=args.reward, lr=args.lr))
            r = results[lag][-1]
            print(f"pair {pair} max_steps_off_policy={lag}: {r['wall_s']:.1f} s, reward {r['first']:.2f} -> "
                  f"{r['last']:.2f}, staleness {r['stale']:.2f}, {r['updates']:.0f} updates, per step: rollout "
                  f"{r['rollout_s']:.2f} s, learning {r['learn_s']:.2f} s", flush=True)  # fmt: skip
    print(f"\nmodel={args.model} reward={args.reward} lr={args.lr} steps={args.steps} pairs={args.pairs}")
    print("| max_steps_off_policy | wall s (median) | vs synchronous | reward first 4 -> last 4 | mean staleness "
          "| steps that updated |")  # fmt: skip
    print("|---:|---:|---:|---|---:|---:|")
    base = statistics.median(r["wall_s"] for r in results[0])
    for lag, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        first, last = statistics.fmean(r["first"] for r in runs), statistics.fmean(r["last"] for r in runs)
        stale = statistics.fmean(r["stale"] for r in runs)
        updates = "/".join(f"{r['updates']:.0f}" for r in runs)
        print(f"| {lag} | {wall:.1f} | {wall / base:.2f}x | {first:.2f} -> {last:.2f} | {stale:.2f} | {updates} |")


if __name__ == "__main__":
    main()
