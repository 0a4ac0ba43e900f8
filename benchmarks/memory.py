"""Peak memory of 3 GRPO steps against the size of the weights: our embedded loop (LocalBackend + Trainer) and TRL's
GRPOTrainer on the same model and task, each in a fresh process (peak RSS only grows), same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory.py [--models tiny-5m,qwen-0.5b-shape] [--who ours,trl]

``ours`` is the default (the 0.5B shape trains on the engine's weights: ``share_weights`` is on from 256 MiB),
``ours-copy`` the same run with ``share_weights=False`` (merged adapters, the trainer's own copy of the model),
``ours-lean`` with ``gradient_checkpointing=True`` (by default, on CPU, a step trains without it where its activations
fit in half the available memory: faster, and the memory is spent; ``train/activations.py``).

The task is grpo_vs_trl.py's: 1 prompt x 8 runs x 32 new tokens, LoRA r=8 on all linear layers, fp32 on CPU.
``qwen-0.5b-shape`` is built offline (benchmarks/engines.py). TRL needs ``pip install -e ".[bench]"``.
``idle`` is the same process with everything imported and the model not loaded: the floor under both.
``libraries`` is the page cache of the mapped code (shared objects and the interpreter) that ``peak`` counts: how
much varies with the machine's cache, not with us (libraries freshly written by pip sit in large folios and count
~45 MiB more than once read back from disk); ``own`` is ``peak - libraries``, what the run itself held at its peak
(anonymous memory and the mapped weights included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
STEPS, N, NEW_TOKENS = 3, 8, 32
PROMPT = [{"role": "user", "content": "Write some numbers."}]


def peak_mib() -> float:
    """This process's peak RSS: ``VmHWM`` (Linux; starts afresh at exec), else ``ru_maxrss``, which Linux carries
    over from the process that forked this one: a parent holding GBs would read as this one's peak."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")
MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def library_cache_mib() -> float:
    """The page cache of this process's mapped code, in MiB: per mapping of a shared object or of the interpreter,
    its resident pages less the anonymous ones (a library's relocated data is the process's own). What was read from
    the files, so it only grows while the libraries stay mapped: read after the run, it bounds what ``VmHWM`` counted
    of them at the peak. 0 without ``/proc/self/smaps`` (not Linux)."""
    smaps = Path("/proc/self/smaps")
    if not smaps.is_file():
        return 0.0
    interpreter = os.path.realpath(sys.executable)
    total_kib, counted = 0, False
    for line in smaps.read_text().splitlines():
        if MAPPING.match(line):  # a mapping's header: address range, perms, offset, device, inode, [path]
            parts = line.split(maxsplit=5)
            path = parts[5] if len(parts) == 6 else ""
            counted = bool(SHARED_OBJECT.search(path)) or path == interpreter
        elif counted and line.startswith(("Rss:", "Anonymous:")):
            kib = int(line.split()[1])
            total_kib += kib if line.startswith("Rss:") else -kib
    return total_kib / 1024


def vowels(text: str) -> float:
    """The share of vowels: random models' runs differ in it, so every group has a spread and every step trains
    (a reward a random model never earns, like the digits task's, would skip all three steps)."""
    chars = "".join(text.split())
    return sum(c in "aeiouAEIOU" for c in chars) / len(chars) if chars else 0.0


