"""benchmarks/kernels.py on a CPU: what its GEMM rows ship, and where it may write tuned-config files (anywhere
but kernels/tuned/, which only ``tuner search --target kernels`` writes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_ships_the_fastest_of_library_gemm_and_gemv():
    """choose_gemm_impls: at each GEMM row the fastest of the library, the tuned GEMM and the GEMV of the same dtype
    and key ships; another dtype's GEMV is not compared."""
    from benchmarks import kernels as bench

    key = "K=1024,M=1,N=4096"
    rows = [
        {"kernel": "gemm", "dtype": "bfloat16", "key": key, "torch_us": 6.1, "best_us": 7.8},
        {"kernel": "gemv", "dtype": "bfloat16", "key": key, "best_us": 5.9},
        {"kernel": "gemv", "dtype": "float8_e4m3fn", "key": key, "best_us": 1.0},  # another dtype: not this row's
        {"kernel": "gemm", "dtype": "bfloat16", "key": "K=1024,M=16,N=4096", "torch_us": 6.1, "best_us": 7.7},
    ]
    bench.choose_gemm_impls(rows)
    assert (rows[0]["impl"], rows[0]["gemv_us"]) == ("gemv", 5.9)
    assert (rows[3]["impl"], rows[3]["gemv_us"]) == ("torch", None)
    rows[1]["best_us"] = 6.5
    bench.choose_gemm_impls(rows)
    assert rows[0]["impl"] == "torch"


def _results_json(tmp_path: Path) -> Path:
    entry = {
        "config": {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
        "time_us": 5.9,
        "default_time_us": 6.4,
    }
    data = {
        "meta": {"date": "2026-12-02 10:00 UTC", "gpu": "Test GPU", "triton": "0.0-test", "commit": "0123456789abcdef"},
        "tuned": {"gemv|bfloat16": {"K=1024,M=1,N=4096": entry}},
    }
    path = tmp_path / "kernels_gemv.json"
    path.write_text(json.dumps(data))
    return path


def test_write_tuned_writes_the_folder_it_is_given_with_the_run_named(tmp_path):
    from benchmarks import kernels as bench
    from kernels.configs import read_config_file

    (path,) = bench.write_tuned(_results_json(tmp_path), tmp_path / "mine")
    assert path.parent == (tmp_path / "mine").resolve()
    (entry,) = read_config_file(path).values()
    assert (
        entry["time_us"] == 5.9 and entry["measured"] == "2026-12-02 10:00 UTC, commit 0123456789ab, kernels_gemv.json"
    )


@pytest.mark.parametrize("tuned_dir", [None, "kernels/tuned"])
def test_write_tuned_refuses_the_shipped_folder_and_a_missing_one_with_a_one_line_error(tmp_path, tuned_dir):
    before = sorted(p.name for p in (ROOT / "kernels" / "tuned").iterdir())
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernels.py"), "--write-tuned", str(_results_json(tmp_path))]
    if tuned_dir:
        cmd += ["--tuned-dir", str(ROOT / tuned_dir)]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert got.returncode == 2 and got.stdout == ""
    (line,) = got.stderr.strip().splitlines()
    assert line.startswith("error: --") and "tuner search --target kernels" in line, line
    assert sorted(p.name for p in (ROOT / "kernels" / "tuned").iterdir()) == before
