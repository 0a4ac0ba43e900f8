"""Where does a privileged teacher's per-token signal sit, and does it agree with the reward? (issue 37)

    python benchmarks/teacher_signal.py [--tasks demo bfcl] [--steps N] [--hint call|required]

On-policy distillation adds ``kl_coef * (log pi_T(o_t) - log pi(o_t))`` to each sampled token's advantage
(``train/distillation.py``). This looks at that term token by token on the tasks distillation was measured on: the
task's example trains ``--steps`` steps (the demo 24: 24 questions x 8 runs; BFCL 8: 32 cases x 8 runs) with
``art.Teacher(model="base", prompt=<its privileged prompt>)`` at a learning rate of 1e-12, so every step samples
from the untrained SmolLM2-135M-Instruct (fresh scenarios each step, as in training), and the teacher's logprobs of
each trained turn are recorded as the trainer computes them. The trainer has no public hook for a held teacher's
logprobs (a served teacher's are kept on ``Turn.teacher_logprobs``), so this wraps ``GRPOTrainer._teach``; nothing
else is changed.

It prints, per task: the runs and the share right (every argument right: reward 1); the reverse KL per token; the
term's positive share (of its absolute sum: tokens the teacher likes better than the student did), the share of its
negative mass on tokens below -2 nats; the share of the term on runs the reward scores right (the teacher pulling
against the reward); and where in the call the term sits: an argument's value, the token after a value that
continues or closes the arguments (``,`` or ``}``), a token of whitespace alone, the rest. For BFCL an argument the
answer may leave out is marked ``optional``. Last, the teacher's KL per step: seed 0 draws the scenarios in the
order a seed-0 training run of the task draws them, so a trained run's ``train/teacher/kl`` (``distillation.py``
keeps it per step) can be set beside the untrained model's on the same scenarios.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

NEGLIGIBLE = 1e-6  # |teacher - sampler| below this: a token the grammar forced (both 0)


def record_teacher(records: list[dict[str, Any]], steps: list[dict[str, float]]) -> None:
    """Wrap the trainer's teacher step so each trained turn's tokens, sampler and teacher logprobs are kept, and
    each step's ``train/teacher/*`` metrics."""
    from langgraph_art.train import trainer

    original = trainer.GRPOTrainer._teach

    def teach(self: Any, groups: Any, advantages: Any) -> Any:
        out, stats = original(self, groups, advantages)
        steps.append(stats)
        for group in groups:
            for run in (r for r in group.completed() if r.id in advantages.by_trajectory):
                for turn in (t for t in run.trainable_turns(self.config.trainable_nodes) if t.id in out):
                    n = len(turn.token_ids) - min(turn.closing_tokens, len(turn.token_ids))
                    pieces = [self.tokenizer.decode(turn.token_ids[: i + 1]) for i in range(n)]
                    records.append({
                        "scenario": run.scenario_id, "reward": run.reward, "pieces": pieces,
                        "delta": [out[turn.id][i] - turn.logprobs[i] for i in range(n)],
                        "agreement": stats.get("train/teacher/reward_agreement"),
                    })  # fmt: skip
        return out, stats

    trainer.GRPOTrainer._teach = teach  # type: ignore[method-assign]


def argument_labels(text: str) -> list[tuple[str, str | None]]:
    """Each character of a call's text labelled ``(kind, parameter)``: ``key``, ``value``, ``after`` (the ``,`` or
    ``}`` that continues or closes the arguments after a parameter), or ``other`` (outside the arguments object)."""
    labels: list[tuple[str, str | None]] = [("other", None)] * len(text)
    start = text.find('"arguments"')
    start = text.find("{", start) if start >= 0 else -1
    if start < 0:
        return labels
    depth, key, wants_key, j = 0, None, True, start
    while j < len(text):
        ch = text[j]
        if depth == 1 and wants_key and ch == '"':  # a key: up to its closing quote
            end = text.find('"', j + 1)
            end = len(text) - 1 if end < 0 else end
            key = text[j + 1 : end]
            labels[j : end + 1] = [("key", key)] * (end + 1 - j)
            j = end + 1
            continue
        if ch == '"' and depth >= 1:  # a string value: up to its closing quote
            end = j + 1
            while end < len(text) and not (text[end] == '"' and text[end - 1] != "\\"):
                end += 1
            labels[j : end + 1] = [("value", key)] * (end + 1 - j)
            j = end + 1
            continue
        if ch in "{[":
            depth += 1
            labels[j] = ("other", None) if depth == 1 else ("value", key)
        elif ch in "}]":
            depth -= 1
            labels[j] = ("after", key) if depth == 0 else ("value", key)
            if depth == 0:
                break
        elif depth == 1 and ch == ",":
            labels[j], wants_key = ("after", key), True
        elif depth == 1 and ch == ":":
            labels[j], wants_key = ("other", key), False
        elif not ch.isspace():
            labels[j] = ("value", key)
        j += 1
    return labels


