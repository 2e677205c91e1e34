# per-instruction stall sampling of the wgmma kernel (Nsight Compute, full set, SASS source page), one profile per
# case of `profile_sparse_decode.py --wgmma` whose name contains each '|'-separated fragment of CASES (default: the
# batch-1 and batch-64 defaults, single-partition); writes the --source-summary of each under $OUT, tagged 1, 2, ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
default="B=1 wgmma {'S': 10,|B=64 wgmma {'S': 1, 'BLOCK_T': 64, 'STAGES': 2, 'V_SPLIT': 1, 'STORE_CVT': 1, 'WS': 0"
IFS='|' read -r -a cases <<<"${CASES:-$default}"
n=0
for c in "${cases[@]}"; do
  n=$((n + 1)); tag=$n
  echo "case $tag: $c" > $OUT/ncu_source_wgmma_case_$tag.txt
  timeout ${NCU_CASE_S:-200} ncu --profile-from-start off --clock-control none --set full --import-source yes -k regex:wgmma \
    -o /tmp/prof_$tag python3 benchmarks/profile_sparse_decode.py --wgmma --case "$c" > /tmp/ncu_$tag.log 2>&1
  tail -2 /tmp/ncu_$tag.log
  ncu -i /tmp/prof_$tag.ncu-rep --page source --csv --print-source sass > /tmp/src_$tag.csv 2>/dev/null
  python3 benchmarks/profile_sparse_decode.py --source-summary /tmp/src_$tag.csv > $OUT/ncu_source_wgmma_$tag.txt 2>&1
  head -c 400 /tmp/src_$tag.csv | head -3 > $OUT/ncu_source_header_$tag.txt
  ncu -i /tmp/prof_$tag.ncu-rep --page details --csv > $OUT/ncu_details_wgmma_$tag.csv 2>/dev/null
  head -n 60 $OUT/ncu_source_wgmma_$tag.txt
done
