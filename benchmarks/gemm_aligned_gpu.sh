#!/usr/bin/env bash
# The GEMM after its aligned-load fix (0998650), on a 2-GPU H200 host in one device command (under 10 minutes):
#   GPU 0: benchmarks/kernels.py --only gemm (the fixed kernel's sweep beside cuBLAS, its floor and the frozen
#          previous kernel, benchmarks/baselines/gemm_v1.py), then the GEMM's GPU tests
#   GPU 1: the exhaustive GEMM tables of tuner_efficiency.py: the tuning set's shapes, then the held-out set's
#          (--cases gemm_aligned_tuning, gemm_aligned_held_out), each to its own file
# Run from the repository root with KERNELS_GIT_COMMIT (or a git checkout). Writes under $OUT (7 files):
#   k/kernels_gemm.md k/kernels_gemm.json k/gpu_tests_gemm.log
#   tuning/tuner_efficiency_gpu.json tuning/sweep.log held_out/tuner_efficiency_gpu.json held_out/sweep.log
# Afterwards, on a CPU: copy the JSON files to benchmarks/results/, write the report and (to try them) tuned files with
#   python benchmarks/kernels.py --report-from ... ; python benchmarks/kernels.py --write-tuned ... --tuned-dir DIR
#   (kernels/tuned/ is written only by `tuner search --target kernels`)
. "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/k" "$OUT/tuning" "$OUT/held_out"
(
  CUDA_VISIBLE_DEVICES=1 OUT="$OUT/tuning" CASES=gemm_aligned_tuning ONLY=gemm TESTS=0 HELPERS=14 \
    TOTAL_S=${TUNING_S:-270} bash "$here/tuner_efficiency_gpu.sh" >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES=1 OUT="$OUT/held_out" CASES=gemm_aligned_held_out ONLY=gemm TESTS=0 HELPERS=14 \
    TOTAL_S=${HELD_S:-270} bash "$here/tuner_efficiency_gpu.sh" >/dev/null 2>&1
) &
sweeps=$!
CUDA_VISIBLE_DEVICES=0 timeout ${KERNELS_S:-400} python3 "$here/kernels.py" --only gemm --jobs 14 \
  --budget-s ${BUDGET_S:-300} --out "$OUT/k/kernels_gemm.md" >"$OUT/k/kernels.log" 2>&1
tail -n 4 "$OUT/k/kernels.log"
rm -f "$OUT/k/kernels.log"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gemm.py \
  tests/kernels/test_kernels_gemm_impl.py tests/kernels/test_kernels_gpu.py -k "gemm or fused_split" \
  >"$OUT/k/gpu_tests_gemm.log" 2>&1
echo "exit status $?" >>"$OUT/k/gpu_tests_gemm.log"
tail -n 3 "$OUT/k/gpu_tests_gemm.log"
wait $sweeps
tail -n 10 "$OUT/tuning/sweep.log" "$OUT/held_out/sweep.log"