def run_ours(model: Path, share_weights: bool | None = None, checkpointing: bool | None = None) -> dict[str, float]:
    import fastapi  # noqa: F401 - imported before `idle` is read, so idle holds the libraries, not the model
    import peft  # noqa: F401
    import transformers  # noqa: F401
    import uvicorn  # noqa: F401

    import langgraph_art as art
    from langgraph_art.testing import one_agent_graph

    @art.reward
    def share(state: Any) -> float:
        message = state["messages"][-1]  # its text, or (random models emit tool-call tags) its tool calls
        return vowels(str(message.content or message.tool_calls))

    idle = peak_mib()
    options = {} if share_weights is None else {"share_weights": share_weights}
    with tempfile.TemporaryDirectory() as home, art.LocalBackend(home=home, engine_options=options) as backend:
        policy = art.TrainableModel(name="mem", project="bench", base_model=str(model)).register(backend)
        llm = art.ChatART(model=policy, temperature=1.0, max_tokens=NEW_TOKENS)  # type: ignore[call-arg,arg-type]
        config = art.GRPOConfig(learning_rate=1e-4, per_device_train_batch_size=N, lora_r=8, lora_alpha=16,
                                gradient_checkpointing=checkpointing)  # fmt: skip
        trainer = art.Trainer(one_agent_graph(llm), policy, rewards=[share], num_generations=N, config=config)
        scenarios = [{"id": "numbers", "input": {"messages": [("user", PROMPT[0]["content"])]}}]
        history = trainer.train(scenarios, steps=STEPS, progress=False)
        libraries = library_cache_mib()  # the libraries all ran by now; closing maps nothing new worth counting
        engine = backend.server(str(model)).engine
        with backend.policies(str(model)).lease("bench", "mem") as live:
            shares = float(live.shares_weights and live.model is engine._lm)
    updates = sum(int(m["train/updated"]) for m in history)
    print("rewards", [m.get("reward/mean") for m in history], [m.get("reward/std") for m in history], file=sys.stderr)
    peak = peak_mib()
    return {"idle_mib": idle, "peak_mib": peak, "libraries_mib": libraries, "own_peak_mib": peak - libraries,
            "updates": float(updates), "shared": shares}  # fmt: skip


def run_trl(model: Path) -> dict[str, float]:
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    def rewards(completions: list[Any], **_: Any) -> list[float]:
        return [vowels(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    idle = peak_mib()
    args = TRLConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, use_vllm=False, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=N, num_generations=N, max_completion_length=NEW_TOKENS, learning_rate=1e-4,
        beta=0.0, loss_type="grpo", report_to="none", max_steps=STEPS, save_strategy="no", logging_steps=1000,
        temperature=1.0, disable_tqdm=True, seed=0,
    )  # fmt: skip
    data = Dataset.from_list([{"prompt": PROMPT}] * (STEPS * N))
    trainer = TRLTrainer(model=str(model), reward_funcs=[rewards], args=args, train_dataset=data,
                         peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))  # fmt: skip
    trainer.train()
    libraries, peak = library_cache_mib(), peak_mib()
    return {"idle_mib": idle, "peak_mib": peak, "libraries_mib": libraries, "own_peak_mib": peak - libraries,
            "steps": float(STEPS)}  # fmt: skip


def weights_mib(model: Path) -> float:
    return sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-5m,qwen-0.5b-shape")
    parser.add_argument("--who", default="ours,ours-copy,trl")
    parser.add_argument("--one", nargs=2, metavar=("WHO", "MODEL_FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # the child process: one measurement, printed as JSON
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        who, folder = args.one
        runs = {"ours": run_ours, "ours-copy": lambda path: run_ours(path, share_weights=False), "trl": run_trl,
                "ours-lean": lambda path: run_ours(path, checkpointing=True)}  # fmt: skip
        result = runs[who](Path(folder))
        print("RESULT " + json.dumps(result))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from engines import model_folder

    rows = []
    for name in args.models.split(","):
        folder = model_folder(name)
        weights = weights_mib(folder)
        for who in args.who.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", who, str(folder)], capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode or not lines:
                print(f"{name} {who}: failed\n{out.stderr[-2000:]}")
                continue
            result = json.loads(lines[-1][len("RESULT ") :])
            rows.append((name, who, weights, result))
            print(f"  {name} {who}: {result}", flush=True)
    print(f"\n{STEPS} GRPO steps of {N} runs x {NEW_TOKENS} tokens, fp32, CPU; MiB of peak RSS")
    print("| model | who | weights file | idle (imports) | peak | peak / weights | (peak - idle) / weights | "
          "own (peak - libraries) / weights |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, who, weights, r in rows:
        print(f"| {name} | {who} | {weights:.0f} | {r['idle_mib']:.0f} | {r['peak_mib']:.0f} | "
              f"{r['peak_mib'] / weights:.2f}x | {(r['peak_mib'] - r['idle_mib']) / weights:.2f}x | "
              f"{r['own_peak_mib'] / weights:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
