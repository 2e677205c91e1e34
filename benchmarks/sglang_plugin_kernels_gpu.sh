#!/usr/bin/env bash
# The SGLang plug-in's kernels beside SGLang's own on the H200, in one device command (about 2 minutes):
# benchmarks/sglang_plugin_kernels.py at batch 1/16/64 (V4-Flash's q path: 64 heads of 512, rope 64, bf16), its
# records in $OUT/sglang_plugin_kernels.json and a report beside it. SGLang's kernel is built where SGLang and
# apache-tvm-ffi (and nvcc, for its JIT) are there: the offline wheels in .whl are installed first (gpu_env.sh);
# where it cannot be built the run says so and times ours beside a torch implementation, labelled baseline=torch.
# Store the records into a study afterwards, on any machine:
#   python benchmarks/sglang_plugin_kernels.py --store STUDY --storage URL --from <run>/sglang_plugin_kernels.json
. "$(dirname "$0")/gpu_env.sh"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || echo "note: some offline wheels did not install"
  export PYTHONPATH=/tmp/site:$PWD
fi
python3 "$here/sglang_plugin_kernels.py" --out "$OUT" "$@"
