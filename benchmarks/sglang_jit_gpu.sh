#!/usr/bin/env bash
# SGLang 0.5.23's own kernels on the lent H200, in one device command: the sglang wheel and what its kernel modules
# import installed beside the image's torch (wheels in .sgw, carried; SGLang's JIT builds its CUDA kernels there with
# the image's nvcc), then
#   1. benchmarks/sglang_topk.py: SGLang's JIT top-k beside the twin's torch.topk stand-in (no DeepGEMM needed);
#   2. benchmarks/sglang_plugin_kernels.py: the plug-in's kernel beside SGLang's own fused_q_norm_rope;
# and with FULL=1 (about 6 minutes more; carry .dg too) DeepGEMM built from source (benchmarks/deepgemm_build.sh), then
#   3. benchmarks/sglang_indexer.py: SGLang's Hopper indexer (DeepGEMM logits + SGLang's JIT top-k) against the cap;
#   4. the indexer's GPU tests (tests/tuner/test_workload_sglang_indexer.py -m gpu), both top-k values.
# Results under $OUT: sglang_topk.json, sglang_plugin_kernels.{json,md}, sglang_import.txt, and with FULL=1
# sglang_indexer.json and gpu_tests.txt.
#   .sgw: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_34_x86_64 ... -d .sgw sglang==0.5.23 apache-tvm-ffi==0.1.11 orjson pybase64 msgspec \
#     pyzmq ipython==8.12.3 traitlets stack-data executing asttokens pure-eval pexpect ptyprocess pickleshare backcall \
#     decorator prompt-toolkit wcwidth pydantic pydantic-core annotated-types typing-inspection starlette sniffio
#   (what `import sglang.kernels.ops.attention.dsv4` needs beyond the image's packages, found by blocking imports)
. "$(dirname "$0")/gpu_env.sh"
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sgsite .sgw/*.whl \
  || { echo "the .sgw wheels did not install"; exit 1; }
export CUDA_HOME=/usr/local/cuda
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6  # DeepGEMM's JIT include parser (deepgemm_build.sh)
export DEEPGEMM_SOURCE="deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b, built from source against torch $(python3 -c 'import torch; print(torch.__version__)')"
export PYTHONPATH=/tmp/sgsite:$PWD
start=$(date +%s)
timeout 240 python3 - <<'PY' 2>&1 | tee "$OUT/sglang_import.txt"
import time, torch
t = time.time()
from sglang.kernels.ops.attention import dsv4
print(f"import sglang.kernels.ops.attention.dsv4: {time.time() - t:.1f} s")
lens = torch.full((4,), 300, dtype=torch.int32, device="cuda")
t = time.time(); plan = dsv4.plan_topk_v2(lens); torch.cuda.synchronize()
print(f"plan_topk_v2 (JIT build + run): {time.time() - t:.1f} s")
PY
echo "sglang smoke: $(( $(date +%s) - start )) s"
timeout 150 python3 "$here/sglang_topk.py" --json "$OUT/sglang_topk.json" 2>&1 | tail -n 30
timeout 150 python3 "$here/sglang_plugin_kernels.py" --out "$OUT" 2>&1 | tail -n 20
[ "${FULL:-0}" = 1 ] || exit 0
timeout 300 bash "$here/deepgemm_build.sh" .dg/deepgemm-src.tgz /tmp/deepgemm || echo "DeepGEMM did not build"
export PYTHONPATH=/tmp/deepgemm:$PYTHONPATH
timeout 200 python3 "$here/sglang_indexer.py" --json "$OUT/sglang_indexer.json" --rep-ms 25 2>&1 | tail -n 60
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/tuner/test_workload_sglang_indexer.py 2>&1 \
  | tee "$OUT/gpu_tests.txt" | tail -n 25
