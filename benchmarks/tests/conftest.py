"""Tests of the benchmark scripts (the lab), apart from the product's tests: ``tests/`` never imports ``benchmarks``.

Run: ``PYTHONPATH=$PWD python -m pytest -q -rs -p no:cacheprovider benchmarks/tests`` (CPU; GPU tests marked ``gpu``).
The repository root and this folder go on ``sys.path`` (``from benchmarks.X import``, ``benchmark_scripts``), and the
kernel-tuning fakes of ``tests/kernel_tuning`` on it and on PYTHONPATH (trial subprocesses import them). Without CUDA
the Triton interpreter is switched on before anything imports a kernel module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
_paths = [str(HERE), str(ROOT / "tests" / "kernel_tuning"), str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    _paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
for p in reversed(_paths):
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.pop("TUNER_KERNEL_CONFIG_DIR", None)

DEV = "cuda" if CUDA else "cpu"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"
