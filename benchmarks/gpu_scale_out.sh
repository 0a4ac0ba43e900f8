#!/usr/bin/env bash
# Scale-out checks that only CUDA shows, as one script for a lent GPU machine (about 3 minutes on one H200; run from
# the repository root). No vLLM needed (the vLLM checks are gpu_check.sh's):
#   1. this package without its deps, beside the machine's torch and transformers;
#   2. the `gpu`-marked scale-out tests: a trainer process on the GPU, replicas publishing checkpoints on the GPU, and
#      (with two GPUs or more) two NCCL ranks training what one rank trains;
#   3. the trainer part of benchmarks/scale_out.py on CUDA (ours and FSDP2; the 2-rank rows need two GPUs).
# Output goes to $OUT (or ./gpu-scale-out): log.txt and trainer.txt.
# The lent machines have torch, transformers and peft but reach no index: the rest (pydantic, LangChain, LangGraph,
# FastAPI...: 25 MiB) comes as wheels carried in .cache/device-wheels, made here for their Python (3.12) with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 -c constraints.txt \
#     -d .cache/device-wheels langchain-core langgraph langchain-openai pydantic typer fastapi uvicorn llguidance \
#     pytest-asyncio certifi idna
# (measured 2026-12-04 on one H200: trainer process and replicas on CUDA pass; the NCCL pair needs two GPUs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-scale-out}"; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LANGGRAPH_ART_CACHE="$PWD/.cache/langgraph-art"
PY="${PYTHON:-python3}"
started=$(date +%s)
step() { echo; echo "== $1 ($(( $(date +%s) - started )) s)"; }

step "1. install"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "no GPU here"; exit 2; }
if [ -d .cache/device-wheels ]; then
  "$PY" -m pip install -q --no-index --find-links .cache/device-wheels langchain-core langgraph langchain-openai \
    pydantic typer fastapi uvicorn llguidance pytest-asyncio || exit 3
fi
# no index on the lent machines: build with the setuptools already there, else import from the checkout
"$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null ||
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count(), "GPU(s), NCCL", torch.cuda.nccl.version())'

step "2. gpu tests (trainer process, replicas, NCCL ranks)"
timeout 240 "$PY" -m pytest -q -m gpu tests/test_scale_out_gpu.py -p no:cacheprovider -rs
tests_rc=$?

step "3. trainer step on CUDA: 1 rank, and 2 ranks where there are two GPUs"
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -ge 2 ]; then
  timeout 300 "$PY" benchmarks/scale_out.py --parts trainer --model tiny-128 --groups 8 --runs 8 --tokens 256 \
    --device cuda | tee "$OUT/trainer.txt"
else
  timeout 300 "$PY" benchmarks/scale_out.py --parts trainer --model tiny-128 --groups 8 --runs 8 --tokens 256 \
    --device cuda --max-ranks 1 | tee "$OUT/trainer.txt"
fi
bench_rc=$?

step "done: tests rc=$tests_rc, benchmark rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
