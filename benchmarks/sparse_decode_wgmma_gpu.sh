#!/usr/bin/env bash
# The Gluon wgmma sparse-decode kernel on one H200 in one device command (about 3 minutes):
#   1. its GPU tests (V4-Flash shapes, ragged padding, every split and ring depth, into poisoned outputs)
#   2. benchmarks/sparse_decode_wgmma.py: batch 1 / 16 / 64 beside the tl.dot kernel, torch and the floor
#   3. Nsight Compute over benchmarks/profile_sparse_decode.py --wgmma (NCU=0 skips it)
# Run from the repository root. Writes under $OUT:
#   gpu_tests_wgmma.log sparse_decode_wgmma_h200.json sparse_decode_wgmma_h200.md ncu_wgmma.csv ncu_wgmma_summary.txt
# Afterwards, on a CPU: copy the JSON to benchmarks/results/data/ and run
#   python benchmarks/sparse_decode_wgmma.py --report-from benchmarks/results/data/<the JSON> --out <report>
set -u
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1
export KERNELS_GIT_COMMIT=${KERNELS_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export TUNER_COMMIT=${TUNER_COMMIT:-$KERNELS_GIT_COMMIT}
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sparse_decode_wgmma.py >"$OUT/gpu_tests_wgmma.log" 2>&1
echo "exit status $?" >>"$OUT/gpu_tests_wgmma.log"
tail -n 3 "$OUT/gpu_tests_wgmma.log"
timeout ${BENCH_S:-300} python3 "$here/sparse_decode_wgmma.py" --json "$OUT/sparse_decode_wgmma_h200.json" \
  --out "$OUT/sparse_decode_wgmma_h200.md" 2>&1 | grep -E "^batch|error" | head -n 8
ncu_flags="--profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy
  --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page raw"
metrics="--metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__sass_inst_executed_op_local_ld.sum,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
if [ "${NCU:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout ${NCU_S:-120} ncu $ncu_flags $metrics python3 "$here/profile_sparse_decode.py" --wgmma \
    >"$OUT/ncu_wgmma.csv" 2>"$OUT/ncu_wgmma_summary.txt"
  python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_wgmma.csv" >>"$OUT/ncu_wgmma_summary.txt" 2>&1
  tail -n 12 "$OUT/ncu_wgmma_summary.txt"
fi
