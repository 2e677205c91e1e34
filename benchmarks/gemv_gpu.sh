#!/usr/bin/env bash
# The one-row GEMV (kernels/gemv.py) on one H200 in one device command (about 6 minutes):
#   1. benchmarks/kernels.py --only gemm,gemv: both swept beside the library, the floor, an empty kernel and the
#      frozen previous GEMM; the run ships the fastest of the three per shape (choose_gemm_impls)
#   2. the GEMM and GEMV GPU tests
#   3. the run's tuned files written over a copy of the shipped ones ($OUT/k/tuned; kernels/tuned/ is written only by
#      `tuner search --target kernels`), then the decode workload's hand-written best reading them, with its linears
#      on the library and on the tuned choice (gemm_impl=auto), beside the default
# Run from the repository root. Writes under $OUT (5 files and a folder):
#   k/kernels_gemv.md k/kernels_gemv.json k/gpu_tests_gemv.log k/tuned/ wl/workload_gemv.md wl/workload_gemv.json
# To ship the configs: run `tuner search --target kernels` over the same shapes (it writes kernels/tuned/).
. "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/k" "$OUT/wl"
timeout ${KERNELS_S:-330} python3 "$here/kernels.py" --only gemm,gemv --jobs 14 --budget-s ${BUDGET_S:-270} \
  --out "$OUT/k/kernels_gemv.md" >"$OUT/k/kernels.log" 2>&1
tail -n 6 "$OUT/k/kernels.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gemv.py tests/kernels/test_kernels_gemm.py \
  tests/kernels/test_kernels_gpu.py -k "gemv or gemm or fused_split" >"$OUT/k/gpu_tests_gemv.log" 2>&1
echo "exit status $?" >>"$OUT/k/gpu_tests_gemv.log"
tail -n 3 "$OUT/k/gpu_tests_gemv.log"
cp -r kernels/tuned "$OUT/k/tuned"
python3 "$here/kernels.py" --write-tuned "$OUT/k/kernels_gemv.json" --tuned-dir "$OUT/k/tuned"
TUNER_KERNEL_CONFIG_DIR="$OUT/k/tuned" timeout ${WORKLOAD_S:-150} python3 "$here/workload_gpu.py" --only-ends --gemm-impl auto --out "$OUT/wl/workload_gemv.md" \
  >"$OUT/wl/workload.log" 2>&1
tail -n 8 "$OUT/wl/workload_gemv.md"
rm -f "$OUT/k/kernels.log" "$OUT/wl/workload.log"
