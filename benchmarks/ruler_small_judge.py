"""Can SmolLM2-135M judge its own email agent's runs? RULER with the small model as judge, against the facts.

    python benchmarks/ruler_small_judge.py [--seed 0] [--steps 8] [--max-groups 16] [--home DIR [--judge-only]]

Issue 36 asks for a RULER-judge variant of the email agent "if a judge this model can serve is useful at all". The
agent's groups come from a short training run of `examples/email_agent.py` (its defaults, ``--steps`` GRPO steps, so
that groups hold both right and wrong answers; the untrained agent is right on 2.5-7.5% of runs). Every stored group
is then scored again by ``art.RulerJudge`` with the untrained SmolLM2-135M as the judge (``ChatART`` at temperature
0, the verdict's JSON constrained by its schema, the default rubric: the judge is not told the fact, as in RULER).

Printed: how often the judge ranks a run that answered right above one in the same group that did not (pairs of
runs whose facts differ; 0.5 is a coin, ties count half), the same for a judge that scores at random and for the
example's code reward of reading the right email, the groups the judge could not score, and its seconds per group.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def pairwise(groups: list[list[tuple[float, float]]]) -> tuple[float, int]:
    """Over the pairs of runs of a group whose truth differs, the share where ``score`` orders them as ``truth``
    does (ties count half); and how many such pairs. Each group is a list of (truth, score)."""
    agree, pairs = 0.0, 0
    for group in groups:
        for (truth_a, score_a), (truth_b, score_b) in itertools.combinations(group, 2):
            if truth_a == truth_b:
                continue
            pairs += 1
            if score_a == score_b:
                agree += 0.5
            elif (score_a > score_b) == (truth_a > truth_b):
                agree += 1
    return (agree / pairs if pairs else float("nan")), pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps of the email agent before judging")
    parser.add_argument("--max-groups", type=int, default=16, help="groups judged (the last ones trained on)")
    parser.add_argument("--home", default=None, help="keep the run here (default: a temporary folder)")
    parser.add_argument("--judge-only", action="store_true", help="judge the groups of the run already in --home")
    args = parser.parse_args()
    if args.judge_only and not args.home:
        parser.error("--judge-only judges a run already made: name its folder with --home")

    import email_agent

    import langgraph_art as art
    from langgraph_art.store import TrajectoryStore

    home = args.home or tempfile.mkdtemp(prefix="ruler-small-")
    started = time.perf_counter()
    if not args.judge_only:
        email_agent.main(["--seed", str(args.seed), "--steps", str(args.steps), "--home", home], echo=lambda *a: None)
    trained = time.perf_counter() - started
    store = TrajectoryStore.for_project("examples", home=home)
    trained_on = {t.id for t in store.trajectories(split="train")}
    groups = [g for g in store.groups() if len(g.completed()) > 1 and all(t.id in trained_on for t in g.trajectories)]
    groups = groups[-args.max_groups :]
    truth = {t.id: t.rewards.get("correct_answer", 0.0) for g in groups for t in g.completed()}
    read = {t.id: t.rewards.get("read_the_email", 0.0) for g in groups for t in g.completed()}
    mixed = sum(len({truth[t.id] for t in g.completed()}) > 1 for g in groups)
    print(f"{len(groups)} groups from {args.steps} steps ({trained:.0f} s), {mixed} with right and wrong answers; "
          f"runs right {statistics.fmean(truth.values()):.2f}")  # fmt: skip

    with art.LocalBackend(home=home) as backend:
        judge_model = art.TrainableModel(name="judge", project="ruler-small", base_model="smollm2-135m")
        judge_model.register(backend)
        llm = art.ChatART(model=judge_model, temperature=0.0, max_tokens=1024)
        judge = art.RulerJudge(llm, cache=False, on_error="skip", max_retries=1)
        started = time.perf_counter()
        report = art.score_groups(groups, [judge])
        judged = time.perf_counter() - started
    skipped = report.skipped_groups
    scored = [[(truth[t.id], t.rewards[judge.name]) for t in g.completed() if judge.name in t.rewards] for g in groups]
    rng = random.Random(args.seed)
    coin = [[(truth[t.id], rng.random()) for t in g.completed()] for g in groups]
    reads = [[(truth[t.id], read[t.id]) for t in g.completed()] for g in groups]
    print("\n| scorer | agrees with the fact (pairs) | groups scored |")
    print("|---|---:|---:|")
    for name, rows in [("SmolLM2-135M as RULER judge", scored), ("random scores", coin), ("read_the_email", reads)]:
        share, pairs = pairwise(rows)
        print(f"| {name} | {share:.2f} ({pairs}) | {sum(bool(r) for r in rows)} of {len(groups)} |")
    calls = judge.usage.get("calls", 0)
    print(f"\njudge: {judged:.0f} s for {len(groups)} groups ({judged / max(len(groups), 1):.0f} s a group), "
          f"{calls:.0f} calls; groups skipped: {len(skipped)} {list(skipped.values())[:2]}")  # fmt: skip
    for g in groups[:2]:
        for t in g.completed():
            said = t.explanations.get(judge.name, "")
            print(f"  truth {truth[t.id]:.0f} judge {t.rewards.get(judge.name)}: {said!r}")


if __name__ == "__main__":
    main()
