"""Kernel-tuning tests (CPU): fake kernels with known outcomes and the recorded H200 sweep replayed.

Trial subprocesses import the fakes (``kernel_tuning_fakes``) through PYTHONPATH, so this folder is put on it.
Without CUDA the Triton interpreter is switched on before anything imports a kernel module.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ.pop("TUNER_KERNEL_CONFIG_DIR", None)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"
