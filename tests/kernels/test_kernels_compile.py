"""Every kernel compiles for sm_90 with the installed Triton, without a GPU (ahead of time).

The interpreter tests check what the kernels compute; this checks that the installed Triton
(3.9 on the CPU machines, where it runs in a subprocess without TRITON_INTERPRET) lowers them
to PTX and cubin for Hopper. The H200 runs checked Triton 3.6.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.selfcheck", "--compile-only", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "compiled with triton" in proc.stdout
