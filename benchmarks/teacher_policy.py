"""How good a policy is the privileged teacher? The base model shown the privileged prompt, sampling itself, against
the base model shown the question alone, on the held-out scenarios of the tasks distillation was measured on.

    python benchmarks/teacher_policy.py [--tasks demo bfcl email] [--runs 2]

On-policy distillation moves the student toward the teacher's distribution over the student's own tokens; it can
only teach what the teacher does better. This measures that directly: the same untrained SmolLM2-135M-Instruct, the
same graph, sampling settings and rewards as the task's example, each held-out scenario run ``--runs`` times with the
messages as the student sees them and as the teacher sees them (the task's privileged prompt applied to the input:
``units.answer_hint``, ``function_calling.answer_hint``, ``email_agent.relevant_facts``; for the email agent the hint
is on the question, as the teacher sees every call). Prints the held-out score of each, and the difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def hinted(scenarios: list[dict[str, Any]], prompt: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each scenario with its input messages rewritten by the privileged ``prompt`` (as dicts)."""
    out = []
    for scenario in scenarios:
        messages = [m if isinstance(m, dict) else {"role": _role(m[0]), "content": m[1]}
                    for m in scenario["input"]["messages"] if isinstance(m, dict | tuple)]  # fmt: skip
        assert len(messages) == len(scenario["input"]["messages"]), "a message the hint cannot rewrite"
        out.append({**scenario, "input": {**scenario["input"], "messages": prompt(scenario, messages)}})
    return out


def _role(kind: str) -> str:
    return {"human": "user", "ai": "assistant"}.get(kind, kind)


def task(name: str, home: str) -> tuple[Callable[[Any], Any], list[dict[str, Any]], Any, Any, dict[str, Any]]:
    """(graph builder from a ChatART, held-out scenarios, privileged prompt, the held-out reward, ChatART options)."""
    if name == "demo":
        from langgraph_art.demos.units import (
            HELD_OUT_PHRASINGS,
            MAX_TOKENS,
            answer_hint,
            build_agent,
            questions,
            right_arguments,
        )

        return build_agent, questions(40, HELD_OUT_PHRASINGS, seed=7), answer_hint, right_arguments, \
            {"temperature": 0.7, "max_tokens": MAX_TOKENS}  # fmt: skip
    if name == "bfcl":
        import bfcl
        import function_calling as fc

        _, held_out = bfcl.split(bfcl.load("simple_python"))
        return fc.build_graph, fc.scenarios(held_out), fc.answer_hint, fc.bfcl_accuracy, \
            {"temperature": 0.7, "max_tokens": 96}  # fmt: skip
    import email_agent as ea

    questions, tools = ea.open_inbox(home, 0)
    _, held_out = ea.split(questions, tools, 10)
    for scenario in held_out:  # the worked example's messages as dicts, so the hint can rewrite the question
        scenario["input"] = {"messages": _as_dicts(scenario["input"]["messages"])}
    return (lambda llm: ea.build_graph(llm, tools)), held_out, ea.relevant_facts, ea.correct_answer, \
        {"temperature": 0.7, "max_tokens": 48}  # fmt: skip


def _as_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    from langchain_core.messages import BaseMessage, convert_to_openai_messages

    return [m if isinstance(m, dict) else convert_to_openai_messages(m) if isinstance(m, BaseMessage)
            else {"role": _role(m[0]), "content": m[1]} for m in messages]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["demo", "bfcl", "email"])
    parser.add_argument("--runs", type=int, default=2, help="runs per held-out scenario")
    args = parser.parse_args()
    import langgraph_art as art

    print("| task | held-out scenarios x runs | student (the question) | teacher (privileged prompt) | gain | s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.tasks:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home) as backend:
            build, held_out, prompt, reward, sampling = task(name, home)
            model = art.TrainableModel(name=f"teacher-{name}", project="bench", base_model="smollm2-135m")
            model.register(backend)
            graph = build(art.ChatART(model=model, **sampling))
            scores = []
            for scenarios in (held_out, hinted(held_out, prompt)):
                groups = art.gather_groups(graph, scenarios, args.runs, max_concurrency=64, progress=False)
                art.score_groups(groups, [reward])
                scores.append(statistics.fmean(run.reward or 0.0 for g in groups for run in g.trajectories))
        print(f"| {name} | {len(held_out)} x {args.runs} | {scores[0]:.3f} | {scores[1]:.3f} | "
              f"{scores[1] - scores[0]:+.3f} | {time.perf_counter() - started:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
