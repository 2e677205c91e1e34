#!/usr/bin/env bash
# Sparse decode loop schedules (idx_ahead, qk_ahead) against the plain loop on one H200 in one device command
# (about 7 minutes):
#   1. the sparse decode GPU tests (the new schedules at V4-Flash shapes into poisoned outputs, among them)
#   2. benchmarks/sparse_decode_variants.py: bf16 cache, batch 1 / 16 / 64, base vs idx_ahead vs qk_ahead (or the
#      variants in $VARIANTS), with the grid at num_stages 2 and 3
#   3. Nsight Compute over benchmarks/profile_sparse_decode.py --ahead (plain and both schedules, shipped and 64-head
#      configs at batch 16 and 64), with the tensor pipes' activity
# Run from the repository root. Writes under $OUT (5 files):
#   gpu_tests_sparse_decode.log sparse_decode_ahead.json sparse_decode_ahead.md ncu_ahead.csv ncu_ahead_summary.txt
# Afterwards, on a CPU: copy the JSON to benchmarks/results/data/ and run
#   python benchmarks/sparse_decode_variants.py --report-from benchmarks/results/data/<the JSON> --out <report>
set -u
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1
export KERNELS_GIT_COMMIT=${KERNELS_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export TUNER_COMMIT=${TUNER_COMMIT:-$KERNELS_GIT_COMMIT}
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_sparse_decode.py \
  tests/kernels/test_kernels_gpu.py -k "sparse_decode or ahead or fused" >"$OUT/gpu_tests_sparse_decode.log" 2>&1
echo "exit status $?" >>"$OUT/gpu_tests_sparse_decode.log"
tail -n 3 "$OUT/gpu_tests_sparse_decode.log"
timeout ${VARIANTS_S:-300} python3 "$here/sparse_decode_variants.py" --json "$OUT/sparse_decode_ahead.json" \
  --variants ${VARIANTS:-idx_ahead,qk_ahead} --dtypes bfloat16 --grid --stages 2,3 --helpers 14 --out "$OUT/sparse_decode_ahead.md" \
  >"$OUT/variants.log" 2>&1
grep -E "compiled|batch" "$OUT/variants.log" | head -n 8
ncu_flags="--profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy
  --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page raw"
metrics="--metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__sass_inst_executed_op_local_ld.sum,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
if [ "${NCU:-1}" = 1 ]; then  # NCU=0 skips the profile
  # shellcheck disable=SC2086
  timeout ${NCU_S:-120} ncu $ncu_flags $metrics python3 "$here/profile_sparse_decode.py" --ahead \
    >"$OUT/ncu_ahead.csv" 2>"$OUT/ncu_ahead_summary.txt" \
    || timeout ${NCU_S:-120} ncu $ncu_flags python3 "$here/profile_sparse_decode.py" --ahead \
    >"$OUT/ncu_ahead.csv" 2>>"$OUT/ncu_ahead_summary.txt"
  python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_ahead.csv" >>"$OUT/ncu_ahead_summary.txt" 2>&1
  tail -n 14 "$OUT/ncu_ahead_summary.txt"
fi
rm -f "$OUT/variants.log"
