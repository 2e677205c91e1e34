"""benchmarks/gemm_floor.py's own kernels on a CPU (Triton's interpreter, fp16): the split-K GEMV it times beside
the library, and the streaming read that gives its read floor, both against float64 references."""

import importlib.util
import os

import pytest
import torch
from conftest import ROOT

RUNNABLE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def gf():
    spec = importlib.util.spec_from_file_location("gemm_floor", ROOT / "benchmarks" / "gemm_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_gemv_matches_the_reference_with_and_without_splits(gf, split_k):
    gen = torch.Generator(device=DEV).manual_seed(split_k)
    x = torch.randn(1, 256, generator=gen, device=DEV).half()
    w = (torch.randn(40, 256, generator=gen, device=DEV) / 16).half()  # N not a multiple of BLOCK_N: masked rows
    ref = x.double() @ w.double().t()
    cfg = {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": split_k, "num_warps": 4, "num_stages": 1}
    for _ in range(2):  # the split counters reset themselves: a second call is right too
        y = gf.gemv(x, w, cfg)
        assert y.shape == (1, 40) and y.dtype == torch.float16
        assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_read_kernel_sums_each_block(gf):
    src = torch.randn(3 * 64 + 5, device=DEV).half()
    out = torch.full((4,), float("nan"), device=DEV)
    gf._read_kernel[(4,)](src, out, src.numel(), BLOCK=64)
    want = torch.stack([src[i * 64:(i + 1) * 64].double().sum() for i in range(4)])
    assert torch.allclose(out.double(), want, rtol=1e-3, atol=1e-3)


def test_long_k_configs_pass_the_kernels_rules(gf):
    from kernels.gemm import GemmKernel

    for shape in gf._shapes():
        configs = gf._long_k_configs(shape)
        assert configs and all(c["BLOCK_K"] >= 512 for c in configs), shape
        for c in configs:
            assert GemmKernel.instance.check_config(c, shape, None, dtype="bf16") is None, (shape, c)
