#!/usr/bin/env bash
# Issue 20 on one H200 in one command (under 8 minutes with the wheel install): the kernels' GPU tests, then the
# held-out exhaustive sweeps of benchmarks/tuner_efficiency.py (GPU_CASES: the sparse decode kernel at batch 1/16/64,
# its FP8 KV variant at batch 1/64, the skinny GEMM at M=1/16/64 on two V4-Flash shapes, the indexer if time is left).
# Run from the repository root. Writes under $OUT (default benchmarks/results/gpu-run):
#   gpu_tests_out_of_resources.log  pytest tests/kernels -k out_of_resources
#   gpu_tests_kernels.log           pytest tests/kernels/test_kernels_gpu.py
#   tuner_efficiency_gpu.json       the sweep tables (written after every case)
#   sweep.log                       the sweep's progress
# Afterwards, on a CPU: copy the JSON to benchmarks/results/tuner_efficiency/h200/2026-11-30_a39226e_issue20.json.gz and run
#   python benchmarks/tuner_efficiency.py --goal held_out --analyze-gpu benchmarks/results/tuner_efficiency/h200/2026-11-30_a39226e_issue20.json.gz
# TOTAL_S (default 440) bounds the tests and the sweep together. ONLY=KERNEL[,KERNEL] sweeps those kernels' cases only;
# HELPERS=N sets the compile helpers (default: CPUs - 2); TESTS=0 skips the GPU tests (two of these on a 2-GPU host);
# CASES=SET sweeps another set of tables (tuner_efficiency.py --cases).
set -u
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TUNER_COMMIT=${TUNER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
TOTAL_S=${TOTAL_S:-440}
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

if [ "${TESTS:-1}" != 0 ]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels -k out_of_resources \
    >"$OUT/gpu_tests_out_of_resources.log" 2>&1
  echo "exit status $?" >>"$OUT/gpu_tests_out_of_resources.log"
  tail -n 3 "$OUT/gpu_tests_out_of_resources.log"
  # the kernels' GPU tests and the compile helpers' (what a helper compiles from meta tensors, the trial loads)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
    tests/kernel_tuning/test_compile_ahead.py -k "not out_of_resources" >"$OUT/gpu_tests_kernels.log" 2>&1
  echo "exit status $?" >>"$OUT/gpu_tests_kernels.log"
  tail -n 3 "$OUT/gpu_tests_kernels.log"
fi

left=$((TOTAL_S - ($(date +%s) - start)))
echo "tests took $(($(date +%s) - start))s; sweeping for $((left - 25))s"
# a fresh Triton cache: the compile times the sweep records are cold compiles
TRITON_CACHE_DIR=$(mktemp -d /tmp/triton-sweep-XXXXXX) python3 benchmarks/tuner_efficiency.py --gpu --no-analysis \
  --no-autotune --out "$OUT" --deadline-s $((left - 25)) ${ONLY:+--only "$ONLY"} ${HELPERS:+--helpers "$HELPERS"} \
  ${CASES:+--cases "$CASES"} \
  2>&1 | tee "$OUT/sweep.log"
echo "total $(($(date +%s) - start))s"
