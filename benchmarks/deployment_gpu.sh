#!/usr/bin/env bash
# SGLang's kernels in the twin on the lent H200, then the README's main job on them, as background chains that
# outlive the device calls (each call is at most 10 minutes; a warm machine keeps /tmp and setsid processes while
# calls follow each other within its idle window). Results gather under /tmp/dep; every call copies them to $OUT.
#
#   call 1, carry .sgw .dg:  TUNER_COMMIT=<sha> bash benchmarks/deployment_gpu.sh kernels
#       background: FULL=1 benchmarks/sglang_jit_gpu.sh (SGLang's JIT top-k and norm/RoPE beside ours, DeepGEMM built
#       from source, SGLang's Hopper indexer against the cap, the indexer's GPU tests) into /tmp/dep/kernels
#   first, carry .whl:       bash benchmarks/deployment_gpu.sh site
#       installs optuna & co. and the flashmla wheel into /tmp/site (the twin chain and the main job import them)
#   or, carry .sgw .dg:      TUNER_COMMIT=<sha> bash benchmarks/deployment_gpu.sh twin
#       background: the installs and DeepGEMM build, then SGLang's glue and block-FP8 GEMM in the twin: their GPU tests
#       (tests/tuner/test_workload_sglang_kernels.py, with the indexer's and the plug-in measurement's),
#       benchmarks/sglang_mhc.py (SGLang's mHC kernels beside the twin's stand-in), benchmarks/sglang_plugin_kernels.py
#       (the plug-in's q kernel beside SGLang's, 5 alternating rounds) and benchmarks/sglang_twin_kernels.py
#   or, carry .sgw .dg:      TUNER_COMMIT=<sha> bash benchmarks/deployment_gpu.sh prepare
#       the same installs and DeepGEMM build without the benchmarks (about 2 minutes): for a main-job-only session
#   call 2, carry .whl or after `site`: TUNER_COMMIT=<sha> bash benchmarks/deployment_gpu.sh mainjob 0,1,2 [WATCH_S]
#       installs optuna & co. into /tmp/site (when .whl is carried); background, once the kernels chain is done: a 45-s smoke search (SMOKE=0:
#       none, when the kernels chain has built SGLang's kernels already), then
#       `benchmarks/main_job.py search --budget 7m` per seed with SGLang's kernels importable (the baseline is then
#       SGLang's default path on this GPU), `measure` after the second seed and again after the last
#   or, after `site`, carry .sgw .dg: TUNER_COMMIT=<sha> bash benchmarks/deployment_gpu.sh all 0,1,2 [WATCH_S]
#       one chain for a 30-minute session: installs, DeepGEMM, the GPU tests, the seeds but the last, `measure`,
#       benchmarks/sglang_mhc.py and sglang_twin_kernels.py, the last seed, `measure` again
#   later calls:             bash benchmarks/deployment_gpu.sh watch [WATCH_S]
# `watch` (also the tail of the two above) waits up to WATCH_S seconds (default 540) or until both chains end, then
# copies /tmp/dep's small files to $OUT and prints where each chain stands.
. "$(dirname "$0")/gpu_env.sh"
dep=/tmp/dep
mkdir -p "$dep"

collect() {  # one archive: a call brings back only a few files
  (cd "$dep" && find . -type f -size -40M \( -name '*.json' -o -name '*.md' -o -name '*.txt' -o -name '*.log' \
    -o -name '*.db' -o -name '*.sh' -o -name '*.yaml' -o -name '*.toml' -o -name '*.py' -o -name 'MANIFEST*' \) \
    -not -path './tree/*' -print0 | tar czf "$OUT/dep.tgz" --null -T -)
  for chain in kernels mainjob; do
    if [ -f "$dep/$chain.done" ]; then echo "== $chain: done ($(cat "$dep/$chain.done"))"
    elif [ -f "$dep/$chain.log" ]; then echo "== $chain: running"; else echo "== $chain: not started"; fi
    [ -f "$dep/$chain.log" ] && tail -n 15 "$dep/$chain.log"
  done
}

