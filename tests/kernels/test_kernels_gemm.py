"""Skinny GEMM y = x @ W.T in every CPU-testable mode, split-K included."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.gemm import gemm, torch_linear

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
G = get_kernel("gemm")


def _cfg(BM=16, BN=32, BK=32, SK=1, GM=8, nw=4, ns=2):
    return {
        "BLOCK_M": BM,
        "BLOCK_N": BN,
        "BLOCK_K": BK,
        "SPLIT_K": SK,
        "GROUP_M": GM,
        "num_warps": nw,
        "num_stages": ns,
    }


@pytest.mark.parametrize("shape", G.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, _cfg(), _cfg(SK=2), _cfg(SK=3, BK=64), _cfg(BM=32, BN=64, GM=1, SK=4)], ids=str)
@pytest.mark.parametrize("mode", ["fp16", "fp32", "tf32"])
def test_modes_and_split_k(shape, cfg, mode):
    if cfg is not None and G.check_config(cfg, shape, dtype=mode):
        pytest.skip(G.check_config(cfg, shape, dtype=mode))
    err = check(G, shape, mode, cfg, DEV, seed=3)
    assert err <= G.tolerance(mode), err


def test_single_row_and_torch_linear_agree():
    x = torch.randn(1, 96, device=DEV)
    w = torch.randn(50, 96, device=DEV)
    y = gemm(x, w, "fp32", _cfg(SK=2))
    assert y.shape == (1, 50) and y.dtype == torch.float32
    assert torch.allclose(y, torch_linear(x, w, "fp32"), rtol=1e-4, atol=1e-4)


def test_errors_name_the_argument():
    x = torch.randn(4, 32).half()
    with pytest.raises(ValueError, match="x.shape"):
        gemm(x, torch.randn(8, 16).half())
    with pytest.raises(ValueError, match="needs x and w in"):
        gemm(x, torch.randn(8, 32), "fp16")
    with pytest.raises(ValueError, match="dtype="):
        gemm(x, torch.randn(8, 32).half(), "int4")


def test_fused_and_two_pass_split_k_agree_and_counters_reset():
    from kernels.gemm import _COUNTERS

    x = torch.randn(5, 200, device=DEV)
    w = torch.randn(70, 200, device=DEV)
    cfg = _cfg(SK=4)
    fused = gemm(x, w, "fp32", cfg, fused_split_k=True)
    two_pass = gemm(x, w, "fp32", cfg, fused_split_k=False)
    assert torch.equal(gemm(torch.cat([x] * 4), w, "fp32", cfg)[:5], two_pass)  # M=20: two-pass by default
    assert torch.equal(fused, two_pass)
    assert int(_COUNTERS[str(x.device)].abs().sum()) == 0


def test_linear_implementations_agree_and_auto_follows_the_tuned_file(tmp_path, monkeypatch):
    from kernels import configs
    from kernels.linear import linear, resolve_impl

    x = torch.randn(3, 96, device=DEV)
    w = torch.randn(40, 96, device=DEV)
    ref = torch_linear(x, w, "fp32")
    assert torch.allclose(linear(x, w, "fp32", "torch"), ref)
    assert torch.allclose(linear(x, w, "fp32", "triton", _cfg(SK=2)), ref, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(configs.ENV_VAR, str(tmp_path))
    configs.clear_cache()
    assert resolve_impl("auto", 3, 40, 96, "fp32", DEV) == "torch"  # no entry: the library
    gpu = configs.gpu_name(DEV if CUDA else None)
    configs.write_config_file("gemm", gpu, "fp32", {"K=96,M=4,N=40": {"config": _cfg(), "impl": "triton"}})
    assert resolve_impl("auto", 3, 40, 96, "fp32", DEV) == "triton"  # nearest key M=4 names the Triton kernel
    configs.write_config_file("gemm", gpu, "fp32", {"K=96,M=4,N=40": {"config": _cfg(), "impl": "torch"}})
    assert resolve_impl("auto", 3, 40, 96, "fp32", DEV) == "torch"
    with pytest.raises(ValueError, match="impl="):
        linear(x, w, "fp32", "cublas")
    configs.clear_cache()


def test_torch_linear_takes_row_wise_fp8_scales_on_a_cpu():
    """The library path with one scale per row of x and of W (torch._scaled_mm runs fp8 on a CPU too), against the
    float64 product of the dequantised operands, and the checks that name a scale of the wrong size."""
    from kernels.gemm import _check, gemm_reference, torch_linear

    torch.manual_seed(3)
    M, N, K = 3, 48, 64
    x = torch.randn(M, K) * torch.tensor([1e-3, 1.0, 10.0])[:, None]
    w = torch.randn(N, K) / 8
    xs, ws = x.abs().amax(1) / 448.0, w.abs().amax(1) / 448.0
    xq, wq = (x / xs[:, None]).to(torch.float8_e4m3fn), (w / ws[:, None]).to(torch.float8_e4m3fn)
    y, ref = torch_linear(xq, wq, "fp8", x_scale=xs, w_scale=ws).double(), gemm_reference(xq, wq, "fp8", xs, ws)
    for row in range(M):
        assert (y[row] - ref[row]).norm() / ref[row].norm() < 1e-2, row
    with pytest.raises(ValueError, match="x_scale"):
        _check(xq, wq, "fp8", xs[:2], ws, None)


def test_torch_linear_row_wise_fp8_on_a_cpu_whose_torch_takes_only_per_tensor_scales(monkeypatch):
    """torch before 2.13 refuses row-wise fp8 scales on a CPU (the H200 image's torch 2.11 failed the test above):
    the library path then multiplies the dequantised operands in float32, and every row still matches."""
    from kernels.gemm import gemm_reference, torch_linear

    def refuse(a, b, scale_a, scale_b, out_dtype=None):
        if scale_a.numel() > 1 or scale_b.numel() > 1:
            raise RuntimeError("Now _scaled_mm only supports per-tensor scaling for CPU backend.")
        return real(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)

    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    torch.manual_seed(4)
    x = torch.randn(3, 64) * torch.tensor([1e-3, 1.0, 10.0])[:, None]
    w = torch.randn(48, 64) / 8
    xs, ws = x.abs().amax(1) / 448.0, w.abs().amax(1) / 448.0
    xq, wq = (x / xs[:, None]).to(torch.float8_e4m3fn), (w / ws[:, None]).to(torch.float8_e4m3fn)
    y, ref = torch_linear(xq, wq, "fp8", x_scale=xs, w_scale=ws), gemm_reference(xq, wq, "fp8", xs, ws)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 48)
    for row in range(3):
        assert (y[row].double() - ref[row]).norm() / ref[row].norm() < 1e-2, row


def test_group_m_is_canonical_only_where_there_is_one_row_block():
    """GROUP_M orders row blocks: with one (M <= BLOCK_M) every value is the same program, so the canonical config
    says 1; with several it is kept. The GEMV (no GROUP_M) is left as it is."""
    gemm_kernel = get_kernel("gemm")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    assert gemm_kernel.canonical_config(cfg, {"M": 16, "N": 256, "K": 512})["GROUP_M"] == 1
    assert gemm_kernel.canonical_config(cfg, {"M": 1, "N": 256, "K": 512})["GROUP_M"] == 1
    assert gemm_kernel.canonical_config(cfg, {"M": 17, "N": 256, "K": 512})["GROUP_M"] == 8
    assert gemm_kernel.canonical_config({**cfg, "BLOCK_M": 64}, {"M": 64, "N": 256, "K": 512})["GROUP_M"] == 1
    gemv_cfg = get_kernel("gemv").default_config({"M": 1, "N": 256, "K": 512})
    assert get_kernel("gemv").canonical_config(gemv_cfg, {"M": 1, "N": 256, "K": 512}) == gemv_cfg


def test_group_m_twins_compute_the_same_bits():
    """The two GROUP_M values at one row block launch the same tiles: bit-identical outputs, several row counts."""
    gemm_kernel = get_kernel("gemm")
    for m in (1, 5, 16):
        shape = {"M": m, "N": 96, "K": 256}
        inputs = gemm_kernel.make_inputs(shape, "fp16", DEV, seed=m)
        cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 2, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}
        twin = gemm_kernel.canonical_config(cfg, shape)
        assert twin["GROUP_M"] == 1
        a = gemm(inputs["x"], inputs["w"], "fp16", cfg)
        b = gemm(inputs["x"], inputs["w"], "fp16", twin)
        assert torch.equal(a, b), m
