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
# Afterwards, on a CPU: copy the JSON to benchmarks/results/<benchmark>/<gpu>/ and run
#   python benchmarks/sparse_decode_variants.py --report-from benchmarks/results/<benchmark>/<gpu>/<the JSON> --out <report>
. "$(dirname "$0")/gpu_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_sparse_decode.py \
  tests/kernels/test_kernels_gpu.py -k "sparse_decode or ahead or fused" >"$OUT/gpu_tests_sparse_decode.log" 2>&1
echo "exit status $?" >>"$OUT/gpu_tests_sparse_decode.log"
tail -n 3 "$OUT/gpu_tests_sparse_decode.log"
timeout ${VARIANTS_S:-300} python3 "$here/sparse_decode_variants.py" --json "$OUT/sparse_decode_ahead.json" \
  --variants ${VARIANTS:-idx_ahead,qk_ahead} --dtypes bfloat16 --grid --stages 2,3 --helpers 14 --out "$OUT/sparse_decode_ahead.md" \
  >"$OUT/variants.log" 2>&1
grep -E "compiled|batch" "$OUT/variants.log" | head -n 8
if [ "${NCU:-1}" = 1 ]; then  # NCU=0 skips the profile
  # shellcheck disable=SC2086
  timeout ${NCU_S:-120} ncu $ncu_flags $ncu_metrics python3 "$here/profile_sparse_decode.py" --ahead \
    >"$OUT/ncu_ahead.csv" 2>"$OUT/ncu_ahead_summary.txt" \
    || timeout ${NCU_S:-120} ncu $ncu_flags python3 "$here/profile_sparse_decode.py" --ahead \
    >"$OUT/ncu_ahead.csv" 2>>"$OUT/ncu_ahead_summary.txt"
  python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_ahead.csv" >>"$OUT/ncu_ahead_summary.txt" 2>&1
  tail -n 14 "$OUT/ncu_ahead_summary.txt"
fi
rm -f "$OUT/variants.log"