watch() {
  local until=$(( $(date +%s) + ${1:-540} ))
  while [ "$(date +%s)" -lt "$until" ]; do
    { [ -f "$dep/kernels.done" ] || [ ! -f "$dep/kernels.log" ]; } \
      && { [ -f "$dep/mainjob.done" ] || [ ! -f "$dep/mainjob.log" ]; } && break
    sleep 5
  done
  collect
}

snapshot() {  # the tree the chains run: a copy, so that the next call's sync of the working tree cannot touch it
  if [ ! -d "$dep/tree" ]; then
    mkdir -p "$dep/tree"
    tar cf - --exclude=./.sgw --exclude=./.whl --exclude=./.git . | tar xf - -C "$dep/tree"
  fi
}

case "${1:-}" in
  kernels)
    snapshot
    cp -r .sgw .dg "$dep/tree/"
    (cd "$dep/tree" && TUNER_COMMIT=$TUNER_COMMIT OUT=$dep/kernels FULL=1 setsid nohup bash -c \
      'bash benchmarks/sglang_jit_gpu.sh; echo "exit $? at $(date -u +%H:%M:%S)" > /tmp/dep/kernels.done' \
      > "$dep/kernels.log" 2>&1 < /dev/null &)
    watch "${2:-20}"
    ;;
  prepare)
    snapshot
    cp -r .sgw .dg "$dep/tree/"
    (cd "$dep/tree" && setsid nohup bash -c '
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sgsite .sgw/*.whl
      CUDA_HOME=/usr/local/cuda bash benchmarks/deepgemm_build.sh .dg/deepgemm-src.tgz /tmp/deepgemm
      echo "exit $? at $(date -u +%H:%M:%S)" > /tmp/dep/kernels.done' > "$dep/kernels.log" 2>&1 < /dev/null &)
    watch "${2:-20}"
    ;;
  twin)
    snapshot
    cp -r .sgw .dg "$dep/tree/"
    (cd "$dep/tree" && setsid nohup bash -c '
      set -u
      o=/tmp/dep/kernels; mkdir -p $o
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sgsite .sgw/*.whl
      CUDA_HOME=/usr/local/cuda bash benchmarks/deepgemm_build.sh .dg/deepgemm-src.tgz /tmp/deepgemm
      export PYTHONPATH=/tmp/site:/tmp/sgsite:/tmp/deepgemm:$PWD CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
      export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 TUNER_COMMIT='"$TUNER_COMMIT"'
      timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/tuner/test_workload_sglang_kernels.py \
        tests/tuner/test_workload_sglang_indexer.py tests/tuner/test_plugin_phase.py \
        tests/kernel_tuning/test_sglang_block_fp8.py 2>&1 | tee $o/gpu_tests.txt | tail -n 30
      timeout 240 python3 benchmarks/sglang_mhc.py --json $o/sglang_mhc.json 2>&1 | tail -n 12
      timeout 300 python3 benchmarks/sglang_plugin_kernels.py --out $o 2>&1 | tail -n 8
      timeout 600 python3 benchmarks/sglang_twin_kernels.py --json $o/sglang_twin_kernels.json 2>&1 | tail -n 60
      echo "exit $? at $(date -u +%H:%M:%S)" > /tmp/dep/kernels.done' > "$dep/kernels.log" 2>&1 < /dev/null &)
    watch "${2:-20}"
    ;;
  all)  # one chain for a 30-minute session, carry .sgw .dg, after `site`: the installs and DeepGEMM build, the twin's
        # GPU tests, the seeds but the last and their side by side, SGLang's mHC and the twin's kernels timed, then the
        # last seed and the side by side again: what finishes first is what a short budget most needs
    PYTHONPATH=/tmp/site python3 -c "import optuna" || { echo "run 'site' first: /tmp/site lacks optuna"; exit 1; }
    snapshot
    cp -r .sgw .dg "$dep/tree/"
    seeds=${2:?usage: deployment_gpu.sh all SEEDS [WATCH_S]}
    first=${seeds%,*}; last=${seeds##*,}
    cat > "$dep/all_chain.sh" <<EOF
set -u
cd $dep/tree
o=$dep/kernels; mkdir -p \$o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sgsite .sgw/*.whl
CUDA_HOME=/usr/local/cuda bash benchmarks/deepgemm_build.sh .dg/deepgemm-src.tgz /tmp/deepgemm
export PYTHONPATH=/tmp/site:/tmp/sgsite:/tmp/deepgemm:$dep/tree CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 TUNER_COMMIT=$TUNER_COMMIT
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/tuner/test_workload_sglang_kernels.py \\
  tests/tuner/test_workload_sglang_indexer.py tests/tuner/test_plugin_phase.py \\
  tests/kernel_tuning/test_sglang_block_fp8.py 2>&1 | tee \$o/gpu_tests.txt | tail -n 30
echo "exit 0 at \$(date -u +%H:%M:%S)" > $dep/kernels.done
for s in ${first//,/ }; do
  echo "seed \$s: start \$(date -u +%H:%M:%S)"
  python3 benchmarks/main_job.py search --seed \$s --budget 7m --out-dir $dep/mj || echo "seed \$s: failed"
done
python3 benchmarks/main_job.py measure --out-dir $dep/mj || echo "measure failed"
timeout 240 python3 benchmarks/sglang_mhc.py --json \$o/sglang_mhc.json 2>&1 | tail -n 12
timeout 420 python3 benchmarks/sglang_twin_kernels.py --json \$o/sglang_twin_kernels.json 2>&1 | tail -n 60
if [ "$last" != "$first" ]; then
  echo "seed $last: start \$(date -u +%H:%M:%S)"
  python3 benchmarks/main_job.py search --seed $last --budget 7m --out-dir $dep/mj || echo "seed $last: failed"
  python3 benchmarks/main_job.py measure --out-dir $dep/mj || echo "measure failed"
fi
echo "exit 0 at \$(date -u +%H:%M:%S)" > $dep/mainjob.done
EOF
    (setsid nohup bash "$dep/all_chain.sh" > "$dep/mainjob.log" 2>&1 < /dev/null &)
    watch "${3:-540}"
    ;;
  site)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "the .whl wheels did not install"; exit 1; }
    PYTHONPATH=/tmp/site python3 -c "import optuna, sqlalchemy, fastapi, flash_mla; print('site ready:', optuna.__version__)"
    ;;
  mainjob)
    if [ -d .whl ]; then bash "$0" site || exit 1
    else PYTHONPATH=/tmp/site python3 -c "import optuna" || { echo "no .whl carried and /tmp/site lacks optuna"; exit 1; }; fi
    snapshot
    seeds=${2:?usage: deployment_gpu.sh mainjob SEEDS [WATCH_S]}
    cat > "$dep/mainjob_chain.sh" <<EOF
set -u
cd $dep/tree
while [ ! -f $dep/kernels.done ]; do sleep 5; done
export PYTHONPATH=/tmp/site:/tmp/sgsite:/tmp/deepgemm:$dep/tree CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 TUNER_COMMIT=$TUNER_COMMIT
[ "${SMOKE:-1}" = 1 ] && mkdir -p $dep/smoke && (cd $dep/smoke && timeout 170 python3 -m tuner.cli search --budget 45s --seed 99 --dry-run \
  > dry_run.txt 2>&1; timeout 170 python3 -m tuner.cli search --budget 45s --seed 99 > search.log 2>&1; \
  echo "smoke search exit \$?" >> search.log)
[ -f $dep/smoke/search.log ] && tail -n 5 $dep/smoke/search.log
n=0
for s in ${seeds//,/ }; do
  echo "seed \$s: start \$(date -u +%H:%M:%S)"
  python3 benchmarks/main_job.py search --seed \$s --budget 7m --out-dir $dep/mj || echo "seed \$s: failed"
  n=\$((n + 1))
  if [ \$n -ge 2 ]; then python3 benchmarks/main_job.py measure --out-dir $dep/mj || echo "measure failed"; fi
done
echo "exit 0 at \$(date -u +%H:%M:%S)" > $dep/mainjob.done
EOF
    (setsid nohup bash "$dep/mainjob_chain.sh" > "$dep/mainjob.log" 2>&1 < /dev/null &)
    watch "${3:-540}"
    ;;
  watch) watch "${2:-540}" ;;
  *) echo "usage: deployment_gpu.sh site|kernels|prepare|twin|mainjob SEEDS|all SEEDS|watch [WATCH_S]"; exit 2 ;;
esac
