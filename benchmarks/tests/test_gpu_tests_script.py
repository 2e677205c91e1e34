"""benchmarks/kernels_gpu_after_cleanup.sh, the one command that re-runs the kernels' GPU tests on the H200: its CPU
part (without a CUDA device it says so for each of its two runs, exits 2 and files nothing) and the selection it
hands pytest (the GPU tests, then the sm_90 build tests, each its own record)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kernels_gpu_after_cleanup.sh"


@pytest.mark.slow  # two Python starts that import torch: about 20 s on a 2-core CPU
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU part: a GPU host runs the tests themselves")
def test_the_kernels_gpu_script_refuses_to_run_without_a_cuda_device_and_files_nothing(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUT": str(tmp_path / "out"),
        "TUNER_COMMIT": "abc1234",
        "CUDA_VISIBLE_DEVICES": "",
    }
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("gpu_tests: no CUDA device here; run it on a GPU host") == 2, r.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_the_kernels_gpu_script_runs_the_gpu_tests_then_the_sm90_build_tests_as_two_records():
    text = SCRIPT.read_text()
    first, second = (line for line in text.splitlines() if 'gpu_tests.py" run' in line)
    assert "tests/kernels --out" in first and "--marks" not in first  # pytest -m gpu tests/kernels
    assert '--marks "slow and not gpu"' in second and "test_sparse_decode_wgmma.py" in second
    assert "--suffix _sm90_builds" in text


def test_gpu_tests_report_files_the_pytest_summary_line(tmp_path):
    log, info = tmp_path / "log.txt", tmp_path / "info.txt"
    log.write_text("....\n4 passed, 2 deselected in 3.00s\n")
    info.write_text("NVIDIA H200, torch 2.11, triton 3.6.0, commit abc1234, 2026-12-03\n")
    out = tmp_path / "r.md"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_tests.py"),
            "report",
            str(log),
            "--gpu-info",
            str(info),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "Result: **4 passed, 2 deselected in 3.00s**" in out.read_text()
