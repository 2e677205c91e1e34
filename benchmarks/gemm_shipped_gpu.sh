#!/usr/bin/env bash
# The H200 GEMM tuned files of the aligned kernel, checked where they are used, on a 2-GPU H200 host in one device
# command (about 5 minutes):
#   GPU 0: benchmarks/kernels.py --only gemm --no-gemm-sweep (the shipped configs and what linear(impl="auto") picks,
#          beside cuBLAS, the floor, an empty kernel and the frozen previous kernel), then Nsight Compute over one
#          call each of the Triton kernel and cuBLAS (benchmarks/profile_sparse_decode.py --gemm)
#   GPU 1: the decode workload's hand-written best with its linears on the library, on the tuned choice (auto) and on
#          the Triton kernel, beside the default and the twin10 search's best (benchmarks/workload_gpu.py)
# On a 1-GPU host, GPU_B=0 runs the workload after the rest, on the same GPU (never two timings at once).
# Run from the repository root. Writes under $OUT (6 files):
#   k/kernels_gemm_shipped.md k/kernels_gemm_shipped.json ncu_gemm.csv ncu_gemm_summary.txt
#   wl/workload_gemm_impl.md wl/workload_gemm_impl.json
. "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/k" "$OUT/wl"
GPU_B=${GPU_B:-1}
workload() {
  CUDA_VISIBLE_DEVICES=$GPU_B timeout ${WORKLOAD_S:-420} python3 "$here/workload_gpu.py" --only-ends \
    --gemm-impl auto,triton --study-best "sqlite:///$here/results/studies/twin10_h200.db#twin10-h200" \
    --out "$OUT/wl/workload_gemm_impl.md" >"$OUT/wl/workload.log" 2>&1
}
wl=
if [ "$GPU_B" != 0 ]; then workload & wl=$!; fi
CUDA_VISIBLE_DEVICES=0 timeout ${KERNELS_S:-240} python3 "$here/kernels.py" --only gemm --no-gemm-sweep --jobs 14 \
  --out "$OUT/k/kernels_gemm_shipped.md" >"$OUT/k/kernels.log" 2>&1
tail -n 3 "$OUT/k/kernels.log"
# shellcheck disable=SC2086
CUDA_VISIBLE_DEVICES=0 timeout ${NCU_S:-150} ncu $ncu_flags --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
  python3 "$here/profile_sparse_decode.py" --gemm >"$OUT/ncu_gemm.csv" 2>"$OUT/ncu_gemm_summary.txt"
python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_gemm.csv" >>"$OUT/ncu_gemm_summary.txt" 2>&1
tail -n 14 "$OUT/ncu_gemm_summary.txt"
if [ -n "$wl" ]; then wait "$wl"; else workload; fi
tail -n 12 "$OUT/wl/workload_gemm_impl.md"
rm -f "$OUT/k/kernels.log" "$OUT/wl/workload.log"
