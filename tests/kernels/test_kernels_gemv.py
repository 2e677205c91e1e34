"""The one-row split-K GEMV (kernels/gemv.py) in every CPU-testable mode, and how linear(impl="auto") chooses it."""

import os
from pathlib import Path

import pytest
import torch

from kernels import check, get_kernel
from kernels.configs import clear_cache, write_config_file
from kernels.gemm import torch_linear
from kernels.gemv import gemv
from kernels.linear import linear, resolve_impl

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
G = get_kernel("gemv")


def _cfg(BN=8, BK=32, SK=1, nw=4):
    return {"BLOCK_N": BN, "BLOCK_K": BK, "SPLIT_K": SK, "num_warps": nw}


@pytest.mark.parametrize("shape", G.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, _cfg(), _cfg(SK=2), _cfg(BN=16, BK=64, SK=3), _cfg(BN=4, BK=16, SK=4)], ids=str)
@pytest.mark.parametrize("mode", ["fp16", "fp32"])
def test_gemv_matches_the_reference_across_splits_and_ragged_sizes(shape, cfg, mode):
    """N = 40 and 64 (a ragged last block), K = 96 and 200 (a ragged last tile), 1 to 4 splits; check() runs it into
    a NaN-poisoned output against the float64 reference."""
    if cfg is not None and G.check_config(cfg, shape, dtype=mode):
        pytest.skip(G.check_config(cfg, shape, dtype=mode))
    err = check(G, shape, mode, cfg, DEV, seed=11)
    assert err <= G.tolerance(mode), err


def test_gemv_counters_reset_so_a_second_call_is_right_too():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 200, generator=g).half().to(DEV)
    w = (torch.randn(64, 200, generator=g) / 14).half().to(DEV)
    ref = x.double() @ w.double().t()
    for _ in range(3):
        y = gemv(x, w, "fp16", _cfg(BN=16, BK=32, SK=4))
        assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_gemv_refuses_more_than_one_row_and_bad_configs():
    x, w = torch.randn(2, 64, device=DEV), torch.randn(8, 64, device=DEV)
    with pytest.raises(ValueError, match="one row.*M=2.*kernels.gemm"):
        gemv(x, w, "fp32")
    assert G.check_config(_cfg(), {"M": 16, "N": 8, "K": 64}).startswith("one_row")
    assert G.check_config(_cfg(BN=6), {"M": 1, "N": 8, "K": 64}).startswith("tile_size")
    assert G.check_config(_cfg(BK=64, SK=2), {"M": 1, "N": 8, "K": 64}).startswith("split_k")
    assert G.check_config(_cfg(BN=32, BK=1024, nw=2), {"M": 1, "N": 64, "K": 4096}).startswith("register_pressure")


def test_gemv_default_and_seeds_pass_its_rules_at_the_decode_shapes():
    for shape in G.shapes("v4flash"):
        for c in [G.default_config(shape), *G.seed_configs(shape)]:
            assert G.check_config(c, shape, dtype="bf16") is None, (shape, c)
    # the H200 best at every bf16 decode shape (benchmarks/results/kernels/h200/2026-11-30_393971c_gemv.md): 4-row blocks, no split
    for n, k in ((1024, 4096), (4096, 1024), (2048, 4096), (4096, 2048)):
        assert G.default_config({"M": 1, "N": n, "K": k}) == _cfg(BN=4, BK=1024, SK=1, nw=4)
    assert G.default_config({"M": 1, "N": 256, "K": 8192})["SPLIT_K"] == 4  # 64 blocks: split until 256 programs


def test_linear_auto_runs_the_gemv_where_the_tuned_file_names_it_and_only_for_one_row(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    entry = {
        "config": {
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 32,
            "SPLIT_K": 1,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 2,
        },
        "time_us": 1.0,
        "default_time_us": 1.0,
        "impl": "gemv",
    }
    write_config_file(
        "gemm",
        "cpu" if not CUDA else torch.cuda.get_device_name(),
        "float32",
        {"K=64,M=1,N=24": entry},
        directory=tmp_path,
    )
    clear_cache()
    try:
        assert resolve_impl("auto", 1, 24, 64, "fp32", DEV) == "gemv"
        assert resolve_impl("auto", 2, 24, 64, "fp32", DEV) == "torch"  # the M=1 entry is the nearest key for M=2
        g = torch.Generator().manual_seed(4)
        w, x = torch.randn(24, 64, generator=g).to(DEV), torch.randn(1, 64, generator=g).to(DEV)
        assert torch.equal(linear(x, w, "fp32", "auto"), gemv(x, w, "fp32"))
        assert torch.allclose(linear(x, w, "fp32", "gemv"), torch_linear(x, w, "fp32"), rtol=1e-4, atol=1e-5)
    finally:
        clear_cache()


def test_linear_auto_takes_a_kernel_search_gemv_entry_where_it_beat_the_library_by_more(monkeypatch, tmp_path):
    """The kernel search writes the GEMM and the GEMV to their own files, each with the library timed beside it
    (``impl`` "triton": the kernel won). At one row auto runs the GEMV where its speed-up over the library exceeds
    the GEMM file's choice's; never at M > 1, never where the GEMV lost to the library."""
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    gpu = "cpu" if not CUDA else torch.cuda.get_device_name()
    gemm_cfg = {
        "BLOCK_M": 16,
        "BLOCK_N": 32,
        "BLOCK_K": 32,
        "SPLIT_K": 1,
        "GROUP_M": 8,
        "num_warps": 4,
        "num_stages": 2,
    }

    def write(gemm_impl, gemm_us, gemv_impl, gemv_us):
        write_config_file(
            "gemm",
            gpu,
            "float32",
            {
                "K=64,M=1,N=24": {
                    "config": gemm_cfg,
                    "time_us": gemm_us,
                    "impl": gemm_impl,
                    "library_time_us": 10.0,
                    "impl_triton_time_us": gemm_us,
                }
            },
            directory=tmp_path,
        )
        write_config_file(
            "gemv",
            gpu,
            "float32",
            {
                "K=64,M=1,N=24": {
                    "config": _cfg(),
                    "time_us": gemv_us,
                    "impl": gemv_impl,
                    "library_time_us": 10.0,
                    "impl_triton_time_us": gemv_us,
                }
            },
            directory=tmp_path,
        )
        clear_cache()

    try:
        write("triton", 9.0, "triton", 8.0)
        assert resolve_impl("auto", 1, 24, 64, "fp32", DEV) == "gemv"  # 1.25x the library beats the GEMM's 1.11x
        assert resolve_impl("auto", 2, 24, 64, "fp32", DEV) == "triton"  # the GEMV never runs two rows
        write("triton", 8.0, "triton", 9.0)
        assert resolve_impl("auto", 1, 24, 64, "fp32", DEV) == "triton"
        write("torch", 12.0, "torch", 11.0)  # both lost to the library
        assert resolve_impl("auto", 1, 24, 64, "fp32", DEV) == "torch"
        write("torch", 12.0, "triton", 9.5)
        assert resolve_impl("auto", 1, 24, 64, "fp32", DEV) == "gemv"
    finally:
        clear_cache()
