"""GPU checks: bf16 and fp8, real DeepSeek-V4-Flash (and V3.2) shapes, every kernel.

Marked ``gpu``; skipped without CUDA. Kept to a few compiles per kernel (each ~1 s on an H200).
"""

import pytest
import torch

from kernels import check, get_kernel
from kernels.base import OutOfResources, classify_failure

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

FP8_OK = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
SD, SIMT, IDX, GEMM = (get_kernel(n) for n in ("sparse_decode", "sparse_decode_simt", "indexer", "gemm"))


def _sd(S, BH, BT, nw, ns):
    return {"S": S, "BLOCK_H": BH, "BLOCK_T": BT, "num_warps": nw, "num_stages": ns}


@pytest.mark.parametrize(
    "cfg", [None, _sd(1, 16, 64, 4, 2), _sd(4, 32, 64, 8, 2), _sd(8, 64, 64, 8, 2), _sd(16, 16, 32, 4, 2)], ids=str
)
def test_sparse_decode_v4flash_bf16(cfg):
    for batch in (1, 5):
        shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
        err = check(SD, shape, "bfloat16", cfg, "cuda", seed=batch)
        assert err <= SD.tolerance("bfloat16"), err


@pytest.mark.skipif(not FP8_OK, reason="fp8 needs compute capability >= 8.9")
@pytest.mark.parametrize(
    "cfg", [None, _sd(1, 16, 32, 4, 2), _sd(8, 16, 16, 4, 2), _sd(4, 32, 32, 8, 2), _sd(2, 64, 32, 8, 3)], ids=str
)
def test_sparse_decode_v4flash_fp8_cache(cfg):
    """e4m3 rows with a float32 scale per row, bf16 q, against the float32 reference of the dequantised cache."""
    for batch in (1, 5, 64):
        shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
        err = check(SD, shape, "float8_e4m3fn", cfg, "cuda", seed=batch)
        assert err <= SD.tolerance("float8_e4m3fn"), err


def test_sparse_decode_many_splits_bf16():
    """Batch 1 at the split counts that used to cost most (S=32, 64 with 16-row tiles) agrees with the reference
    (the previous version at the same configs: benchmarks/tests/test_baselines.py)."""
    shape = dict(SD.shapes("v4flash")[0], ragged=1)
    for cfg in (_sd(32, 16, 16, 4, 2), _sd(64, 16, 16, 4, 2), _sd(64, 64, 16, 8, 2)):
        assert check(SD, shape, "bfloat16", cfg, "cuda", seed=cfg["S"]) <= SD.tolerance("bfloat16")


