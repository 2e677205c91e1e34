"""Kernel tests: on a machine without CUDA the Triton kernels run in Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton is first imported, so it is set here, at import
of this conftest, when torch sees no CUDA device. (If something imported Triton earlier in the
same process the interpreter stays off; test files skip their kernel runs then, with that reason.) In the
interpreter bfloat16 is broken with Triton 3.9 and fp8 is not supported: CPU tests use float16 and
float32; bf16, fp8 and the real DeepSeek-V4-Flash shapes are in test_kernels_gpu.py, marked ``gpu``.

Run: ``python -m pytest tests/kernels -q`` (CPU, ~1 min on 2 cores);
``python -m pytest tests/kernels -m gpu -q`` on a CUDA host.
"""

import os
import sys
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
_TRITON_WAS_IMPORTED = "triton" in sys.modules
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repo root holds the top-level `kernels` package
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
CPU_DTYPES = ("float16", "float32")


@pytest.fixture
def device():
    return DEVICE
