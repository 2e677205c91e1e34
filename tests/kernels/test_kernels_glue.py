"""Fused add+RMSNorm and interleaved RoPE."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.glue import fused_add_rmsnorm, rope, rope_cos_sin, rope_reference

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
NORM, ROPE = get_kernel("rmsnorm"), get_kernel("rope")


@pytest.mark.parametrize("shape", NORM.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK": 256, "num_warps": 2}, {"BLOCK": 2048, "num_warps": 8}], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rmsnorm(shape, cfg, dtype):
    assert check(NORM, shape, dtype, cfg, DEV, seed=2) <= NORM.tolerance(dtype)


def test_rmsnorm_out_dtype_cast_in_the_same_pass():
    x, r = torch.randn(2, 64, device=DEV).half(), torch.randn(2, 64, device=DEV).half()
    w = torch.rand(64, device=DEV).half()
    y, res = fused_add_rmsnorm(x, r, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and res.dtype == torch.float16
    assert torch.equal(res, (x.float() + r.float()).half())


@pytest.mark.parametrize("shape", ROPE.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK_H": 1, "num_warps": 1}, {"BLOCK_H": 4, "num_warps": 2}], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rope(shape, cfg, dtype):
    assert check(ROPE, shape, dtype, cfg, DEV, seed=4) <= ROPE.tolerance(dtype)


def test_rope_is_interleaved_on_the_last_dims():
    x = torch.zeros(1, 1, 8, device=DEV)
    x[0, 0, 4] = 1.0  # first element of the first rope pair (rope_dim 4 = dims 4..7)
    cs = rope_cos_sin(4, 4, device=DEV)
    y = rope(x, torch.tensor([1], device=DEV), cs, rope_dim=4)
    angle = 1.0  # position 1, pair 0: inv freq 1
    assert torch.allclose(y[0, 0, 4:6].cpu(), torch.tensor([torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))]))
    assert torch.equal(y[0, 0, :4], x[0, 0, :4])
    assert torch.allclose(y.double().cpu(), rope_reference(x, torch.tensor([1], device=DEV), cs, 4).double().cpu())


def test_errors():
    with pytest.raises(ValueError, match="weight"):
        fused_add_rmsnorm(torch.randn(2, 8), torch.randn(2, 8), torch.randn(4))
    with pytest.raises(ValueError, match="rope_dim"):
        rope(torch.randn(2, 2, 8), torch.zeros(2, dtype=torch.int64), rope_cos_sin(4, 6), rope_dim=6)
