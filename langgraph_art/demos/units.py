"""The main job: a real model (SmolLM2-135M-Instruct, offline from PyPI) learns to use a tool right, by GRPO alone.

The LangGraph agent answers unit-conversion questions ("How many feet are in 3.5 meters?") with a ``convert(value,
from_unit, to_unit)`` tool whose units are codes ("m", "ft", "gal", ...): the ``agent`` node's call is forced
(``tool_choice="required"``, so every answer is a well-formed call), the ``tools`` node runs it. The untrained model
fills in the value well but picks units badly: it defaults to meters and mixes up which unit is which. The reward is
the share of the three arguments it got right; no warm-up, no examples, only its own samples scored.

Held out: the evaluation asks its questions in two phrasings training never uses, with other values, each question
once, at the sampling temperature, before the first step and after the last.

Recipe: the library's defaults (benchmarks/README.md, issue 35: chosen on this task): ``GRPOConfig()`` (learning
rate 4e-4, micro-batches of 8), ``ChatART(model=model, max_tokens=MAX_TOKENS)`` (temperature 0.7; a call takes ~50
tokens, and the cap stops a runaway number: in a CI run one of 8 runs wrote ``"value": 151.02888...`` for 7,890
tokens, to the end of the context, and the step took minutes) and ``Trainer``'s 1 question x 8 runs a step; 28 steps
(the 224 runs of issue 26's 14 steps of 2 questions).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import langgraph_art as art
from langgraph_art.rewards.render import render_transcript
from langgraph_art.teacher import hint_question
from langgraph_art.types import ModelRef

Unit = Literal["m", "ft", "in", "cm", "km", "mi", "kg", "lb", "l", "gal"]
NAMES = {"m": "meters", "ft": "feet", "in": "inches", "cm": "centimeters", "km": "kilometers", "mi": "miles",
         "kg": "kilograms", "lb": "pounds", "l": "liters", "gal": "gallons"}  # fmt: skip
IN_BASE = {"m": 1.0, "ft": 0.3048, "in": 0.0254, "cm": 0.01, "km": 1000.0, "mi": 1609.344, "kg": 1.0,
           "lb": 0.45359237, "l": 1.0, "gal": 3.785411784}  # fmt: skip
KIND = {"m": "length", "ft": "length", "in": "length", "cm": "length", "km": "length", "mi": "length",
        "kg": "mass", "lb": "mass", "l": "volume", "gal": "volume"}  # fmt: skip
PAIRS = [("m", "ft"), ("km", "mi"), ("kg", "lb"), ("l", "gal"), ("in", "cm"),
         ("ft", "m"), ("mi", "km"), ("lb", "kg"), ("gal", "l"), ("cm", "in")]  # fmt: skip
TRAIN_PHRASINGS = ["Convert {v} {f} to {t}.", "How many {t} are in {v} {f}?", "What is {v} {f} in {t}?"]
HELD_OUT_PHRASINGS = ["I have {v} {f}. How much is that in {t}?", "Please turn {v} {f} into {t}."]


@tool
def convert(value: float, from_unit: Unit, to_unit: Unit) -> str:
    """Convert a quantity from one unit to another."""
    if KIND[from_unit] != KIND[to_unit]:
        return f"cannot convert {NAMES[from_unit]} to {NAMES[to_unit]}"
    return f"{value} {from_unit} = {value * IN_BASE[from_unit] / IN_BASE[to_unit]:.4g} {to_unit}"


def questions(count: int, phrasings: list[str], seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        source, target = rng.choice(PAIRS)
        value: float = rng.choice([rng.randint(2, 500), round(rng.uniform(1, 99), 1)])
        text = rng.choice(phrasings).format(v=value, f=NAMES[source], t=NAMES[target])
        out.append({"id": f"q{seed}-{i}", "value": value, "from_unit": source, "to_unit": target,
                    "input": {"messages": [("user", text)]}})  # fmt: skip
    return out


def build_agent(llm: art.ChatART) -> Any:
    """``agent`` (one forced ``convert`` call) -> ``tools`` (runs it)."""
    caller = llm.bind_tools([convert], tool_choice="required", parallel_tool_calls=False)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [caller.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([convert]))
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def call_of(state: dict[str, Any]) -> dict[str, Any]:
    """The agent's call's arguments ({} if it made none)."""
    for message in state["messages"]:
        calls = getattr(message, "tool_calls", None)
        if calls:
            return dict(calls[0]["args"])
    return {}


@art.reward
def right_arguments(state, scenario) -> float:
    """The share of the call's three arguments that are right."""
    call = call_of(state)
    return sum(call.get(key) == scenario[key] for key in ("value", "from_unit", "to_unit")) / 3


