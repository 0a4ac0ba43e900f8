"""Scale-out on one machine, and a model of it on many: trainer step time over 1 and 2 data-parallel ranks (ours:
replicated LoRA + one gradient all-reduce; the peer: FSDP2 ``fully_shard`` over the base's decoder layers, same
step), rollout throughput with 1 and 2 Ray workers against in-process rollouts, and a step at 8 and 64 GPUs
modelled from the per-token costs measured here.

    python benchmarks/scale_out.py                        # all parts, ~6 min on 2 cores
    python benchmarks/scale_out.py --parts trainer --model smollm2-135m --steps 3

Trainer part: one step = ``--groups`` groups x ``--runs`` runs, each a ~40-token prompt and ``--tokens`` sampled
tokens (fixed random ids, sampler logprobs -1: a timing load; the loss, gradient and update are the real ones),
``per_device_train_batch_size=4``, lr 1e-5. Each configuration runs in fresh processes (the ranks, on loopback,
gloo): a warm-up step, then ``--steps`` timed steps; rank 0 reports. Threads: one rank takes every core
(``--threads``), two ranks one each: the same machine, split two ways.

Rollout part: the tiny lookup demo graph (``demos/lookup.py``) on the embedded server, ``--rollout-runs`` runs per
step; in process (``agather_groups``) and with ``RayRollouts(num_workers=1|2)``; runs/s and sampled tokens/s.

The model (``--model-only`` reprints it from the JSON the last run saved): see ``model_step`` below.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "scale_out.json"


# -- trainer: 1 and 2 ranks, ours and FSDP2 ------------------------------------------------------------------------
def timing_groups(tokenizer: Any, groups: int, runs: int, tokens: int) -> list[Any]:
    import torch

    from langgraph_art.types import NodeSpan, Trajectory, TrajectoryGroup, Turn

    out = []
    for g in range(groups):
        messages = [{"role": "user", "content": f"Question {g}: convert 12 miles to kilometres, then explain why."}]
        prompt = [
            int(i) for i in tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        ]
        trajectories = []
        for r in range(runs):
            high = min(20000, len(tokenizer))
            ids = torch.randint(10, high, (tokens,), generator=torch.Generator().manual_seed(1000 * g + r)).tolist()
            turn = Turn(id=f"t{g}-{r}", node="agent", prompt_token_ids=prompt, token_ids=ids, logprobs=[-1.0] * tokens,
                        params={"temperature": 1.0}, start_time=0.0)  # fmt: skip
            span = NodeSpan(id=f"s{g}-{r}", name="agent", turns=[turn])
            trajectories.append(Trajectory(id=f"r{g}-{r}", status="ok", reward=float(r % 3), spans=[span]))
        out.append(TrajectoryGroup(id=f"g{g}", trajectories=trajectories))
    return out


def rank_worker(args: argparse.Namespace) -> None:
    """One rank (started by ``trainer_part``): build the trainer, shard the base for FSDP2 if asked, time steps."""
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    from langgraph_art.config import GRPOConfig
    from langgraph_art.train.ranks import RankGroup, init_ranks, rank_device
    from langgraph_art.train.trainer import GRPOTrainer

    ranks = init_ranks() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else RankGroup()
    config = GRPOConfig(learning_rate=1e-5, per_device_train_batch_size=4, max_length=4096)
    with tempfile.TemporaryDirectory() as folder:
        device = rank_device(args.device)
        trainer = GRPOTrainer(args.model, config, checkpoint_dir=Path(folder) / "ckpt", ranks=ranks, device=device)
        if args.fsdp or args.no_shared_prompt:
            # a layer runs once per forward under FSDP2 (its backward frees the gathered weights): no shared-prompt
            # forward, which runs each layer twice (prompt, then the rest on its KV cache)
            trainer._token_logprobs = functools.partial(trainer._token_logprobs, share_prefix=False)
        if args.fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in trainer.model.model.layers:  # the frozen base's layers, sharded over the ranks
                fully_shard(layer)
        groups = timing_groups(trainer.tokenizer, args.groups, args.runs, args.tokens)
        trainer.step(groups)  # warm-up
        seconds, tokens = [], 0.0
        for _ in range(args.steps):
            started = time.perf_counter()
            result = trainer.step(groups)
            seconds.append(time.perf_counter() - started)
            tokens = result.metrics["train/tokens"]
        lora_bytes = sum(p.numel() * 4 for p in trainer.trainable_parameters())
        save_started = time.perf_counter()
        trainer.save_checkpoint()
        save_s = time.perf_counter() - save_started
    if ranks.writes:
        print(json.dumps({"step_s": statistics.median(seconds), "tokens": tokens, "lora_bytes": lora_bytes,
                          "save_s": save_s, "steps": seconds}))  # fmt: skip


def run_ranks(args: argparse.Namespace, ranks: int, threads: int, fsdp: bool, shared: bool) -> dict[str, Any]:
    from langgraph_art.train.process import rank_environments

    argv = [sys.executable, __file__, "--rank-worker", "--model", args.model, "--threads", str(threads),
            "--groups", str(args.groups), "--runs", str(args.runs), "--tokens", str(args.tokens),
            "--steps", str(args.steps), *(["--fsdp"] if fsdp else []), *([] if shared else ["--no-shared-prompt"]),
            *(["--device", args.device] if args.device else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    procs = [subprocess.Popen(argv, env={**env, **group}, stdout=subprocess.PIPE, text=True)
             for group in rank_environments(ranks)]  # fmt: skip
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"ranks={ranks} fsdp={fsdp} failed: {[p.returncode for p in procs]}")
    return dict(json.loads(outputs[0].strip().splitlines()[-1]))


def trainer_part(args: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 2
    half = max(1, cores // 2)
    configs = [("1 rank", 1, cores, False, True), ("1 rank, 1 thread", 1, 1, False, True),
               ("2 ranks (ours: replicated LoRA, all-reduce)", 2, half, False, True),
               ("2 ranks (ours, no shared-prompt forward)", 2, half, False, False),
               ("2 ranks (FSDP2 fully_shard layers)", 2, half, True, False)]  # fmt: skip
    rows = {}
    for name, ranks, threads, fsdp, shared in [c for c in configs if c[1] <= args.max_ranks]:
        rows[name] = {"ranks": ranks, "threads": threads, **run_ranks(args, ranks, threads, fsdp, shared)}
    print(f"\ntrainer step on {args.model}: {args.groups} groups x {args.runs} runs x {args.tokens} sampled tokens")
    print(f"{'configuration':46} {'step s':>8} {'tokens/s':>9}  steps")
    for name, row in rows.items():
        steps = ", ".join(f"{s:.2f}" for s in row["steps"])
        print(f"{name:46} {row['step_s']:8.2f} {row['tokens'] / row['step_s']:9.0f}  {steps}")
    return rows


# -- rollouts: in process and over Ray -------------------------------------------------------------------------
def rollout_part(args: argparse.Namespace) -> dict[str, Any]:
    """Runs/s and sampled tokens/s of one step's rollouts: in process, then over 1 and 2 Ray workers (same graph,
    same engine in this process); and how long the engine takes to load a checkpoint (what a replica does)."""
    import tempfile

    import httpx
    import ray

    import langgraph_art as art
    from langgraph_art.capture.rollout import agather_groups
    from langgraph_art.demos.lookup import scenarios
    from langgraph_art.models.loading import resolve_model
    from langgraph_art.sync import run_sync
    from langgraph_art.testing import random_lora

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    home = Path(tempfile.mkdtemp(prefix="scale-out-"))
    backend = art.LocalBackend(home=home)
    model = art.TrainableModel(name="bench", project="scale", base_model=args.rollout_model).register(backend)
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=args.tokens)
    chosen = scenarios()[:4]
    generations = max(1, args.rollout_runs // len(chosen))

    async def local() -> Any:
        return await agather_groups(graph, chosen, generations, max_concurrency=args.rollout_runs,
                                    recorders=[model.recorder], progress=False)  # fmt: skip

    def timed(gather: Any) -> tuple[float, int, int]:
        run_sync(gather())  # warm-up: workers started, graph loaded, engine warm; on Trainer.train's loop
        started = time.perf_counter()
        groups = run_sync(gather())
        seconds = time.perf_counter() - started
        runs = [t for g in groups for t in g.trajectories]
        return seconds, len(runs), sum(len(turn.token_ids) for t in runs for turn in t.turns())

    rows: dict[str, Any] = {}
    configs = [(tool_ms, name, workers) for tool_ms in sorted({0, args.tool_ms})
               for name, workers in (("in process", 0), ("Ray, 1 worker", 1), ("Ray, 2 workers", 2))]  # fmt: skip
    for tool_ms, name, workers in configs:
        graph = slow_graph(llm, tool_ms)
        if workers == 0:
            seconds, runs, tokens = timed(local)
        else:
            with art.RayRollouts(num_workers=workers) as rollouts:

                async def remote(rollouts: Any = rollouts, graph: Any = graph) -> Any:
                    batch = await rollouts.agather(graph, chosen, generations, max_concurrency=args.rollout_runs)
                    return batch.groups

                seconds, runs, tokens = timed(remote)
        rows[f"{name}, work {tool_ms} ms"] = {"seconds": seconds, "runs": runs, "tokens": tokens}
    folder = random_lora(Path(resolve_model(args.rollout_model)), home / "lora", seed=0, r=16,
                         target_modules="all-linear")  # fmt: skip
    url = backend.server(model.base_model).base_url
    started = time.perf_counter()
    httpx.post(f"{url}/adapters", json={"name": "scale/bench@1", "path": str(folder)}, timeout=120).raise_for_status()
    load_s = time.perf_counter() - started
    backend.close()
    ray.shutdown()
    print(f"\nrollouts of the lookup demo graph on {args.rollout_model}: {len(chosen)} scenarios x {generations} runs, "
          f"at most {args.tokens} tokens a turn, all at once")  # fmt: skip
    print(f"{'where':32} {'seconds':>8} {'runs/s':>7} {'tokens/s':>9}")
    for name, row in rows.items():
        rates = f"{row['runs'] / row['seconds']:7.1f} {row['tokens'] / row['seconds']:9.0f}"
        print(f"{name:32} {row['seconds']:8.2f} {rates}")
    print(f"checkpoint load into the engine (a replica's share of a step): {load_s:.3f} s")
    one = rows["in process, work 0 ms"]
    return {"rows": rows, "tokens": one["tokens"], "tokens_per_s": one["tokens"] / one["seconds"], "load_s": load_s}


@functools.cache
def work_per_ms() -> float:
    """How many ``sum(range(1000))`` one core does in a millisecond here (alone)."""
    started, rounds = time.perf_counter(), 0
    while time.perf_counter() - started < 0.2:
        sum(range(1000))
        rounds += 1
    return rounds / 200


def slow_graph(llm: Any, ms: int) -> Any:
    """The lookup demo agent after a node of ``ms`` milliseconds of pure-Python work (parsing, a local search: the
    CPU work real graphs do around model calls, holding the GIL)."""
    from langgraph.graph import START, MessagesState, StateGraph

    from langgraph_art.demos.lookup import build_agent

    rounds = int(ms * work_per_ms())  # a fixed amount of work, not a wall-clock wait (threads would overlap)

    def prepare(state: MessagesState) -> dict[str, Any]:
        for _ in range(rounds):
            sum(range(1000))
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("prepare", prepare)
    graph.add_node("agent", build_agent(llm))
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "agent")
    return graph.compile()


# -- the model ------------------------------------------------------------------------------------------------
def model_step(measured: dict[str, Any], gpus: int, faster: float = 1.0) -> dict[str, float]:
    """A step at ``gpus`` GPUs, half of them trainer ranks, half inference replicas (the layout of
    docs/guides/scale-out.md), for a step of fixed size (the runs and tokens measured here):

    - rollout: sampled tokens / (replicas x one engine's tokens/s);
    - learn: trained tokens / (ranks x one rank's tokens/s), plus what does not divide: the LoRA all-reduce (ring:
      2 (n-1)/n x bytes / link bandwidth), the checkpoint's save and its load into the replicas (in parallel);
    - ``faster``: the per-token rates multiplied by this (a GPU's over this CPU's), the fixed costs as measured
      here (disk and HTTP do not get faster with the accelerator). The speed-up at 64 is bounded by the fixed part.
    """
    trainer, rollout = measured["trainer"], measured["rollout"]
    one = trainer["1 rank"]
    rate = faster * one["tokens"] / one["step_s"]  # trained tokens/s of one rank
    bandwidth = measured.get("link_bytes_per_s", 25e9)  # InfiniBand HDR-class; NVLink is ~10x more
    ranks = replicas = max(1, gpus // 2)
    all_reduce = 2 * (ranks - 1) / ranks * one["lora_bytes"] / bandwidth if ranks > 1 else 0.0
    fixed = all_reduce + one["save_s"] + rollout["load_s"]
    learn = one["tokens"] / (ranks * rate) + fixed
    sample = rollout["tokens"] / (replicas * faster * rollout["tokens_per_s"])
    return {"gpus": gpus, "rollout_s": sample, "learn_s": learn, "fixed_s": fixed, "step_s": sample + learn}


def print_model(measured: dict[str, Any]) -> None:
    for faster, what in ((1.0, "per-token rates as measured here"), (100.0, "per-token rates x100 (a GPU)")):
        base = model_step(measured, 2, faster)
        print(f"\nmodelled step, half the GPUs trainer ranks and half inference replicas; {what}, fixed costs as "
              "measured here:")  # fmt: skip
        print(f"{'GPUs':>5} {'rollout s':>10} {'learn s':>9} {'of it fixed':>12} {'step s':>8} {'speed-up':>9}")
        for gpus in (2, 8, 64):
            row = model_step(measured, gpus, faster)
            print(f"{gpus:5d} {row['rollout_s']:10.3f} {row['learn_s']:9.3f} {row['fixed_s']:12.3f} "
                  f"{row['step_s']:8.3f} {base['step_s'] / row['step_s']:9.1f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="trainer,rollout", help="trainer, rollout (comma-separated)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rollout-runs", type=int, default=32)
    parser.add_argument("--rollout-model", default="smollm2-135m")
    parser.add_argument("--tool-ms", type=int, default=100, help="a node's pure-Python work per run (ms)")
    parser.add_argument("--device", default=None, help="the trainer's: cpu (default here), cuda (a GPU per rank)")
    parser.add_argument("--max-ranks", type=int, default=2, help="leave out configurations of more ranks")
    parser.add_argument("--model-only", action="store_true", help="reprint the model from scale_out.json")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-shared-prompt", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_worker(args)
        return
    measured = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.model_only:
        parts = args.parts.split(",")
        if "trainer" in parts:
            measured["trainer"] = trainer_part(args)
        if "rollout" in parts:
            measured["rollout"] = rollout_part(args)
        RESULTS.write_text(json.dumps(measured, indent=1))
    if "trainer" in measured and "rollout" in measured:
        print_model(measured)


if __name__ == "__main__":
    main()
