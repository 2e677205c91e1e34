"""Kernel tests: on a machine without CUDA the Triton kernels run in Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton is first imported, so it is set here, at import
of this conftest, when torch sees no CUDA device. (If something imported Triton earlier in the
same process without it, the run stops with a usage error saying so.) In the
interpreter bfloat16 is broken with Triton 3.9 and fp8 is not supported: CPU tests use float16 and
float32; bf16, fp8 and the real DeepSeek-V4-Flash shapes are in test_kernels_gpu.py, marked ``gpu``.

Run: ``python -m pytest tests/kernels -q`` (CPU, ~1 min on 2 cores);
``python -m pytest tests/kernels -m gpu -q`` on a CUDA host.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton read TRITON_INTERPRET when it was imported: setting it now would leave every kernel compiled for a
        # GPU this machine lacks, and the kernel tests would test nothing
        raise pytest.UsageError(
            "tests/kernels: Triton was imported before TRITON_INTERPRET=1 could be set on this "
            "machine without CUDA; run with TRITON_INTERPRET=1 in the environment"
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repo root holds the top-level `kernels` package
    sys.path.insert(0, str(ROOT))

DEVICE = "cuda" if CUDA else "cpu"
CPU_DTYPES = ("float16", "float32")


@pytest.fixture
def device():
    return DEVICE
