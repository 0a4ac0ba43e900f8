"""What continuing the sampled tokens saves a multi-turn agent: the email agent's GRPO step with ChatART sending each
earlier answer back with its sampled ``token_ids`` (``resend_token_ids=True``) against the template re-rendering it
(the default), same run.

    OMP_NUM_THREADS=2 python benchmarks/continued_turns.py [--base-model qwen2.5-coder-0.5b] [--num-generations 4]

Each arm runs ``examples/email_agent.py`` for ``--steps`` steps (``--scenarios-per-step`` questions x
``--num-generations`` runs, a held-out question x 1 run before and after, which this table ignores). Printed per arm:
the step's trained sequences and the runs they came from, the longest sequence, the tokens trained, the update's
seconds (``train/seconds``) and the rollout's. Re-rendered, a run whose model writes calls unlike its template
(Qwen2.5-Coder: fenced JSON against ``<tool_call>`` tags) trains one sequence per turn, each forwarding the whole
conversation so far; continued, one per run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def run_arm(resend: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    from langgraph_art.capture.chat_model import ChatART

    saved = ChatART.model_fields["resend_token_ids"].default
    ChatART.model_fields["resend_token_ids"].default = resend  # the example's ChatARTs take the field's default
    ChatART.model_rebuild(force=True)
    try:
        import email_agent

        home = tempfile.mkdtemp(prefix="continued-")
        argv = ["--base-model", args.base_model, "--steps", str(args.steps), "--held-out", "1",
                "--eval-generations", "1", "--num-generations", str(args.num_generations), "--scenarios-per-step",
                str(args.scenarios_per_step), "--home", home, "--seed", str(args.seed)]  # fmt: skip
        summary = email_agent.main(argv, echo=lambda *a: None)
    finally:
        ChatART.model_fields["resend_token_ids"].default = saved
        ChatART.model_rebuild(force=True)
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--base-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--scenarios-per-step", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    flags = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    have = [f for f in wanted if f" {f}" in flags]
    print(f"# {platform.processor() or platform.machine()}, flags: {' '.join(have)}; {args.base_model}")
    print("| arm | step | runs | sequences | longest | trained tokens | update s | rollout s |")
    print("|---|---|---|---|---|---|---|---|")
    for resend in (True, False):
        for r in run_arm(resend, args):
            arm = "continued (token_ids sent)" if resend else "re-rendered by the template"
            print(f"| {arm} | {r['iteration']} | {int(r['reward/runs_scored'])} | {int(r['train/sequences'])} | "
                  f"{int(r['train/longest_sequence'])} | {int(r['train/tokens'])} | {r['train/seconds']:.1f} | "
                  f"{r['time/rollout_s']:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
