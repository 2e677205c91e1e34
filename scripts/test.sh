#!/usr/bin/env bash
# Install tuner with its test dependencies (CPU build of torch first, so no multi-GB CUDA wheel is pulled),
# then run the whole test suite. GPU tests skip themselves with a reason on a machine without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[test,postgres]'
# a real third-party server for tests/real_server: `transformers serve` (its serving extra) beside the CPU torch,
# versions pinned in pyproject's `real-server` extra
$PY -m pip install -q -e '.[real-server]'
# SGLang's own argument parser for flag validation: the package without its GPU stack, plus what --help needs.
$PY -m pip install -q --no-deps 'sglang==0.5.23' || $PY -m pip install -q --no-deps sglang
$PY -m pip install -q orjson psutil pybase64 requests pillow msgspec pyzmq ipython aiohttp huggingface_hub
# the shape of the code: lint and import order (ruff), the layers and foundations (import-linter's contracts in
# pyproject.toml); either failing fails the run
$PY -m ruff check .
lint-imports --no-cache
set +e
$PY -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure of the suite, not a pass.
exit $rc
