"""A frozen base in 8-bit or 4-bit (bitsandbytes' CPU backend) against float32: what a LoRA step's base layers cost.

    OMP_NUM_THREADS=1 python benchmarks/quantized_base.py [--threads 1] [--tokens 512]

With the base frozen, a LoRA step runs each base linear layer forward and back to its input (no weight gradient).
Each of Qwen2.5-0.5B's linear shapes ([tokens, in] x [in, out]: the MLP's gate/up and down, attention's q/o) is
timed forward + input-gradient backward as ``torch.nn.Linear`` in float32, ``bnb.nn.Linear8bitLt`` (int8 weights,
LLM.int8 without outliers) and ``bnb.nn.Linear4bit`` (NF4, float32 compute), same process, medians of 5 after a
warm-up; the weights' bytes and each output's largest error against float32 (relative to its largest value).
bitsandbytes is in the bench extra (``./dev bench-setup``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

SHAPES = {"mlp gate/up [896 -> 4864]": (896, 4864), "mlp down [4864 -> 896]": (4864, 896),
          "attention q/o [896 -> 896]": (896, 896)}  # fmt: skip


def timed(layer: torch.nn.Module, x: torch.Tensor, reps: int = 5) -> float:
    """Median seconds of forward + backward to the input."""
    times = []
    for i in range(reps + 1):
        x.grad = None
        started = time.perf_counter()
        layer(x).sum().backward()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def weight_bytes(layer: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in layer.state_dict().values() if isinstance(t, torch.Tensor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--threads", type=int, default=int(os.environ["OMP_NUM_THREADS"]))
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    import bitsandbytes as bnb

    from langgraph_art.models.precision import cpu_flags

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# bitsandbytes {bnb.__version__}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{args.tokens} tokens; CPU flags: {' '.join(cpu_flags()) or '-'}")  # fmt: skip
    print("| layer | weights | bytes | ms fwd+bwd | GFLOP/s | x float32's time | max error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (fan_in, fan_out) in SHAPES.items():
        full = torch.nn.Linear(fan_in, fan_out, bias=False).requires_grad_(False)
        int8 = bnb.nn.Linear8bitLt(fan_in, fan_out, bias=False, has_fp16_weights=False)
        nf4 = bnb.nn.Linear4bit(fan_in, fan_out, bias=False, compute_dtype=torch.float32, quant_type="nf4")
        for layer in (int8, nf4):
            layer.load_state_dict(full.state_dict())
            layer.to("cpu")  # quantizes the weights
        x = torch.randn(args.tokens, fan_in, requires_grad=True)
        with torch.no_grad():
            exact = full(x)
        base = timed(full, x)
        flops = 2 * 2 * args.tokens * fan_in * fan_out
        for label, layer in (("float32", full), ("int8", int8), ("nf4", nf4)):
            seconds = base if layer is full else timed(layer, x)
            with torch.no_grad():
                error = float((layer(x) - exact).abs().max() / exact.abs().max())
            print(f"| {name} | {label} | {weight_bytes(layer)} | {seconds * 1e3:.1f} | {flops / seconds / 1e9:.1f} | "
                  f"{seconds / base:.2f} | {error:.4f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
