"""Long agent conversations in training: BFCL ``multi_turn_base`` runs of SmolLM2-135M-Instruct (3k-8k tokens of
function documentation, then calls, results and later user turns) trained on as they are, and where a step's time
and memory go.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/long_turns.py [--steps 2] [--num-generations 4] [--max-length 8192]

The graph, reward and cases are ``examples/multi_turn.py``'s (its first call of a user turn forced, later ones free,
at most 2 calls a turn here). Reward: the share of BFCL's checked turns passed, plus 0.01 x a random number: the
untrained model passes almost no turn and its runs of a case often make the same calls, and a group whose runs all
score the same trains nothing; what is measured here is what a step costs, not what it learns. Each step is one
training case x ``--num-generations`` runs, for ``--steps`` cases. ``GRPOConfig.max_length`` is raised from its
default 4096 to ``--max-length`` so the runs train whole (the table says whether any were cut).

Per step: the rollout's wall seconds, of which the HF engine's worker spent ``prefill s`` in prefill forwards and
``decode s`` in decode steps; the update's seconds (forward, backward, optimizer) and the whole learning phase's
(the update, the checkpoint, the engine's reload); the sequences
trained, the longest one's tokens, the tokens trained on. Peak memory: the process's peak RSS less the libraries'
page cache (``memory.py``'s measure), the engine, the trainer and the prefix cache together.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="steps (one training case each)")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="GRPOConfig's (off for SmolLM2 on CPU)")
    args = parser.parse_args()

    import bfcl_multi_turn as mt
    import multi_turn
    import torch
    from memory import library_cache_mib, peak_mib
    from prefix_cache import cpu_flags
    from transformers import AutoTokenizer

    import langgraph_art as art
    from langgraph_art.models.loading import resolve_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    room = args.max_tokens * 4 * 2
    train = [c for c in mt.load() if c.number % 5 and multi_turn.fits(c, tokenizer, room)]
    random.Random(args.seed).shuffle(train)
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home) as backend:
        model = art.TrainableModel(name="long-turns", project="bench", base_model="smollm2-135m").register(backend)
        llm = art.ChatART(model=model, temperature=0.7, max_tokens=args.max_tokens)  # type: ignore[call-arg]
        config = art.GRPOConfig(learning_rate=2e-4, max_length=args.max_length, seed=args.seed,
                                gradient_checkpointing=args.gradient_checkpointing or None)  # fmt: skip

        noise = random.Random(args.seed)

        @art.reward(weight=0.01)
        def tie_break(state: dict) -> float:
            """For this measurement only: a random number, so that every group has a spread and every step trains
            (what is measured is the cost of a step, not what it learns)."""
            return noise.random()

        rewards = [multi_turn.turns_right, tie_break]
        trainer = art.Trainer(multi_turn.build_graph(llm, max_calls=2), model, rewards=rewards,
                              num_generations=args.num_generations, scenarios_per_step=1, config=config,
                              max_concurrency=args.num_generations)  # fmt: skip
        for case in train[: args.steps]:
            m = trainer.train(multi_turn.scenarios([case]), steps=1, progress=False)[-1]  # the history so far
            rows.append((case.id, m))
            print(f"{case.id}: reward {m['reward/mean']:.2f} ± {m['reward/std']:.2f}, "
                  f"updated {m['train/updated']:.0f}, "
                  f"{m['time/step_s']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        libraries = library_cache_mib()
    peak = peak_mib()
    print(f"\nSmolLM2-135M-Instruct, BFCL multi_turn_base, 1 case x {args.num_generations} runs a step, up to "
          f"{args.max_tokens} tokens a call, max_length {args.max_length}, gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}, fp32, torch threads "
          f"{torch.get_num_threads()}; {cpu_flags()}")  # fmt: skip
    print("| case | reward | updated | rollout s | prefill s | decode s | update s | learn s | sequences | "
          "longest | trained tokens | truncated |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case_id, m in rows:
        print(f"| {case_id} | {m['reward/mean']:.2f} | {m['train/updated']:.0f} | {m['time/rollout_s']:.1f} | "
              f"{m.get('engine/prefill_s', 0):.1f} | {m.get('engine/decode_s', 0):.1f} | "
              f"{m.get('train/seconds', 0):.1f} | {m['time/learn_s']:.1f} | "
              f"{m.get('train/sequences', 0):.0f} | {m.get('train/longest_sequence', 0):.0f} | "
              f"{m.get('train/tokens', 0):.0f} | {m.get('train/truncated_tokens', 0):.0f} |")  # fmt: skip
    print(f"peak RSS {peak:.0f} MiB, of it the libraries' page cache {libraries:.0f} MiB: own {peak - libraries:.0f} "
          f"MiB; {time.perf_counter() - started:.0f} s in all")  # fmt: skip


if __name__ == "__main__":
    main()
