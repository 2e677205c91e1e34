#!/usr/bin/env bash
# Issue 20, second round, on a 2-GPU H200 host in one device command (under 10 minutes with the wheel install).
#   GPU 0: the held-out sparse decode sweep (tuner_efficiency_gpu.sh, ONLY=sparse_decode, no tests)
#   GPU 1: the kernels' and the compile helpers' GPU tests, the held-out GEMM sweep, then Nsight Compute over the
#          sparse decode cases of benchmarks/profile_sparse_decode.py
# Run from the repository root. Writes under $OUT (8 files, the device's limit):
#   sd/tuner_efficiency_gpu.json sd/sweep.log gemm/tuner_efficiency_gpu.json gemm/sweep.log
#   gemm/gpu_tests_kernels.log gemm/gpu_tests_out_of_resources.log ncu.csv ncu_summary.txt
# Afterwards, on a CPU: copy the two JSON files to benchmarks/results/<benchmark>/<gpu>/ and run
#   python benchmarks/tuner_efficiency.py --goal held_out --analyze-gpu SD_JSON,GEMM_JSON
. "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/sd" "$OUT/gemm"
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/sd" ONLY=sparse_decode TESTS=0 HELPERS=15 TOTAL_S=${SD_S:-540} \
  bash "$here/tuner_efficiency_gpu.sh" >/dev/null 2>&1 &
sd=$!
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/gemm" ONLY=gemm HELPERS=14 TOTAL_S=${GEMM_S:-380} bash "$here/tuner_efficiency_gpu.sh"
metrics="--metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__sass_inst_executed_op_local_ld.sum"
# shellcheck disable=SC2086
CUDA_VISIBLE_DEVICES=1 timeout ${NCU_S:-150} ncu $ncu_flags $metrics python3 "$here/profile_sparse_decode.py" \
  >"$OUT/ncu.csv" 2>"$OUT/ncu_summary.txt" \
  || CUDA_VISIBLE_DEVICES=1 timeout ${NCU_S:-150} ncu $ncu_flags python3 "$here/profile_sparse_decode.py" \
  >"$OUT/ncu.csv" 2>>"$OUT/ncu_summary.txt"
python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu.csv" >>"$OUT/ncu_summary.txt" 2>&1
tail -n 20 "$OUT/ncu_summary.txt"
wait $sd
tail -n 12 "$OUT/sd/sweep.log"
