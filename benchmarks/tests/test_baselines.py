"""The frozen previous kernels of benchmarks/baselines/ that benchmarks/kernels.py times beside the current ones: each
within tolerance of the reference, as the current kernel is (the GEMM on the CPU in Triton's interpreter; the sparse
decode at V4-Flash shapes on a GPU)."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.gemm import gemm

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if CUDA else "cpu"
G = get_kernel("gemm")
SD = get_kernel("sparse_decode")


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


def _sd(S, BH, BT, nw, ns):
    return {"S": S, "BLOCK_H": BH, "BLOCK_T": BT, "num_warps": nw, "num_stages": ns}


@pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
@pytest.mark.parametrize("cfg", [_cfg(SK=2), _cfg(SK=4, BK=16, BN=64)], ids=str)
def test_frozen_previous_gemm_matches_the_reference_as_the_current_one_does(cfg):
    """benchmarks/baselines/gemm_v1.py (the kernel before its tiles were known to be aligned), which
    benchmarks/kernels.py times beside the current kernel: same inputs, both within tolerance of the float64
    reference, fused split-K (M <= 16) and the two-pass one (M = 17)."""
    from benchmarks.baselines.gemm_v1 import gemm_v1
    from kernels.gemm import gemm_reference

    for shape in G.shapes("test"):
        inputs = G.make_inputs(shape, "fp16", DEV, seed=5)
        ref = gemm_reference(inputs["x"], inputs["w"])
        old = gemm_v1(inputs["x"], inputs["w"], "fp16", cfg).double()
        new = gemm(inputs["x"], inputs["w"], "fp16", cfg).double()
        for y in (old, new):
            assert ((y - ref).norm() / ref.norm()).item() <= G.tolerance("fp16")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU with CUDA")
def test_frozen_previous_sparse_decode_matches_the_reference_at_many_splits():
    """benchmarks/baselines/sparse_decode_v1.py at batch 1 and the split counts that used to cost most (S=32, 64 with
    16-row tiles; the previous version caps S at 32), bf16, V4-Flash shape: within tolerance of the reference."""
    from benchmarks.baselines.sparse_decode_v1 import sparse_decode_v1
    from kernels.base import rel_error

    shape = dict(SD.shapes("v4flash")[0], ragged=1)
    for cfg in (_sd(32, 16, 16, 4, 2), _sd(64, 16, 16, 4, 2), _sd(64, 64, 16, 8, 2)):
        assert check(SD, shape, "bfloat16", cfg, "cuda", seed=cfg["S"]) <= SD.tolerance("bfloat16")
        inp = SD.make_inputs(shape, "bfloat16", "cuda", seed=1)
        old = sparse_decode_v1(inp["q"], inp["kv"], inp["indices"], inp["sm_scale"], dict(cfg, S=min(cfg["S"], 32)))
        assert rel_error(old, SD.reference(inp)) <= SD.tolerance("bfloat16")
