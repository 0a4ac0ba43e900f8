"""Self-distillation with the answer in the teacher's prompt against GRPO alone (issue 37).

    python benchmarks/distillation.py --arms grpo distill --seeds 0 1 2 [--steps 14] [--eval-every 7]
    python benchmarks/distillation.py --task bfcl --arms distill-base --steps 15 --eval-every 5
    python benchmarks/distillation.py --task email --arms distill-base --steps 8 --eval-every 4
    python benchmarks/distillation.py --task bfcl --arms distill-base --steps 10 --seeds 0 --learning-rate 8e-4
    python benchmarks/distillation.py --task bfcl --arms distill-required --steps 10 --eval-every 5

``--task demo`` (the default): each run is ``run_demo`` (``langgraph_art/demos/units.py``: SmolLM2-135M-Instruct, a
forced ``convert`` call, 40 held-out questions in phrasings never trained on) in a fresh home, evaluated before the
first step, every ``--eval-every`` steps and after the last. ``grpo`` is the library's defaults (the GRPO recipe);
``distill`` adds ``art.Teacher(model="policy", prompt=answer_hint, kl_coef=K)``: the policy itself, shown the call
that answers the question (``units.answer_hint``), scores each sampled token, and the reverse KL to it is a per-token
advantage beside the reward's (``distill-base``: the base model as that teacher). ``dynamic``: GRPO with
``Trainer(dynamic_sampling=2)``, up to 2 further scenarios a step in place of groups whose runs all scored the same
(their tokens count). Sampling costs the same per step in the GRPO and teacher arms (the teacher's forward is a
trainer-side cost, ``train/teacher/seconds``), so sampled tokens are counted from the runs
(``rollout/sampled_tokens``). It prints per run the held-out share of arguments right at each evaluation with the
sampled tokens so far, the training reward and ``train/teacher/reward_agreement`` (first third of the steps -> last
third), the mean ``train/teacher/kl`` and the seconds; then each arm's mean per evaluation and spread over the seeds.
Rows, with every step's values of those metrics and the gradient norm, are merged into ``distillation.json``.

``--task bfcl``: ``examples/function_calling.py`` (BFCL ``simple_python``, its GRPO recipe, 80 held-out cases scored
by BFCL's accuracy) with ``--teacher`` and ``--dynamic-sampling`` per arm; its teacher is shown the case's reference
call (``function_calling.answer_hint``; ``distill-required``: the base model shown the call's required arguments
only, ``function_calling.required_hint``). ``--task email``: ``examples/email_agent.py`` (search, read, answer on
SmolLM2-135M; 10 held-out questions x 4 runs, scored by the fact in the answer), its teacher shown the relevant facts
(``email_agent.relevant_facts``: the search that finds the email, its id and the fact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("distillation.json")
STEP_KEYS = ["reward/mean", "train/grad_norm", "train/teacher/kl", "train/teacher/advantage_share",
             "train/teacher/reward_agreement"]  # fmt: skip


def run_one(
    task: str, arm: str, seed: int, steps: int, eval_every: int, kl_coef: float, learning_rate: float | None = None
) -> dict[str, Any]:
    teacher_model = None if not arm.startswith("distill") else "policy" if arm == "distill" else "base"
    if arm == "distill-required" and task != "bfcl":
        raise SystemExit(
            "--arms distill-required: a BFCL arm (its hint leaves out optional arguments); use --task bfcl"
        )
    started = time.perf_counter()
    score = "eval/reward/mean"  # the held-out share right (the demo, BFCL: their one evaluation reward)
    with tempfile.TemporaryDirectory() as home:
        argv = ["--seed", str(seed), "--home", home, "--steps", str(steps), "--eval-every", str(eval_every),
                "--teacher", teacher_model or "none", "--kl-coef", str(kl_coef)]  # fmt: skip
        argv += ["--learning-rate", str(learning_rate)] if learning_rate is not None else []
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        if task == "bfcl":
            import function_calling

            argv += ["--dynamic-sampling", "2" if arm == "dynamic" else "0"]
            argv += ["--hint", "required" if arm == "distill-required" else "call"]
            result = function_calling.main(argv, echo=lambda *_: None)
        elif task == "email":
            import email_agent

            result = email_agent.main(argv, echo=lambda *_: None)
            score = "eval/reward/correct_answer"  # the fact in the answer (its other evaluation rewards weigh 0)
        else:
            import langgraph_art as art
            from langgraph_art.demos.units import answer_hint, run_demo

            teacher = None if teacher_model is None else art.Teacher(teacher_model, answer_hint, kl_coef)  # type: ignore[arg-type]
            result = run_demo(home=home, seed=seed, steps=steps, teacher=teacher, eval_every=eval_every,
                              learning_rate=learning_rate,
                              dynamic_sampling=2 if arm == "dynamic" else 0, echo=lambda *_: None)  # fmt: skip
    history = result["history"]
    tokens = [0.0]
    for m in history:
        tokens.append(tokens[-1] + m["rollout/sampled_tokens"])
    evals = [(int(e["iteration"]), e[score], tokens[min(int(e["iteration"]), len(history))])
             for e in result["evals"]]  # fmt: skip
    kls = [m["train/teacher/kl"] for m in history if "train/teacher/kl" in m]
    # per step: what the update saw (the training reward, the teacher's KL, share and agreement with the reward)
    series = {key: [m.get(key) for m in history] for key in STEP_KEYS}
    return {
        "task": task,
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "kl_coef": kl_coef if teacher_model else None,
        **({"learning_rate": learning_rate} if learning_rate is not None else {}),  # None: the task's recipe
        "evals": evals,  # (iteration, held-out share right, sampled tokens so far)
        "teacher_kl": statistics.fmean(kls) if kls else None,
        "updated": sum(1 for m in history if m.get("train/updated")),
        # dynamic sampling's step counts, summed over the run: groups that scored all the same, further groups sampled
        "dynamic": {
            key: sum(m.get(f"dynamic_sampling/{key}", 0.0) for m in history)
            for key in ("uniform_groups", "extra_groups", "extra_uniform", "replaced")
        },
        "per_step": series,
        "seconds": time.perf_counter() - started,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def trend(row: dict[str, Any], key: str) -> str:
    """A per-step metric's mean over the run's first third of steps -> its last third ("-" where never logged)."""
    values = row["per_step"][key]
    third = max(len(values) // 3, 1)
    first, last = [v for v in values[:third] if v is not None], [v for v in values[-third:] if v is not None]
    return f"{statistics.fmean(first):.2f} -> {statistics.fmean(last):.2f}" if first and last else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["demo", "bfcl", "email"], default="demo")
    parser.add_argument("--arms", nargs="+", default=["grpo", "distill"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--eval-every", type=int, default=7)
    parser.add_argument("--kl-coef", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the task's recipe")
    args = parser.parse_args()
    print(f"{args.task}, {args.steps} steps, held-out evaluation every {args.eval_every}")
    print("| arm | seed | held-out (sampled tokens so far) | training reward | teacher kl | agreement | updated | s |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    fresh = []
    for seed in args.seeds:
        for arm in args.arms:
            row = run_one(args.task, arm, seed, args.steps, args.eval_every, args.kl_coef, args.learning_rate)
            fresh.append(row)
            key = (args.task, arm, seed, args.steps, row["kl_coef"], args.learning_rate)
            rows = [r for r in rows if (r.get("task", "demo"), r["arm"], r["seed"], r["steps"], r.get("kl_coef"),
                                        r.get("learning_rate")) != key]  # fmt: skip
            rows.append(row)
            RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
            shown = " -> ".join(f"{share:.3f} ({tokens / 1000:.1f}k)" for _, share, tokens in row["evals"])
            kl = "-" if row["teacher_kl"] is None else f"{row['teacher_kl']:.3f}"
            print(f"| {arm} | {seed} | {shown} | {trend(row, 'reward/mean')} | {kl} | "
                  f"{trend(row, 'train/teacher/reward_agreement')} | {row['updated']} | {row['seconds']:.0f} |",
                  flush=True)  # fmt: skip
    print("\n| arm | seeds | held-out mean at each evaluation (min .. max) |\n|---|---:|---|")
    for arm in args.arms:
        runs = [r for r in fresh if r["arm"] == arm]
        points = []
        for i in range(len(runs[0]["evals"])):
            shares = [r["evals"][i][1] for r in runs]
            points.append(f"step {runs[0]['evals'][i][0]}: {statistics.fmean(shares):.3f} "
                          f"({min(shares):.3f} .. {max(shares):.3f})")  # fmt: skip
        print(f"| {arm} | {len(runs)} | {'; '.join(points)} |")


if __name__ == "__main__":
    main()
