"""Self-distillation with the answer in the teacher's prompt against GRPO alone, on the demo's task (issue 37).

    python benchmarks/distillation.py --arms grpo distill --seeds 0 1 2 [--steps 14] [--eval-every 7]

Each run is ``run_demo`` (``langgraph_art/demos/units.py``: SmolLM2-135M-Instruct, a forced ``convert`` call, 40
held-out questions in phrasings never trained on) in a fresh home, evaluated before the first step, every
``--eval-every`` steps and after the last. ``grpo`` is the library's defaults (the GRPO recipe); ``distill`` adds
``art.Teacher(model="policy", prompt=answer_hint, kl_coef=K)``: the policy itself, shown the call that answers the
question (``units.answer_hint``), scores each sampled token, and the reverse KL to it is a per-token advantage
beside the reward's (``distill-base``: the base model as that teacher). ``dynamic``: GRPO with
``Trainer(dynamic_sampling=2)``, up to 2 further scenarios a step in place of groups whose runs all scored the same
(their tokens count). Sampling costs the same per step in the GRPO and teacher arms (the teacher's forward is a
trainer-side cost, ``train/teacher/seconds``), so sampled tokens are counted from the runs
(``rollout/sampled_tokens``). It prints per run the held-out share of arguments right at each evaluation with the
sampled tokens so far, the mean ``train/teacher/kl`` and the seconds; then each arm's mean per evaluation and spread
over the seeds. Rows are merged into ``benchmarks/distillation.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("distillation.json")


def run_one(arm: str, seed: int, steps: int, eval_every: int, kl_coef: float) -> dict[str, Any]:
    import langgraph_art as art
    from langgraph_art.demos.units import answer_hint, run_demo

    teacher = None
    if arm.startswith("distill"):
        teacher = art.Teacher(model="base" if arm == "distill-base" else "policy", prompt=answer_hint, kl_coef=kl_coef)
    with tempfile.TemporaryDirectory() as home:
        result = run_demo(home=home, seed=seed, steps=steps, teacher=teacher, eval_every=eval_every,
                          dynamic_sampling=2 if arm == "dynamic" else 0, echo=lambda *_: None)  # fmt: skip
    history = result["history"]
    tokens = [0.0]
    for m in history:
        tokens.append(tokens[-1] + m["rollout/sampled_tokens"])
    evals = [(int(e["iteration"]), e["eval/reward/mean"], tokens[min(int(e["iteration"]), len(history))])
             for e in result["evals"]]  # fmt: skip
    kls = [m["train/teacher/kl"] for m in history if "train/teacher/kl" in m]
    return {
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "kl_coef": kl_coef if teacher else None,
        "evals": evals,  # (iteration, held-out share right, sampled tokens so far)
        "teacher_kl": statistics.fmean(kls) if kls else None,
        "updated": sum(1 for m in history if m.get("train/updated")),
        "seconds": result["seconds"],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=["grpo", "distill"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--eval-every", type=int, default=7)
    parser.add_argument("--kl-coef", type=float, default=1.0)
    args = parser.parse_args()
    print(f"the demo's task, {args.steps} steps, held-out evaluation every {args.eval_every}")
    print("| arm | seed | held-out (sampled tokens so far) | teacher kl | updated | s |\n|---|---:|---|---:|---:|---:|")
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    fresh = []
    for seed in args.seeds:
        for arm in args.arms:
            row = run_one(arm, seed, args.steps, args.eval_every, args.kl_coef)
            fresh.append(row)
            key = (arm, seed, args.steps, row["kl_coef"])
            rows = [r for r in rows if (r["arm"], r["seed"], r["steps"], r.get("kl_coef")) != key] + [row]
            RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
            shown = " -> ".join(f"{share:.3f} ({tokens / 1000:.1f}k)" for _, share, tokens in row["evals"])
            kl = "-" if row["teacher_kl"] is None else f"{row['teacher_kl']:.3f}"
            print(f"| {arm} | {seed} | {shown} | {kl} | {row['updated']} | {row['seconds']:.0f} |", flush=True)
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
