"""Pipelined training: ``Trainer(max_steps_off_policy=1)`` against the synchronous loop (``=0``), same task, same run.

    OMP_NUM_THREADS=1 python benchmarks/pipelined_training.py [--model tiny-5m] [--steps 16] [--pairs 2]

The default task: tiny-5m, 2 prompts (scenarios) of 8 runs a step (16 runs: sampling and learning take about as
long, ~0.4 s each), reward = the share of vowels in the answer (random models' runs differ in it, so every group
trains), lr 3e-5 (at 1e-4 and above tiny-5m's policy collapses onto one answer within a few steps, and the skipped
steps make a run faster in either mode), a one-node sync LangGraph agent calling ``ChatART`` on the embedded
default (``LocalBackend``). ``--reward digits --model tiny --scenarios 1
--lr 5e-3`` is the earlier, smaller task (a step is 166 ms of rollout and 28 ms of learning: little to overlap).

Modes (``--modes``): ``0`` synchronous, ``1`` pipelined (``max_steps_off_policy=1``), and a ``p`` suffix for
``LocalBackend(trainer_process=True)`` (the trainer in a child process: in one process the engine and the trainer
take turns on the GIL). Each pair runs every mode from a fresh model (same seed), rotating which goes first.
Reported per mode: wall time of ``train(steps)`` (the trainer is loaded before, outside it), mean reward of the
first and last 4 steps, the mean staleness of the trained runs (policy steps between the sampler's checkpoint and
the one trained on), how many steps updated, and the mean rollout and learning seconds per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art
from langgraph_art.runlog import plot_rewards


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


PROMPTS = ["Write some numbers.", "Say something.", "Name a colour.", "Tell me a story.", "Count to five.",
           "Describe the sea.", "What is a cat?", "Write a word."]  # fmt: skip


def run(mode: str, seed: int, args: argparse.Namespace) -> dict[str, float]:
    lag, process = int(mode.rstrip("p")), mode.endswith("p")
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home, trainer_process=process) as backend:
        model = art.TrainableModel(name=f"bench-{lag}", project="bench", base_model=args.model).register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=32)  # type: ignore[call-arg,arg-type]
        config = art.GRPOConfig(learning_rate=args.lr, lora_r=8, lora_alpha=16, seed=seed)
        trainer = art.Trainer(
            agent(llm),
            model,
            rewards=[REWARDS[args.reward]],
            num_generations=8,
            config=config,
            scenarios_per_step=args.scenarios,
            max_concurrency=8 * args.scenarios,
            max_steps_off_policy=lag,
        )
        trainer.backend.trainer(model, trainer.config)  # load outside the timed part (both settings alike)
        scenarios = [{"id": f"p{i}", "input": {"messages": [("user", p)]}} for i, p in enumerate(PROMPTS)]
        start = time.perf_counter()
        history = trainer.train(scenarios, steps=args.steps, progress=False)
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
    parser.add_argument("--model", default="tiny-5m")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--reward", choices=sorted(REWARDS), default="vowels")
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--scenarios", type=int, default=2, help="scenarios (groups of 8 runs) per step")
    parser.add_argument("--modes", default="0,1,1p", help="0: synchronous, 1: pipelined; p: trainer process")
    args = parser.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m.rstrip("p") not in {"0", "1", "2"}]
    if bad:
        parser.error(f"--modes: {bad} are not 0, 1 or 2 with an optional p (trainer process), e.g. 0,1,1p")
    with tempfile.TemporaryDirectory() as tmp:  # matplotlib's import and first figure (~1 s): not in the first run
        plot_rewards([{"reward/mean": 0.0, "reward/std": 0.0}], Path(tmp) / "warm-up.png", "warm-up")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for pair in range(args.pairs):
        for mode in modes[pair % len(modes) :] + modes[: pair % len(modes)]:
            r = run(mode, seed=pair, args=args)
            results[mode].append(r)
            print(f"pair {pair} mode {mode}: {r['wall_s']:.1f} s, reward {r['first']:.2f} -> {r['last']:.2f}, "
                  f"staleness {r['stale']:.2f}, {r['updates']:.0f} updates, per step: rollout {r['rollout_s']:.2f} "
                  f"s, learning {r['learn_s']:.2f} s", flush=True)  # fmt: skip
    first = modes[0]
    print(f"\nmodel={args.model} reward={args.reward} lr={args.lr} scenarios={args.scenarios} steps={args.steps} "
          f"pairs={args.pairs}; vs {first}: median over pairs of wall / wall of mode {first} in the pair")  # fmt: skip
    header = ["mode", "max_steps_off_policy", "trainer process", "wall s (median)", f"vs {first}", "per pair"]
    header += ["reward first 4 -> last 4", "mean staleness", "steps that updated", "rollout s/step", "learn s/step"]
    print("| " + " | ".join(header) + " |")
    print("|---|---:|---|---:|---:|---|---|---:|---|---:|---:|")
    for mode, runs in results.items():
        ratios = [r["wall_s"] / b["wall_s"] for r, b in zip(runs, results[first], strict=True)]
        mean = {k: statistics.fmean(r[k] for r in runs) for k in ("first", "last", "stale", "rollout_s", "learn_s")}
        row = [
            mode,
            mode.rstrip("p"),
            "yes" if mode.endswith("p") else "no",
            f"{statistics.median(r['wall_s'] for r in runs):.1f}",
            f"{statistics.median(ratios):.2f}x",
            " ".join(f"{x:.2f}" for x in ratios),
            f"{mean['first']:.2f} -> {mean['last']:.2f}",
            f"{mean['stale']:.2f}",
            "/".join(f"{r['updates']:.0f}" for r in runs),
            f"{mean['rollout_s']:.2f}",
            f"{mean['learn_s']:.2f}",
        ]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
