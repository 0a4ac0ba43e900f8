"""A group's shared prompt run once in training (our GRPOTrainer) against one full forward per sequence (what TRL
and a bare forward+backward do), same run, same tokens, forward + backward.

    OMP_NUM_THREADS=1 python benchmarks/shared_prompt_training.py [--model tiny-5m] [--prompts 16,256,1024]

8 sequences = one prompt + 32 different completion tokens each (a GRPO group), LoRA as ``GRPOConfig()`` sets it.
"Shared": the prompt's forward runs once and each row continues from a copy of its KV cache (gradients flow back
through the copies). "Full": the 8 whole sequences in one batch. The two alternate, median of 8 after 2 warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.models.loading import resolve_model
from langgraph_art.train.trainer import GRPOTrainer

ROWS, COMPLETION = 8, 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-5m")
    parser.add_argument("--prompts", default="16,256,1024")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = GRPOTrainer(resolve_model(args.model), GRPOConfig(), checkpoint_dir=tempfile.mkdtemp())
    print(f"{args.model}: {ROWS} sequences x (prompt + {COMPLETION} tokens), forward + backward")
    print("| prompt tokens | shared prompt ms | full sequences ms | speed-up |")
    print("|---:|---:|---:|---:|")
    for length in [int(p) for p in args.prompts.split(",")]:
        generator = torch.Generator().manual_seed(length)
        prompt = torch.randint(10, 1000, (1, length), generator=generator).expand(ROWS, -1)
        ids = torch.cat([prompt, torch.randint(10, 1000, (ROWS, COMPLETION), generator=generator)], 1)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for share in (True, False):
                start = time.perf_counter()
                with trainer.adapter():
                    temp = torch.ones(ROWS)
                    logprobs = trainer._token_logprobs(ids, length, ids[:, length:], temp, share_prefix=share)[0]
                    logprobs.sum().backward()  # [8, 32] logprobs of the completion tokens
                times[share].append(time.perf_counter() - start)
        shared, full = (statistics.median(times[s][2:]) for s in (True, False))
        print(f"| {length} | {shared * 1e3:.0f} | {full * 1e3:.0f} | {full / shared:.2f}x |")


if __name__ == "__main__":
    main()
