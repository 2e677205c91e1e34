#!/usr/bin/env bash
# The Gluon wgmma sparse-decode kernel on one H200 in one device command (about 7 minutes; BATCHES=64,16 picks;
# SPACE='{"STAGES": [2]}' narrows the wgmma sweep, see the benchmark's --space; TESTS_K='split_wg' runs the tests pytest's
# -k selects; the benchmark runs only if the tests pass):
#   1. its GPU tests (V4-Flash shapes, ragged padding, every split and ring depth, into poisoned outputs)
#   2. benchmarks/sparse_decode_wgmma.py: batch 1 / 16 / 64 beside the tl.dot kernel, torch and the floor
#   3. Nsight Compute over benchmarks/profile_sparse_decode.py --wgmma (NCU=0 skips it)
# Run from the repository root. Writes under $OUT:
#   gpu_tests_wgmma.log sparse_decode_wgmma_h200.json sparse_decode_wgmma_h200.md ncu_wgmma.csv ncu_wgmma_summary.txt
# Afterwards, on a CPU: copy the JSON to benchmarks/results/<benchmark>/<gpu>/ and run
#   python benchmarks/sparse_decode_wgmma.py --report-from benchmarks/results/<benchmark>/<gpu>/<the JSON> --out <report>
. "$(dirname "$0")/gpu_env.sh"
timeout ${TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sparse_decode_wgmma.py -k "${TESTS_K:-}" \
  >"$OUT/gpu_tests_wgmma.log" 2>&1
echo "exit status $?" >>"$OUT/gpu_tests_wgmma.log"
tail -n 3 "$OUT/gpu_tests_wgmma.log"
grep -q "^exit status 0$" "$OUT/gpu_tests_wgmma.log" || exit 1
timeout ${BENCH_S:-300} python3 "$here/sparse_decode_wgmma.py" --json "$OUT/sparse_decode_wgmma_h200.json" \
  --out "$OUT/sparse_decode_wgmma_h200.md" --batches "${BATCHES:-1,16,64}" --space "${SPACE:-}" 2>&1 \
  | grep -E "^batch|error" | head -n 8
if [ "${NCU:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout ${NCU_S:-120} ncu $ncu_flags $ncu_metrics python3 "$here/profile_sparse_decode.py" --wgmma \
    >"$OUT/ncu_wgmma.csv" 2>"$OUT/ncu_wgmma_summary.txt"
  python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_wgmma.csv" >>"$OUT/ncu_wgmma_summary.txt" 2>&1
  tail -n 12 "$OUT/ncu_wgmma_summary.txt"
fi
