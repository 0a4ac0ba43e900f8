"""What the examples share: their command line, the model they train, and what they print at the end.

Every example runs offline on the tiny model (``--base-model tiny``, built locally, no download) and takes the
same options; ``--base-model`` also takes a hub id or a local folder (``from_pretrained``), ``--engine vllm`` samples
with vLLM (a GPU, or vLLM's CPU build beside this package).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import langgraph_art as art
from langgraph_art.rewards.render import render_transcript


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    *,
    steps: int,
    warmup_steps: int,
    options: Sequence[tuple[str, dict[str, Any]]] = (),
    **defaults: Any,
) -> argparse.Namespace:
    """The examples' shared options plus an example's own (``options``: (flag, argparse keywords)); ``defaults``
    override the other defaults (num_generations, learning_rate, temperature, scenarios_per_step, ...)."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--steps", type=int, default=steps, help="GRPO steps")
    parser.add_argument("--warmup-steps", type=int, default=warmup_steps, help="SFT warm-up steps before RL (0: none)")
    parser.add_argument(
        "--base-model",
        default=defaults.get("base_model", "tiny"),
        help="'tiny' (offline, random-init), 'smollm2-135m' (offline, real), a hub id, a local folder or a GGUF file",
    )
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="what samples the rollouts")
    parser.add_argument("--home", default=".art-examples", help="where checkpoints, runs and the store go")
    parser.add_argument("--seed", type=int, default=0, help="LoRA init and the examples' own randomness")
    parser.add_argument("--num-generations", type=int, default=defaults.get("num_generations", 8))
    parser.add_argument("--scenarios-per-step", type=int, default=defaults.get("scenarios_per_step", 2))
    parser.add_argument("--learning-rate", type=float, default=defaults.get("learning_rate", 3e-4))
    parser.add_argument("--num-iterations", type=int, default=defaults.get("num_iterations", 1),
                        help="updates per step on the same runs")  # fmt: skip
    parser.add_argument("--warmup-lr", type=float, default=defaults.get("warmup_lr", 1e-2))
    parser.add_argument("--temperature", type=float, default=defaults.get("temperature", 0.7))
    parser.add_argument("--max-tokens", type=int, default=defaults.get("max_tokens", 48))
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    return parser.parse_args(argv)


THREADS_OPTION = ("--threads", {"type": int, "default": None, "help": "torch threads (default: every core)"})
TEACHER_OPTIONS = [
    ("--teacher", {"default": "none", "help": "distil from this model shown the example's privileged prompt: 'base', "
                   "'policy' or a served model's name (none: GRPO alone; docs/guides/distillation.md)"}),
    ("--kl-coef", {"type": float, "default": 1.0, "help": "the teacher's weight beside the reward's"}),
]  # fmt: skip


def teacher_from(args: argparse.Namespace, prompt: Any) -> art.Teacher | None:
    """``--teacher``/``--kl-coef`` as an ``art.Teacher`` shown ``prompt(scenario, messages)``; None for 'none'."""
    return None if args.teacher == "none" else art.Teacher(args.teacher, prompt=prompt, kl_coef=args.kl_coef)


def use_threads(args: argparse.Namespace) -> None:
    """``--threads`` (default: every core; one process runs the model, the trainer and the graph)."""
    import torch

    torch.set_num_threads(args.threads or os.cpu_count() or 1)


@contextmanager
def trainable_model(args: argparse.Namespace, name: str, project: str) -> Iterator[tuple[art.TrainableModel, Any]]:
    """The model to train (registered with an embedded backend) and a ChatART that samples from it."""
    base_model = args.base_model
    if args.engine == "vllm" and base_model == "tiny":
        base_model = "tiny-128"  # vLLM's CPU attention needs head_dim >= 32: the tiny model with 128 hidden
    with art.LocalBackend(home=args.home, engine=args.engine) as backend:
        model = art.TrainableModel(name=name, project=project, base_model=base_model).register(backend)
        llm = art.ChatART(model=model, temperature=args.temperature, max_tokens=args.max_tokens)
        yield model, llm


def grpo_config(args: argparse.Namespace, **overrides: Any) -> art.GRPOConfig:
    return art.GRPOConfig(
        learning_rate=args.learning_rate, num_iterations=args.num_iterations, seed=args.seed, **overrides
    )


def held_out_trainer(
    graph: Any,
    model: art.TrainableModel,
    args: argparse.Namespace,
    *,
    rewards: list[Any],
    held_out: list[Any],
    eval_rewards: list[Any],
    teacher: art.Teacher | None = None,
) -> art.Trainer:
    """A ``Trainer`` with the shared options (``--num-generations``, ``--scenarios-per-step``, the GRPO options,
    ``--eval-every``, ``--eval-generations``) and a held-out evaluation on ``held_out``, scored by ``eval_rewards``;
    ``teacher``: on-policy distillation (``teacher_from``)."""
    return art.Trainer(
        graph,
        model,
        rewards=rewards,
        num_generations=args.num_generations,
        scenarios_per_step=args.scenarios_per_step,
        config=grpo_config(args),
        eval_scenarios=held_out,
        eval_every=args.eval_every,
        eval_generations=args.eval_generations,
        eval_rewards=eval_rewards,
        teacher=teacher,
    )


def warm_up(trainer: art.Trainer, examples: list[dict[str, Any]], args: argparse.Namespace, *, echo: Any) -> None:
    """The SFT warm-up before RL (none with ``--warmup-steps 0``), its loss printed."""
    if args.warmup_steps:
        losses = trainer.warmup(examples, steps=args.warmup_steps, learning_rate=args.warmup_lr)
        echo(f"warm-up: {args.warmup_steps} SFT steps, loss {losses[0]:.2f} -> {losses[-1]:.2f}")


def eval_runs(trainer: art.Trainer, evaluation: dict[str, Any]) -> list[Any]:
    """The runs of one of ``trainer.evals``: its policy step's stored eval runs, those of this evaluation of this
    trainer (two evaluations share a policy step when the step between them made no update)."""
    runs = trainer.store.trajectories(split="eval", step=evaluation["policy_step"])
    return [run for run in runs if run.metadata.get("iteration") == evaluation["iteration"]
            and run.metadata.get("training_run") == trainer.run_id]  # fmt: skip


def report(trainer: art.Trainer, history: list[dict], *, echo: Any = print, shown: str = "a run") -> dict[str, Any]:
    """Print the 5-step reward means, every evaluation and ``shown`` (one run of the last evaluation); return them
    with the file paths and that run."""
    curve = [m["reward/mean"] for m in history]
    fives = [statistics.fmean(curve[i : i + 5]) for i in range(0, len(curve), 5)]
    echo("train reward, 5-step means: " + " ".join(f"{v:.2f}" for v in fives))
    for e in trainer.evals:
        echo(f"eval after step {e['iteration']:>3}: reward {e['eval/reward/mean']:.3f} ({e['eval/runs']:.0f} runs)")
    run_dir = Path(trainer.run_dir)
    echo(f"curve: {run_dir / 'reward_curve.png'}\nmetrics: {run_dir / 'metrics.jsonl'}")
    runs = eval_runs(trainer, trainer.evals[-1]) if trainer.evals else []
    if runs:
        echo(f"{shown} after training (reward {runs[0].reward or 0:.2f}):\n{render_transcript(runs[0])}")
    return {"curve": curve, "evals": trainer.evals, "run_dir": run_dir, "last_run": runs[0] if runs else None,
            "history": history}  # fmt: skip
