#!/usr/bin/env bash
# The vLLM engine's checks that only a GPU shows, as one script for a lent CUDA machine (about 6 minutes on one
# H200; run from the repository root):
#   1. install vLLM 0.32 (the CUDA build) beside the machine's torch, and this package without its deps;
#   2. the `gpu`-marked tests: logprob agreement of vLLM (bf16 and fp32) with the trainer's forward pass, also under a
#      grammar (structured output replays, its logprobs masked), LoRA swap under load, and training steps on one GPU
#      with vLLM asleep (level 1) while the optimizer steps;
#   3. 256 concurrent requests and adapter swap time, HFEngine against VLLMEngine (benchmarks/engines.py on CUDA).
# Output goes to $OUT (or ./gpu-check-out): log.txt and engines.txt.
#
# vLLM must come from somewhere: VLLM_WHEELS=<folder of wheels> (pip --no-index), else the package index. The device
# machines lent to this project reach no index and carry at most 64 MiB (vLLM's wheel alone is ~400 MB), so there this
# script stops at step 1 with that message; it was written and checked against the CPU build, not run on a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_LOGGING_LEVEL=WARNING
export LANGGRAPH_ART_CACHE="$PWD/.cache/langgraph-art"
PY="${PYTHON:-python3}"
started=$(date +%s)
step() { echo; echo "== $1 ($(( $(date +%s) - started )) s)"; }

step "1. install"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU here"; exit 2; }
if ! "$PY" -c 'import vllm, sys; sys.exit(0 if vllm.__version__.startswith("0.32.") else 1)' 2>/dev/null; then
  if [ -n "${VLLM_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$VLLM_WHEELS" "vllm==0.32.*" || exit 3
  else
    timeout 300 "$PY" -m pip install -q "vllm==0.32.*" || {
      echo "could not install vLLM 0.32 (no index reachable?): set VLLM_WHEELS to a folder of its wheels"; exit 3; }
  fi
fi
# no index on the lent machines: build with the setuptools already there, else import from the checkout
"$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null ||
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pip install -q --no-deps langchain-core langgraph langchain-openai openai fastapi uvicorn pytest-asyncio \
  2>/dev/null || true   # usually present beside vLLM; a missing one fails step 2 with its name
"$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name())'

step "2. gpu tests (logprobs vs trainer, swap under load, training with sleep/wake)"
timeout 240 "$PY" -m pytest -q -m gpu tests/test_vllm_gpu.py -p no:cacheprovider
tests_rc=$?

step "3. engines on CUDA: 1/8/64/256 concurrent, adapter swap"
timeout 180 "$PY" benchmarks/engines.py --device cuda --models tiny-5m,qwen-0.5b-shape --concurrency 1,8,64,256 \
  --max-tokens 64 | tee "$OUT/engines.txt"
bench_rc=$?

step "done: tests rc=$tests_rc, benchmark rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
