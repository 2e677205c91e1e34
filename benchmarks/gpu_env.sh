# Sourced by the benchmarks/*_gpu.sh scripts (never run alone): the output folder, unbuffered Python, the commit
# the run records (the device copy's .git is stale: pass KERNELS_GIT_COMMIT / TUNER_COMMIT from a clean checkout),
# and the Nsight Compute options the sparse-decode profiles share.
set -u
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1
export KERNELS_GIT_COMMIT=${KERNELS_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export TUNER_COMMIT=${TUNER_COMMIT:-$KERNELS_GIT_COMMIT}
# shellcheck disable=SC2034 - used by the scripts that source this file
ncu_flags="--profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy
  --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page raw"
# shellcheck disable=SC2034
ncu_metrics="--metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__sass_inst_executed_op_local_ld.sum,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
