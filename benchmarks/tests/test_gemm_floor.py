"""benchmarks/gemm_floor.py on a CPU (Triton's interpreter, fp16): the streaming read that gives its read floor
against a float64 reference, and the configs it times."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def gf():
    spec = importlib.util.spec_from_file_location("gemm_floor", ROOT / "benchmarks" / "gemm_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_read_kernel_sums_each_block(gf):
    src = torch.randn(3 * 64 + 5, device=DEV).half()
    out = torch.full((4,), float("nan"), device=DEV)
    gf._read_kernel[(4,)](src, out, src.numel(), BLOCK=64)
    want = torch.stack([src[i * 64 : (i + 1) * 64].double().sum() for i in range(4)])
    assert torch.allclose(out.double(), want, rtol=1e-3, atol=1e-3)


def test_long_k_configs_pass_the_kernels_rules(gf):
    from kernels.gemm import GemmKernel

    for shape in gf._shapes():
        configs = gf._long_k_configs(shape)
        assert configs and all(c["BLOCK_K"] >= 512 for c in configs), shape
        for c in configs:
            assert GemmKernel.instance.check_config(c, shape, None, dtype="bf16") is None, (shape, c)


def test_gemv_configs_are_the_gemv_kernels_space_at_one_row_only(gf):
    from kernels.gemv import GemvKernel

    one, sixteen = {"M": 1, "N": 1024, "K": 4096}, {"M": 16, "N": 1024, "K": 4096}
    assert gf._gemv_configs(one) == list(GemvKernel.instance.configs(one, None, dtype="bf16")) != []
    assert gf._gemv_configs(sixteen) == []
