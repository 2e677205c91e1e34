"""A GPU check shared by the compile-ahead tests: real helpers compile configs from meta tensors, then a fresh
process runs and checks the same configs on real inputs and finds every binary in Triton's cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def assert_compiled_ahead_then_loaded(
    kernel_name: str, shape: dict, configs: list[dict], cache: Path, dtype: str = "bfloat16"
) -> None:
    """``cache`` is the ``TRITON_CACHE_DIR`` already set for this process (the helpers and the fresh one inherit it).
    Helpers compile ``configs``; the fresh process's checks are within tolerance and add no binary."""
    from tuner.execution.compile_ahead import CompileAhead
    from tuner.targets.kernels import load_kernel

    ahead = CompileAhead(2)
    try:
        for fut in [ahead.submit(kernel_name, shape, dtype, c) for c in configs]:
            assert fut.result(timeout=300) > 0
    finally:
        ahead.close()
    binaries = sorted(p.name for p in cache.rglob("*.cubin"))
    assert len(binaries) >= len(configs)
    code = (
        "import json, sys; from kernels.base import check; from tuner.targets.kernels import load_kernel; "
        "name, dtype, shape, configs = json.loads(sys.argv[1]); k = load_kernel(name); "
        "print([check(k, shape, dtype, c, 'cuda', seed=3) for c in configs])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps([kernel_name, dtype, shape, configs])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    errors = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(e <= load_kernel(kernel_name).tolerance(dtype) for e in errors), errors
    assert sorted(p.name for p in cache.rglob("*.cubin")) == binaries  # every first launch was a cache load
