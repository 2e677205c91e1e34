#!/usr/bin/env bash
# Build DeepGEMM from its source against the GPU host's own torch, for the decode twin's SGLang kernels
# (`indexer_impl=deepgemm`) and benchmarks/sglang_indexer.py. SGLang 0.5.23 pins the sgl-deep-gemm 0.2.3.post2 wheel,
# which does not load beside another torch (an undefined c10 symbol); DeepGEMM's public repository is its upstream.
#
#   bash benchmarks/deepgemm_build.sh SRC.tgz [DEST]     # SRC.tgz: DeepGEMM's tree with third-party/cutlass/include
#                                                        # and third-party/fmt/include filled in (no submodules)
#   export PYTHONPATH=DEST:$PYTHONPATH                   # then `import deep_gemm` works
# Idempotent: a DEST whose deep_gemm already imports is kept. Its JIT compiles kernels with $CUDA_HOME/bin/nvcc at
# first use, cached under $DG_JIT_CACHE_DIR (default ~/.deep_gemm).
# On the lent H200 image (torch 2.11, CUDA 13.0) the first JIT call segfaulted inside std::regex (DeepGEMM's include
# parser) unless the system libstdc++ is loaded first: run with LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
# (seen 2026-12-03; the backtrace ended in std::__detail::_Compiler, called from IncludeParser::get_includes).
set -euo pipefail
src=${1:?usage: deepgemm_build.sh SRC.tgz [DEST]}
dest=${2:-/tmp/deepgemm}
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
if PYTHONPATH="$dest" python3 -c 'import deep_gemm' 2>/dev/null; then
  echo "deep_gemm: already built at $dest"; exit 0
fi
rm -rf "$dest"; mkdir -p "$dest"
tar xzf "$src" -C "$dest" --strip-components=1
cd "$dest"
ln -sfn "$dest/third-party/cutlass/include/cutlass" deep_gemm/include/cutlass
ln -sfn "$dest/third-party/cutlass/include/cute" deep_gemm/include/cute
start=$(date +%s)
if ! DG_USE_LOCAL_VERSION=0 MAX_JOBS=$(nproc) python3 setup.py build >build.log 2>&1; then
  tail -40 build.log; echo "deep_gemm: build failed (log: $dest/build.log)"; exit 1
fi
so=$(find build -name '_C*.so' -type f | head -n 1)
cp "$so" deep_gemm/
[ -f build/lib*/deep_gemm/envs.py ] && cp build/lib*/deep_gemm/envs.py deep_gemm/ || true
PYTHONPATH="$dest" python3 -c 'import deep_gemm; print("deep_gemm: built in", '"$(( $(date +%s) - start ))"', "s; SMs", deep_gemm.get_num_sms())'
