#!/bin/bash
# One device call for the kernels of issue 20: GPU tests, an Nsight Compute profile, the side-by-side benchmark.
# Everything lands under $OUT. Usage (repo root): OUT=/tmp/out bash benchmarks/run_kernels_gpu.sh [budget_s] [extra args]
# (extra args go to benchmarks/kernels.py; PYTEST_K= selects every test of the three kernel test files; SKIP_NCU=1)
set -o pipefail
OUT=${OUT:-/tmp/kernels_out}
BUDGET=${1:-200}
shift || true
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee /tmp/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a /tmp/gpu.txt
# programmatic dependent launch inside a captured CUDA graph: if this GPU/driver refuses it, run with plain launches
if ! timeout 60 python3 -c "
import torch
from kernels import get_kernel
from kernels.sparse_decode import sparse_decode
sd = get_kernel('sparse_decode')
i = sd.make_inputs(dict(sd.shapes('v4flash')[0], batch=2), 'bfloat16', 'cuda')
cfg = {'S': 8, 'BLOCK_H': 16, 'BLOCK_T': 64, 'num_warps': 4, 'num_stages': 2}
ref = sparse_decode(i['q'], i['kv'], i['indices'], config=cfg, pdl=False)
out = torch.empty_like(ref)
sparse_decode(i['q'], i['kv'], i['indices'], config=cfg, out=out, pdl=True)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    sparse_decode(i['q'], i['kv'], i['indices'], config=cfg, out=out, pdl=True)
out.zero_(); g.replay(); torch.cuda.synchronize()
assert torch.equal(out, ref)
print('PDL in a CUDA graph: ok')
" 2>&1 | tail -3 | tee /tmp/pdl_probe.txt | grep -q "ok"; then
    echo "PDL probe failed: TUNER_SPARSE_DECODE_PDL=0"; export TUNER_SPARSE_DECODE_PDL=0
fi
t0=$(date +%s)
timeout 110 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_kernels_gpu.py tests/kernels/test_kernels_sparse_decode.py \
    tests/kernels/test_kernels_gemm.py -k "${PYTEST_K-sparse_decode and not v32 or fp8 or many_splits or linear or out_of_resources}" \
    2>&1 | tail -25 | tee "$OUT/pytest.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
[ -n "$SKIP_NCU" ] || timeout 80 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section WarpStateStats --csv --page raw \
    python3 benchmarks/profile_sparse_decode.py > "$OUT/ncu.csv" 2> /tmp/ncu.err
[ -n "$SKIP_NCU" ] || tail -12 /tmp/ncu.err
[ -n "$SKIP_NCU" ] || python3 benchmarks/profile_sparse_decode.py --summarise "$OUT/ncu.csv" | tee "$OUT/ncu_summary.txt"
echo "ncu: $(( $(date +%s) - t0 )) s"
python3 benchmarks/kernels.py --only sparse_decode,gemm --no-gemm-sweep --budget-s "$BUDGET" --jobs 14 \
    --out "$OUT/kernels.md" --json "$OUT/kernels.json" "$@" > "$OUT/kernels.log" 2>&1
tail -5 "$OUT/kernels.log"
sed -n '/## Sparse decode/,/## Split-K/p' "$OUT/kernels.md"