def where(record: dict[str, Any], i: int, labels: list[tuple[str, str | None]], optional: set[str]) -> str:
    """The part of the call token ``i`` belongs to (its first non-space character's label; ``labels``: the call's
    ``argument_labels``)."""
    pieces, text = record["pieces"], record["pieces"][-1]
    begin = len(pieces[i - 1]) if i else 0
    piece = pieces[i][begin:]
    if not piece.strip():
        return "whitespace"
    kind, key = next(
        (labels[k] for k in range(begin, min(len(pieces[i]), len(labels))) if not text[k].isspace()), ("other", None)
    )
    if kind == "other":
        return "other"
    return f"{kind}{' (optional)' if key in optional else ''}"


def run_task(name: str, steps: int, records: list[dict[str, Any]], hint: str = "call") -> dict[str, set[str]]:
    """Train ``steps`` steps at a learning rate of 1e-12 with the task's privileged base teacher (BFCL: shown the
    ``hint``, ``call`` or ``required``); returns each scenario's optional parameters (those its answer may leave
    out)."""
    import langgraph_art as art

    with tempfile.TemporaryDirectory() as home:
        if name == "demo":
            from langgraph_art.demos.units import answer_hint, run_demo

            run_demo(home=home, seed=0, steps=steps, learning_rate=1e-12, teacher=art.Teacher("base", answer_hint),
                     eval_every=10_000, echo=lambda *_: None)  # fmt: skip
            return {}
        import bfcl
        import function_calling

        argv = ["--seed", "0", "--home", home, "--steps", str(steps), "--learning-rate", "1e-12", "--teacher", "base",
                "--eval-every", "10000", "--eval-cases", "1", "--hint", hint]  # fmt: skip
        function_calling.main(argv, echo=lambda *_: None)
        return {
            case.id: bfcl.optional_parameters(case.functions, case.answers[0]) for case in bfcl.load("simple_python")
        }


def summarise(name: str, records: list[dict[str, Any]], optional: dict[str, set[str]]) -> None:
    deltas = [d for r in records for d in r["delta"] if abs(d) > NEGLIGIBLE]
    positive, negative = sum(d for d in deltas if d > 0), sum(d for d in deltas if d < 0)
    total = positive - negative
    on_right = sum(abs(d) for r in records if r["reward"] == 1.0 for d in r["delta"] if abs(d) > NEGLIGIBLE)
    agreements = [r["agreement"] for r in records if r["agreement"] is not None]
    print(f"\n## {name}: {len(records)} runs, {sum(r['reward'] == 1.0 for r in records) / len(records):.2f} right; "
          f"{len(deltas)} scored tokens, reverse KL {-sum(deltas) / len(deltas):.3f} a token")  # fmt: skip
    print(f"- positive share of the term: {positive / total:.2f}; negative mass below -2 nats: "
          f"{sum(d for d in deltas if d < -2) / negative:.2f} (on {sum(d < -2 for d in deltas)} tokens)")  # fmt: skip
    print(f"- share of the term on runs the reward scores right: {on_right / total:.2f}; "
          f"train/teacher/reward_agreement, mean over the runs: {statistics.fmean(agreements):.2f}")  # fmt: skip
    parts: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])  # |term| right, |term| wrong, sum
    for r in records:
        labels = argument_labels(r["pieces"][-1]) if r["pieces"] else []
        for i, d in enumerate(r["delta"]):
            if abs(d) > NEGLIGIBLE:
                part = parts[where(r, i, labels, optional.get(r["scenario"], set()))]
                part[0 if r["reward"] == 1.0 else 1] += abs(d)
                part[2] += d
    print("\n| where in the call | share of the term, right runs | wrong runs | sum (nats) |\n|---|---:|---:|---:|")
    for part, (right, wrong, signed) in sorted(parts.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        print(f"| {part} | {right / total:.2f} | {wrong / total:.2f} | {signed:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=["demo", "bfcl"], default=["demo", "bfcl"])
    parser.add_argument("--steps", type=int, default=None, help="steps per task (default: the demo 24, BFCL 8)")
    parser.add_argument("--hint", choices=["call", "required"], default="call",
                        help="BFCL's teacher is shown the reference call, or its required arguments only")  # fmt: skip
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    steps: list[dict[str, float]] = []
    record_teacher(records, steps)
    for name in args.tasks:
        records.clear()
        steps.clear()
        optional = run_task(name, args.steps or {"demo": 24, "bfcl": 8}[name], records, args.hint)
        summarise(name, records, optional)
        # the untrained model's KL on each step's scenarios: seed 0 draws them in the order a seed-0 training run does
        print("\ntrain/teacher/kl per step: " + ", ".join(f"{m['train/teacher/kl']:.2f}" for m in steps))


if __name__ == "__main__":
    main()
