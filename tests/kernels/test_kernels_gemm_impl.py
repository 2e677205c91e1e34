"""The workload's `gemm_impl` knob: every linear of the twin through the library (torch) or the Triton skinny GEMM
(kernels.linear.linear; on a CPU in Triton's interpreter, float32 and float16), the same numbers either way."""

from __future__ import annotations

import os

import pytest
import torch

from kernels.configs import clear_cache
from tuner.errors import KnobError
from tuner.targets.workload.model import DecodeModel
from tuner.targets.workload.ops import Linear
from tuner.targets.workload.presets import get_preset

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype_name, tol", [("fp32", 1e-5), ("fp16", 2e-3)])
@pytest.mark.parametrize("rows", [1, 5])
def test_linear_through_triton_matches_the_torch_path(dtype_name, tol, rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 80, generator=g) / 80**0.5
    x = torch.randn(rows, 80, generator=g).to(DEVICE)
    ref = Linear.make(w.to(DEVICE), dtype_name)(x)
    got = Linear.make(w.to(DEVICE), dtype_name, "triton")(x)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert torch.isfinite(got).all()
    assert _rel(got, ref) < tol, _rel(got, ref)


def test_linear_auto_without_a_tuned_entry_runs_the_library(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))  # an empty folder: no entry names an impl
    clear_cache()
    try:
        g = torch.Generator().manual_seed(3)
        w, x = torch.randn(24, 32, generator=g).to(DEVICE), torch.randn(2, 32, generator=g).to(DEVICE)
        assert torch.equal(Linear.make(w, "fp32", "auto")(x), Linear.make(w, "fp32")(x))
    finally:
        clear_cache()


@pytest.mark.parametrize(
    "knobs, needle",
    [
        ({"gemm_impl": "cublas"}, "torch, triton, auto"),
        ({"gemm_impl": "triton"}, "GPU"),
        ({"gemm_impl": "auto"}, "GPU"),
    ],
)
def test_gemm_impl_knob_is_checked(knobs, needle):
    if CUDA and needle == "GPU":
        pytest.skip("a GPU runs every gemm_impl")
    with pytest.raises(KnobError, match=needle):
        DecodeModel(get_preset("dsv4-flash-tiny"), knobs, "cpu")


def test_gemm_impl_is_searched_and_only_sglangs_triton_value_sets_a_flag():
    from search_spaces import load_space

    for name, extra in (("dsv4_flash", ["deepgemm", "sglang_triton"]), ("dsv4_flash_tiny", [])):
        p = load_space(name).param("gemm_impl")
        assert p.default == "torch" and list(p.choices()) == ["torch", "triton", "auto", *extra]
    tiny = load_space("dsv4_flash_tiny").param("gemm_impl").server
    assert tiny.flag is None and "cannot load" in tiny.none
    server = load_space("dsv4_flash").param("gemm_impl").server
    assert server.flag == "--fp8-gemm-backend" and server.server_value("sglang_triton") == "triton"
    assert all(server.server_value(v) is None for v in ("torch", "triton", "auto", "deepgemm"))
    # SGLang's own code runs DeepGEMM for V4's FP8 linears on sm_90: there the twin's torch GEMM is the code change
    assert server.deployed_value("sm_90") == "deepgemm" and server.deployed_value(None) == "torch"
    assert server.blocker("torch", "sm_90").instead == "deepgemm" and server.blocker("sglang_triton", "sm_90") is None


def test_gemm_seed_configs_fill_one_wave_of_sms_and_pass_the_rules():
    """Each seed's grid (tiles x SPLIT_K) fits the 132 SMs, and doubling its SPLIT_K would not (unless at 16 or out
    of K); the tile shapes of the rule, and every seed passes the kernel's rules."""
    import triton

    from kernels.gemm import GemmKernel

    k = GemmKernel.instance
    for shape in [*k.shapes("v4flash"), {"M": 1, "N": 7168, "K": 512}, {"M": 16, "N": 512, "K": 16384}]:
        seeds = k.seed_configs(shape, None, "bf16")
        assert seeds, shape
        assert k.default_config(shape) not in seeds
        assert len({tuple(sorted(c.items())) for c in seeds}) == len(seeds)
        for c in seeds:
            assert k.check_config(c, shape, None, dtype="bf16") is None, (shape, c)
            assert (c["BLOCK_N"], c["BLOCK_K"]) in ((32, 128), (64, 128), (128, 64), (32, 256)), c
            tiles = triton.cdiv(shape["M"], c["BLOCK_M"]) * triton.cdiv(shape["N"], c["BLOCK_N"])
            assert tiles * c["SPLIT_K"] <= 132 or c["SPLIT_K"] == 1, (shape, c)
            assert (
                c["SPLIT_K"] == 16
                or tiles * 2 * c["SPLIT_K"] > 132
                or (2 * c["SPLIT_K"] - 1) * c["BLOCK_K"] >= shape["K"]
            ), (shape, c)  # the most splits that fit
    one = k.seed_configs({"M": 1, "N": 1024, "K": 4096}, None, "bf16")  # 16 tiles of 64 columns: 8 splits
    assert {
        "BLOCK_M": 16,
        "BLOCK_N": 64,
        "BLOCK_K": 128,
        "SPLIT_K": 8,
        "GROUP_M": 8,
        "num_warps": 8,
        "num_stages": 4,
    } in one


def test_gemm_default_split_k_fills_the_sms_the_device_reports(monkeypatch):
    """The default's split-K grows until tiles x SPLIT_K reaches the SM count asked of the device
    (``kernels.base.sm_count``), not a fixed 132: M=1, N=1024 (16 tiles of 64 columns), K=8192 takes 16 splits on a
    132-SM GPU (256 programs: the first power of two past 132) and 4 on a 50-SM one (64 programs)."""
    import kernels.gemm as gemm

    k = gemm.GemmKernel.instance
    shape = {"M": 1, "N": 1024, "K": 8192}
    monkeypatch.setattr(gemm, "sm_count", lambda device=None: 132)
    assert k.default_config(shape)["SPLIT_K"] == 16
    monkeypatch.setattr(gemm, "sm_count", lambda device=None: 50)
    assert k.default_config(shape)["SPLIT_K"] == 4


def test_without_a_cuda_device_the_sm_count_is_the_explicit_h200_fallback():
    """On a machine without a CUDA device the SM count is CPU_FALLBACK_LIMITS' (an H200's 132), named in one place."""
    import torch

    from kernels.base import CPU_FALLBACK_LIMITS, sm_count

    expected = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    assert CPU_FALLBACK_LIMITS["sms"] == 132 and sm_count() == expected