def test_sparse_decode_merge_with_programmatic_dependent_launch_in_a_graph():
    """The merge kernel launched with PDL (it waits for the split grid in-kernel) gives the same bits as a plain
    second launch, eagerly and replayed in a CUDA graph over changing inputs."""
    from kernels.sparse_decode import sparse_decode

    shape = dict(SD.shapes("v4flash")[0], batch=3, ragged=1)
    cfg = _sd(32, 16, 32, 4, 2)
    inp = SD.make_inputs(shape, "bfloat16", "cuda", seed=11)
    args = (inp["q"], inp["kv"], inp["indices"], inp["sm_scale"], cfg)
    plain = sparse_decode(*args, pdl=False)
    assert torch.equal(sparse_decode(*args, pdl=True), plain)
    out = torch.empty_like(plain)
    graph = torch.cuda.CUDAGraph()
    sparse_decode(*args, out=out, pdl=True)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        sparse_decode(*args, out=out, pdl=True)
    for seed in (12, 13, 14):
        fresh = SD.make_inputs(shape, "bfloat16", "cuda", seed=seed)
        inp["q"].copy_(fresh["q"])
        inp["kv"].copy_(fresh["kv"])
        inp["indices"].copy_(fresh["indices"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, sparse_decode(*args, pdl=False))


def test_sparse_decode_v32_bf16_and_simt():
    shape = dict(SD.shapes("v32")[0], batch=2, ragged=1)
    assert check(SD, shape, "bfloat16", None, "cuda", seed=1) <= SD.tolerance("bfloat16")
    assert check(SD, shape, "bfloat16", _sd(4, 64, 32, 8, 2), "cuda", seed=2) <= SD.tolerance("bfloat16")
    assert check(SIMT, dict(SD.shapes("v4flash")[0], batch=2, ragged=1), "bfloat16", None, "cuda") <= SIMT.tolerance(
        "bfloat16"
    )


def test_sparse_decode_fp16():
    shape = dict(SD.shapes("v4flash")[0], batch=3, ragged=1)
    assert check(SD, shape, "float16", None, "cuda", seed=4) <= SD.tolerance("float16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_indexer_64k_rows(dtype):
    if dtype.startswith("float8") and not FP8_OK:
        pytest.skip("fp8 needs compute capability >= 8.9")
    shape = {"batch": 3, "heads": 64, "dim": 128, "width": 65536, "shared_k": 0, "ragged": 1}
    for cfg in (None, {"BLOCK_N": 128, "TILES": 4, "num_warps": 8, "num_stages": 3}):
        err = check(IDX, shape, dtype, cfg, "cuda", seed=5)
        assert err <= IDX.tolerance(dtype), err


@pytest.mark.parametrize("mode", ["bf16", "fp16", "tf32", "fp32", "fp8"])
def test_gemm_decode_shapes(mode):
    if mode == "fp8" and not FP8_OK:
        pytest.skip("fp8 needs compute capability >= 8.9")
    for shape in ({"M": 1, "N": 1024, "K": 4096}, {"M": 64, "N": 4096, "K": 2048}, {"M": 37, "N": 1000, "K": 1030}):
        err = check(GEMM, shape, mode, None, "cuda", seed=6)
        assert err <= GEMM.tolerance(mode), (shape, err)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
    assert check(GEMM, {"M": 3, "N": 2048, "K": 4096}, mode, cfg, "cuda") <= GEMM.tolerance(mode)


@pytest.mark.parametrize("name", ["rmsnorm", "rope"])
def test_glue_bf16(name):
    kernel = get_kernel(name)
    for shape in kernel.shapes("v4flash"):
        assert check(kernel, shape, "bfloat16", None, "cuda") <= kernel.tolerance("bfloat16")


def test_out_of_resources_is_raised_and_classified():
    """A config check_config rejects for shared memory really fails to launch on the device."""
    from kernels.sparse_decode import _sparse_decode_kernel

    q = torch.randn(1, 64, 512, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 1024, (1, 640), device="cuda", dtype=torch.int32)
    out = torch.empty(1, 64, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(Exception) as info:
        _sparse_decode_kernel[(1, 1, 1)](
            q,
            kv,
            kv,
            idx,
            out,
            out,
            out,
            1,
            64,
            1024,
            640,
            640,
            1,
            1.0,
            q.stride(0),
            q.stride(1),
            kv.stride(0),
            idx.stride(0),
            0,
            0,
            0,
            0,
            0,
            out.stride(0),
            out.stride(1),
            DV=512,
            DT=0,
            D_TAIL=0,
            BLOCK_H=64,
            BLOCK_T=256,
            DIRECT=True,
            KV_SCALED=False,
            PREFETCH=True,
            PDL=False,
            num_warps=8,
            num_stages=3,
        )
        torch.cuda.synchronize()
    assert classify_failure(info.value) == "out_of_resources", repr(info.value)
    assert isinstance(info.value, OutOfResources) or "resource" in str(info.value).lower()


def test_gemm_fused_split_k_has_no_race():
    """The last-arriving split of the GEMM's fused split-K reduces: repeated runs match the separate reduction's
    result bit for bit (no race)."""
    from kernels.gemm import gemm

    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    gcfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    ref = gemm(x, w, "bf16", gcfg, fused_split_k=False)
    for _ in range(20):
        assert torch.equal(gemm(x, w, "bf16", gcfg, fused_split_k=True), ref)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_moe_v4flash_shapes(dtype):
    moe = get_kernel("moe")
    for shape in moe.shapes("v4flash"):
        for cfg in (None, {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4}):
            err = check(moe, shape, dtype, cfg, "cuda", seed=shape["tokens"])
            assert err <= moe.tolerance(dtype), (shape, cfg, err)


@pytest.mark.skipif(not FP8_OK, reason="fp8 needs compute capability >= 8.9")
@pytest.mark.parametrize("split_k", [1, 4])
def test_gemm_fp8_row_wise_scales_match_the_reference_and_the_library(split_k):
    """fp8 with one scale per row of x and per row of W (the twin's fp8 linears): the Triton kernel and
    torch._scaled_mm against the float32 product of the dequantised operands, rows of very different size."""
    from kernels.gemm import gemm, gemm_reference, torch_linear

    g = torch.Generator(device="cuda").manual_seed(11)
    M, N, K = 5, 1024, 2048
    x = torch.randn(M, K, generator=g, device="cuda") * torch.logspace(-3, 1, M, device="cuda")[:, None]
    w = torch.randn(N, K, generator=g, device="cuda") * K**-0.5
    xs, ws = x.abs().amax(1) / 448.0, w.abs().amax(1) / 448.0
    xq, wq = (x / xs[:, None]).to(torch.float8_e4m3fn), (w / ws[:, None]).to(torch.float8_e4m3fn)
    ref = gemm_reference(xq, wq, "fp8", xs, ws)
    cfg = {
        "BLOCK_M": 16,
        "BLOCK_N": 64,
        "BLOCK_K": 128,
        "SPLIT_K": split_k,
        "GROUP_M": 8,
        "num_warps": 4,
        "num_stages": 3,
    }
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    for y in (
        gemm(xq, wq, "fp8", cfg, x_scale=xs, w_scale=ws, out=out),
        torch_linear(xq, wq, "fp8", x_scale=xs, w_scale=ws),
    ):
        for row in range(M):  # every row to bf16 precision, however small its scale
            err = ((y[row].float() - ref[row]).norm() / ref[row].norm()).item()
            assert err < 1e-2, (row, err)


@pytest.mark.parametrize("mode", ["bf16", "fp16", "fp32", "fp8"])
def test_gemv_decode_shapes(mode):
    """The one-row GEMV at the V4-Flash decode shapes (default config, and a split config with a ragged N and K),
    into NaN-poisoned outputs against the float32 reference."""
    if mode == "fp8" and not FP8_OK:
        pytest.skip("fp8 needs compute capability >= 8.9")
    gemv_kernel = get_kernel("gemv")
    for shape in gemv_kernel.shapes("v4flash") + [{"M": 1, "N": 1000, "K": 1030}]:
        err = check(gemv_kernel, shape, mode, None, "cuda", seed=6)
        assert err <= gemv_kernel.tolerance(mode), (shape, err)
    cfg = {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 8, "num_warps": 8}
    assert check(gemv_kernel, {"M": 1, "N": 2040, "K": 4000}, mode, cfg, "cuda") <= gemv_kernel.tolerance(mode)


@pytest.mark.skipif(not FP8_OK, reason="fp8 needs compute capability >= 8.9")
def test_gemv_fp8_row_wise_weight_scales_match_the_reference():
    from kernels.gemm import gemm_reference
    from kernels.gemv import gemv

    g = torch.Generator(device="cuda").manual_seed(12)
    N, K = 1024, 2048
    x = torch.randn(1, K, generator=g, device="cuda")
    w = torch.randn(N, K, generator=g, device="cuda") * torch.logspace(-3, 1, N, device="cuda")[:, None]
    xs, ws = x.abs().amax(1) / 448.0, w.abs().amax(1) / 448.0
    xq, wq = (x / xs[:, None]).to(torch.float8_e4m3fn), (w / ws[:, None]).to(torch.float8_e4m3fn)
    ref = gemm_reference(xq, wq, "fp8", xs, ws)
    out = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = gemv(
        xq, wq, "fp8", {"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 8}, x_scale=xs, w_scale=ws, out=out
    )
    rows = torch.arange(N, device="cuda")
    for lo in (rows < 64, rows >= N - 64):  # the smallest-scale and the largest-scale rows, each to bf16 precision
        err = ((y[0, lo].float() - ref[0, lo]).norm() / ref[0, lo].norm()).item()
        assert err < 1e-2, err
