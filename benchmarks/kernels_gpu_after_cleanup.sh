#!/bin/bash
# The kernels' GPU tests after the wgmma kernel lost its unshipped switches (MERGE, PART16, P_SMEM, SEESAW) and the
# default configs started asking the device for its SM count: one command on the H200, two filed records.
#   1. every GPU test of tests/kernels (pytest -m gpu): $OUT/<date>_<commit>.md
#   2. the sm_90 build tests of the wgmma kernel (ptxas on the GPU image's Triton): $OUT/<date>_<commit>_sm90_builds.md
# Usage (repo root, on the H200): OUT=/tmp/out TUNER_COMMIT=<short sha> bash benchmarks/kernels_gpu_after_cleanup.sh
# File the two records under benchmarks/results/gpu_tests/h200/. Exit status: the first failing pytest's, else 0.
here=$(dirname "$0")
# shellcheck source=benchmarks/gpu_env.sh
source "$here/gpu_env.sh"
rc=0
python3 "$here/gpu_tests.py" run tests/kernels --out "$OUT" || rc=$?
python3 "$here/gpu_tests.py" run tests/kernels/test_sparse_decode_wgmma.py --marks "slow and not gpu" \
    --suffix _sm90_builds --workers 8 --out "$OUT" || [ "$rc" -ne 0 ] || rc=$?
exit "$rc"
