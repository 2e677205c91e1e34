#!/usr/bin/env bash
# Install tuner with everything its tests need (CPU build of torch first, so no multi-GB CUDA wheel is pulled; as
# root on Debian also PostgreSQL and Chromium), start a PostgreSQL server of this run's own, then run the checks of
# the code's shape and the whole test suite on every core. GPU tests skip themselves with a reason on a machine
# without CUDA; the run prints every skip reason and its slowest tests.
# `bash scripts/test.sh` runs every test but those marked `slow` (real third-party servers, the 5000-trial study,
# the sm_90 compile checks, the stand-in's goodput boundary searches, ...): about 12 minutes on 2 cores; `bash scripts/test.sh --slow` runs those, then the
# benchmarks' own tests (benchmarks/tests).
set -euo pipefail
marks="not slow"
if [ "${1:-}" = "--slow" ]; then marks="slow"; shift; fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore  # a CI container runs as root on purpose
# SGLang is installed for its argument parser only, without its GPU stack (--no-deps): every later pip install
# would print the requirements it lacks as a resolver ERROR block. The installs skip that check
# (--no-warn-conflicts) and `pip check` below reports any conflict that is not SGLang's.
PIP="$PY -m pip install -q --no-warn-conflicts"
$PIP torch==2.13.0
$PIP -e '.[test,postgres]'
# a real third-party server for tests/real_server: `transformers serve` (its serving extra) beside the CPU torch,
# versions pinned in pyproject's `real-server` extra; and `gguf` (the tokenizer extra) to read a GGUF file's own vocabulary
$PIP -e '.[real-server,tokenizer]'
# SGLang's own argument parser for flag validation: what --help needs, then the package without its GPU stack
$PIP orjson psutil pybase64 requests pillow msgspec pyzmq ipython aiohttp huggingface_hub
$PIP --no-deps 'sglang==0.5.23' || $PIP --no-deps sglang
# the DeepSeek-V4 kernel modules the SGLang plug-in hooks import tvm_ffi (SGLang 0.5.23 pins 0.1.11)
$PIP --no-deps 'apache-tvm-ffi==0.1.11'
broken=$($PY -m pip check 2>&1 | grep -v -e '^sglang ' -e '^No broken requirements' || true)
[ -z "$broken" ] || printf 'pip check (beyond the GPU stack SGLang is installed without):\n%s\n' "$broken"

# PostgreSQL (the many-worker storage) and Chromium (the dashboard's page tests): Debian's packages, as root
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && { ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
     || ! command -v chromium >/dev/null; }; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql chromium chromium-driver >/dev/null
fi
if [ -z "${TUNER_TEST_POSTGRES_URL:-}" ] && [ "$(id -u)" = 0 ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  PGBIN=/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n1)/bin
  # a data directory and a port of this run's own: two runs on one machine do not share (or stop) one server
  PGDATA=$(mktemp -d /tmp/tuner-test-pg.XXXXXX); chown postgres "$PGDATA"
  PGPORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  su postgres -c "$PGBIN/initdb -D $PGDATA -A trust -U postgres" >/dev/null
  su postgres -c "$PGBIN/pg_ctl -D $PGDATA -l $PGDATA/log -o '-p $PGPORT -k /tmp -c max_connections=300' -w start" >/dev/null
  trap 'su postgres -c "$PGBIN/pg_ctl -D $PGDATA -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$PGDATA"' EXIT
  export TUNER_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$PGPORT/postgres"
fi
[ -n "${TUNER_TEST_POSTGRES_URL:-}" ] || echo "note: no PostgreSQL (run as root on Debian, or set TUNER_TEST_POSTGRES_URL): its tests skip"

# the shape of the code: lint and import order (ruff), the layers and foundations (import-linter's contracts in
# pyproject.toml); either failing fails the run
$PY -m ruff check .
$PY -m ruff format --check .
lint-imports --no-cache
set +e
$PY -m pytest -q -p no:cacheprovider -n "${TUNER_TEST_WORKERS:-auto}" --dist loadfile -rs --durations=25 -m "$marks" "$@"
rc=$?
if [ "$marks" = slow ] && [ $rc = 0 ]; then
  # the benchmarks' own tests (their reports rewritten from stored data, the results index, the lab's shape): a
  # process of their own, as tests/ never imports benchmarks/
  $PY -m pytest -q -p no:cacheprovider -n "${TUNER_TEST_WORKERS:-auto}" --dist loadfile -rs benchmarks/tests
  rc=$?
fi
set -e
# pytest exits 5 when nothing was collected: that is a failure of the suite, not a pass.
exit $rc
