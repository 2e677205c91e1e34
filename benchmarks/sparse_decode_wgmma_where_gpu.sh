#!/usr/bin/env bash
# Where the wgmma sparse decode's time goes, in one device command (about 5 minutes cold):
#   1. Nsight Compute, the summary page of every case of profile_sparse_decode.py --wgmma (merge kernels included)
#   2. the per-SASS-line stall profile (sparse_decode_wgmma_source_profile.sh) of the batch-64 default and of the
#      same without SPLIT_WG (override with CASES)
# Writes everything into one archive, $OUT/where.tar.gz (the device returns at most 8 files):
# ncu_wgmma.csv, ncu_wgmma_summary.txt, the source profile's files and
# the per-line source CSVs. Run from the repository root, with the offline wheels in .whl (gpu_env.sh).
. "$(dirname "$0")/gpu_env.sh"
final=$OUT
OUT=/tmp/where; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
# shellcheck disable=SC2086
timeout ${NCU_S:-150} ncu $ncu_flags $ncu_metrics python3 "$here/profile_sparse_decode.py" --wgmma \
  >"$OUT/ncu_wgmma.csv" 2>"$OUT/ncu_wgmma_summary.txt"
python3 "$here/profile_sparse_decode.py" --summarise "$OUT/ncu_wgmma.csv" >>"$OUT/ncu_wgmma_summary.txt" 2>&1
tail -n 24 "$OUT/ncu_wgmma_summary.txt" | cut -c1-400
export CASES=${CASES:-"B=64 wgmma {'S': 1, 'BLOCK_T': 32, 'STAGES': 4, 'V_SPLIT': 2, 'STORE_CVT': 1, 'WS': 1, 'SPLIT_WG': 1}|B=64 wgmma {'S': 1, 'BLOCK_T': 64, 'STAGES': 2, 'V_SPLIT': 2, 'STORE_CVT': 1, 'WS': 1, 'SPLIT_WG': 0}"}
export OUT
bash "$here/sparse_decode_wgmma_source_profile.sh" >/dev/null 2>&1
cp /tmp/src_*.csv "$OUT"/ 2>/dev/null
tar -czf "$final/where.tar.gz" -C "$OUT" .