def answer_hint(scenario: Mapping[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A privileged prompt for a teacher (``art.Teacher(prompt=answer_hint)``): the question, followed by the call
    that answers it."""
    units = f'from_unit="{scenario["from_unit"]}", to_unit="{scenario["to_unit"]}"'
    call = f"convert(value={scenario['value']}, {units})"
    return hint_question(messages, f" (The call: {call}.)")


def omp_threads() -> int | None:
    """``OMP_NUM_THREADS`` as a count (its first level when nested, ``"4,2"``), None when unset or not a number: on
    a machine shared with other torch processes, two threads each on two cores slow everyone down many times."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


MAX_TOKENS = 128  # a convert call is ~50 tokens; see the module's docstring


def run_demo(
    *,
    steps: int = 28,
    seed: int = 0,
    learning_rate: float | None = None,
    temperature: float | None = None,
    per_device_train_batch_size: int | None = None,
    num_generations: int | None = None,
    scenarios_per_step: int | None = None,
    max_tokens: int | None = None,
    home: str | Path = ".art",
    engine: str = "hf",
    threads: int | None = None,
    max_steps_off_policy: int = 0,
    config: Mapping[str, Any] | None = None,
    teacher: art.Teacher | None = None,
    eval_every: int | None = None,
    dynamic_sampling: int = 0,
    echo: Any = print,
) -> dict[str, Any]:
    """Train, evaluate before and after, print the curve and one held-out question before and after. ``threads``:
    torch's (default ``OMP_NUM_THREADS`` where set, else every core: one process does all the work). The
    hyper-parameters (``learning_rate`` ... ``per_device_train_batch_size``) are the library's defaults when None,
    ``max_tokens`` ``MAX_TOKENS``; ``benchmarks/defaults.py`` varies them. ``config``: further ``GRPOConfig`` fields
    and ``max_steps_off_policy``, ``teacher``, ``eval_every``, ``dynamic_sampling`` the ``Trainer``'s
    (``benchmarks/sampler_mismatch.py`` and ``benchmarks/distillation.py`` vary them)."""
    import torch

    started = time.perf_counter()
    torch.set_num_threads(threads or omp_threads() or os.cpu_count() or 1)
    if engine == "vllm":  # the demo prints its own lines; vLLM's start-up notes and progress bars are noise here
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TQDM_DISABLE", "1")
    train = questions(200, TRAIN_PHRASINGS, seed=1000 + seed)
    held_out = questions(40, HELD_OUT_PHRASINGS, seed=7)
    with art.LocalBackend(home=home, engine=engine) as backend:
        model = art.TrainableModel(name=f"units-{int(time.time())}-{seed}", project="demo", base_model="smollm2-135m")
        model.register(backend)
        sampling: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens or MAX_TOKENS}
        llm = art.ChatART(model=model, **{k: v for k, v in sampling.items() if v is not None})  # type: ignore[arg-type]
        tuned: dict[str, Any] = {
            "learning_rate": learning_rate,
            "per_device_train_batch_size": per_device_train_batch_size,
        }
        grpo = art.GRPOConfig(seed=seed, **{k: v for k, v in tuned.items() if v is not None}, **(config or {}))
        per_step: dict[str, Any] = {} if scenarios_per_step is None else {"scenarios_per_step": scenarios_per_step}
        trainer = art.Trainer(
            build_agent(llm),
            model,
            rewards=[right_arguments],
            num_generations=num_generations,
            config=grpo,
            eval_scenarios=held_out,
            max_steps_off_policy=max_steps_off_policy,
            teacher=teacher,
            eval_every=eval_every,
            dynamic_sampling=dynamic_sampling,
            max_concurrency=len(held_out),  # the 40 evaluation runs as one batch: twice as fast as 5 batches of 8
            **per_step,
        )
        echo(f"model ready in {time.perf_counter() - started:.0f} s; {steps} GRPO steps of "
             f"{trainer.scenarios_per_step} question(s) x {trainer.config.num_generations} runs, learning rate "
             f"{trainer.config.learning_rate:g}, temperature {llm.temperature}")  # fmt: skip
        history = trainer.train(train, steps=steps)
        curve = [m["reward/mean"] for m in history]
        before, after = trainer.evals[0], trainer.evals[-1]
        echo("\nsteps    train reward (of 1)  " + "-" * 30)
        width = max(1, len(curve) // 7)  # about seven lines
        for first in range(0, len(curve), width):
            value = statistics.fmean(curve[first : first + width])
            echo(f"{first + 1:>3}-{min(first + width, len(curve)):<3}  {value:5.2f}  " + "#" * round(value * 30))
        right_before, right_after = (all_right(trainer, e["policy_step"]) for e in (before, after))
        echo(f"\nheld-out evaluation ({len(held_out)} questions in phrasings never trained on):")
        echo(f"  arguments right: {before['eval/reward/mean']:.2f} before training -> {after['eval/reward/mean']:.2f}"
             f" after {len(curve)} steps; whole calls right: {right_before:.0%} -> {right_after:.0%}")  # fmt: skip
        shown = transcripts(trainer, before["policy_step"], after["policy_step"])
        if shown is not None:
            echo(f"\none held-out question before training (reward {shown[0].reward:.2f}):")
            echo(render_transcript(shown[0]))
            echo(f"\nthe same question after training (reward {shown[1].reward:.2f}):")
            echo(render_transcript(shown[1]))
        echo(f"\nreward curve: {trainer.run_dir / 'reward_curve.png'}\nmetrics: {trainer.run_dir / 'metrics.jsonl'}")
        seconds = time.perf_counter() - started
        settings = {"learning_rate": grpo.learning_rate, "temperature": llm.temperature, "max_tokens": llm.max_tokens,
                    "per_device_train_batch_size": grpo.per_device_train_batch_size,
                    "num_generations": trainer.config.num_generations,
                    "scenarios_per_step": trainer.scenarios_per_step, "steps": steps}  # fmt: skip
        echo(f"served now as {model.served_name!r} (= {ModelRef(model.served_name, backend.current_step(model))}); "
             f"{seconds:.0f} s in all")  # fmt: skip
        return {
            "curve": curve,
            "before": before["eval/reward/mean"],
            "after": after["eval/reward/mean"],
            "calls_right": (right_before, right_after),
            "settings": settings,
            "png": trainer.run_dir / "reward_curve.png",
            "seconds": seconds,
            "history": history,
            "evals": trainer.evals,
        }


def all_right(trainer: art.Trainer, policy_step: int) -> float:
    """The share of an evaluation's runs whose call was right in all three arguments."""
    runs = trainer.store.trajectories(split="eval", step=policy_step)
    return statistics.fmean(float(run.reward == 1.0) for run in runs) if runs else 0.0


def transcripts(trainer: art.Trainer, before: int, after: int) -> tuple[Any, Any] | None:
    """A held-out question the untrained model got wrong, as answered before and after (else any question)."""
    first = {run.scenario_id: run for run in trainer.store.trajectories(split="eval", step=before)}
    last = {run.scenario_id: run for run in trainer.store.trajectories(split="eval", step=after)}
    pairs = [(first[q], last[q]) for q in first if q in last]
    improved = [p for p in pairs if (p[0].reward or 0) < (p[1].reward or 0)]
    return (improved or pairs)[0] if pairs else None
