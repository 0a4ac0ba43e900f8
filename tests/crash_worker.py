"""A training process to kill: ``python -m tests.crash_worker DIR STEPS [--slow-step N | --slow-save N]``.

Each step stores its group in the store (prints ``stored <i>`` after the commit), trains (prints ``in-step <n>``
from inside the step when asked to dwell there) and saves a checkpoint (prints ``writing <n>`` mid-write when
asked to dwell there, ``saved <n>`` after). On start it prints ``resumed <step>``. Having done STEPS steps it
writes ``final.pt`` in DIR straight from memory (not through the checkpoint code under test): per LoRA parameter, in
the optimizer's order, the tensor and AdamW's ``exp_avg``, ``exp_avg_sq`` and ``step``.
A dwell is a 30 s sleep after its line: the scenario (a process caught mid-step or mid-write), not a wait; the test
kills the process when it reads the line, so nothing depends on how long the dwell is.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from langgraph_art.config import GRPOConfig
from langgraph_art.models.tiny import tiny_model
from langgraph_art.store import TrajectoryStore
from langgraph_art.train import checkpoint
from langgraph_art.train import trainer as trainer_module
from langgraph_art.train.trainer import GRPOTrainer
from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn


def group(trainer: GRPOTrainer, step: int) -> TrajectoryGroup:
    tok = trainer.tokenizer
    prompt = list(
        tok.apply_chat_template([{"role": "user", "content": "go"}], add_generation_prompt=True, return_dict=False)
    )
    runs = []
    for i in range(4):
        ids = torch.randint(10, 2000, (6,), generator=torch.Generator().manual_seed(step * 10 + i)).tolist()
        with torch.no_grad(), trainer.adapter():
            logits = trainer.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
        turn = Turn(id=f"s{step}r{i}t", node="agent", prompt_token_ids=prompt, token_ids=ids, logprobs=logprobs)
        runs.append(
            Trajectory(
                id=f"s{step}r{i}",
                status="ok",
                reward=float(i % 2),
                spans=[NodeSpan(id=f"s{step}r{i}n", name="agent", turns=[turn])],
                metadata={"policy_step": step, "group_id": f"g{step}"},
            )
        )
    return TrajectoryGroup(id=f"g{step}", trajectories=runs, metadata={"policy_step": step})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--slow-step", type=int, default=-1)
    parser.add_argument("--slow-save", type=int, default=-1)
    args = parser.parse_args()
    root = Path(args.dir)
    store = TrajectoryStore(root / "store.sqlite")
    trainer = GRPOTrainer(str(tiny_model()), GRPOConfig(learning_rate=1e-2), checkpoint_dir=root / "ckpt")
    print(f"resumed {trainer.step_count}", flush=True)

    loss = trainer_module.policy_loss

    def dwelling_loss(*a, **k):
        if trainer.step_count + 1 == args.slow_step:
            print(f"in-step {args.slow_step}", flush=True)
            time.sleep(30)
        return loss(*a, **k)

    trainer_module.policy_loss = dwelling_loss
    save = checkpoint.save

    def dwelling_save(root_dir, step, write, state, keep=3):
        def slow_write(folder: Path) -> None:
            write(folder)
            if step == args.slow_save:
                print(f"writing {step}", flush=True)
                time.sleep(30)

        return save(root_dir, step, slow_write, state, keep)

    checkpoint.save = dwelling_save
    while trainer.step_count < args.steps:
        step = trainer.step_count
        g = group(trainer, step)
        store.add_group(g)
        print(f"stored {step}", flush=True)
        trainer.step([g])
        trainer.save_checkpoint()
        print(f"saved {trainer.step_count}", flush=True)
    final = [
        {"param": p.detach().clone(), **{k: v.clone() for k, v in trainer.optimizer.state[p].items()}}
        for p in trainer.trainable_parameters()
    ]
    torch.save(final, root / "final.pt")
    sys.exit(0)


if __name__ == "__main__":
    main()
