"""Which dtype this CPU multiplies matrices fastest in, measured, and the trainer's compute dtype chosen from it.

Whether bfloat16 pays on a CPU depends on the CPU, by far: torch's matmul on one thread ran 4.5x faster in bfloat16
than in float32 on a Xeon with AMX (682 against 150 GFLOP/s), and 67x slower on an AMD Zen 3 with AVX2 only (1.0
against 67). A CPU flag says which kernels exist, not how fast torch's build runs them on this machine's thread
count, so ``measure_matmul`` times both dtypes on a matrix of a small model's shape, and ``cpu_compute_dtype``
takes bfloat16 only where it measured at least ``BF16_MIN_SPEEDUP`` times float32. On CPU the trainer then keeps
its weights, LoRA and AdamW state in float32 (the weights stay the engine's, shared) and runs its forward and
backward under bfloat16 autocast (``GRPOConfig.dtype``: ``"auto"`` measures, ``"bfloat16-autocast"`` forces it).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# "auto" autocasts models this large: where the step's time is the body's matmuls. Below, a step is cheap already and
# float32 keeps the trainer's logprobs the engine's (the sampler-trainer gap in bfloat16 is ~1e-2 nats a token)
AUTOCAST_CPU_BYTES = 2**30
BF16_MIN_SPEEDUP = 1.5  # bfloat16 is chosen from this much faster on: below, its rounding is not worth the time
# [tokens, hidden] x [hidden, intermediate] of a small model's MLP: 134 MFLOP, ~2 ms at float32 on one AVX2 thread,
# ~130 ms where bfloat16 has no kernel (the slow case must stay cheap to measure)
PROBE_SHAPE = (256, 512, 512)
PROBE_SECONDS = 0.1  # per dtype, after one warm-up product
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class MatmulThroughput:
    """GFLOP/s of torch's matmul in float32 and bfloat16 on this machine, at the thread count it was measured with."""

    float32: float
    bfloat16: float
    threads: int
    flags: tuple[str, ...]  # which of CPU_FLAGS /proc/cpuinfo lists: what the log says, not what decides

    @property
    def bf16_speedup(self) -> float:
        return self.bfloat16 / self.float32

    def describe(self) -> str:
        flags = " ".join(self.flags) or "none of " + " ".join(CPU_FLAGS)
        return (
            f"matmul {self.float32:.0f} GFLOP/s in float32, {self.bfloat16:.1f} in bfloat16 ({self.bf16_speedup:.2f}x) "
            f"on {self.threads} thread(s); CPU flags: {flags}"
        )


def cpu_flags() -> tuple[str, ...]:
    """Which of ``CPU_FLAGS`` this CPU reports (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return tuple(f for f in CPU_FLAGS if f in have)


def gflops(dtype_name: str, shape: tuple[int, int, int] = PROBE_SHAPE, seconds: float = PROBE_SECONDS) -> float:
    """GFLOP/s of ``[m, k] @ [k, n]`` in ``dtype_name`` on CPU with torch's current thread count: one warm-up
    product, then products until ``seconds`` have passed (at least one)."""
    import torch

    m, k, n = shape
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn((m, k), generator=generator).to(dtype)
    b = torch.randn((k, n), generator=generator).to(dtype)
    torch.matmul(a, b)  # warm-up: kernel selection, first-touch of the output
    count, started = 0, time.perf_counter()
    while True:
        torch.matmul(a, b)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return 2 * m * k * n * count / elapsed / 1e9


@functools.cache
def measure_matmul(threads: int) -> MatmulThroughput:
    """Both dtypes' matmul throughput at ``threads`` (torch's thread count; measured once per process and count)."""
    return MatmulThroughput(gflops("float32"), gflops("bfloat16"), threads, cpu_flags())


def cpu_compute_dtype(throughput: MatmulThroughput) -> str:
    """``"bfloat16"`` where it measured at least ``BF16_MIN_SPEEDUP`` times float32's throughput, else ``"float32"``."""
    return "bfloat16" if throughput.bf16_speedup >= BF16_MIN_SPEEDUP else "float32"
