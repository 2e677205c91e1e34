"""Fused MoE: alignment invariants, every CPU-testable dtype and tile, repeats of one expert, torch path."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.moe import MoEKernel, fused_moe, moe_align, moe_reference, moe_torch

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
MOE = get_kernel("moe")


def _cfg(BM=16, BN=32, BK=32, nw=4, ns=2):
    return {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "num_warps": nw, "num_stages": ns}


@pytest.mark.parametrize("block_m", [16, 32])
def test_align_groups_every_pair_once_by_expert(block_m):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 7, (13, 3), generator=g)
    sorted_pair, block_expert = moe_align(ids, 7, block_m)
    P = ids.numel()
    assert sorted_pair.numel() == block_expert.numel() * block_m
    valid = sorted_pair[sorted_pair < P]
    assert sorted(valid.tolist()) == list(range(P))  # every pair exactly once
    flat = ids.reshape(-1)
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_pair[b * block_m : (b + 1) * block_m]
        rows = rows[rows < P]
        if e == 7:
            assert rows.numel() == 0  # unused block
        else:
            assert (flat[rows.long()] == e).all()  # one expert per block
    used = int(torch.unique(flat).numel())
    assert int((block_expert < 7).sum()) == sum(-(-int((flat == e).sum()) // block_m) for e in range(7)) >= used


@pytest.mark.parametrize("shape", MOE.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, _cfg(), _cfg(BM=32, BN=64, BK=64), _cfg(BK=64, BN=16)], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_matches_reference(shape, cfg, dtype):
    if cfg is not None and MOE.check_config(cfg, shape, dtype=dtype):
        pytest.skip(MOE.check_config(cfg, shape, dtype=dtype))
    err = check(MOE, shape, dtype, cfg, DEV, seed=7)
    assert err <= MOE.tolerance(dtype), err


def test_repeated_experts_ragged_k_and_one_token():
    g = torch.Generator(device=DEV).manual_seed(3)
    T, H, W, E, k = 5, 80, 40, 3, 4  # H, W not multiples of BLOCK_K; an expert repeated within a token
    x = torch.randn(T, H, generator=g, device=DEV)
    w13 = torch.randn(E, H, 2 * W, generator=g, device=DEV) * H**-0.5
    w2 = torch.randn(E, W, H, generator=g, device=DEV) * W**-0.5
    ids = torch.tensor([[0, 0, 1, 2], [2, 2, 2, 2], [1, 0, 1, 0], [0, 1, 2, 0], [2, 1, 0, 1]], device=DEV)
    wts = torch.rand(T, k, generator=g, device=DEV) + 0.1
    ref = moe_reference(x, w13, w2, ids, wts)
    out = fused_moe(x, w13, w2, ids, wts, _cfg(BK=32, BN=16))
    assert torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref) < 1e-4
    one = fused_moe(x[:1], w13, w2, ids[:1], wts[:1], _cfg())
    assert torch.allclose(one, out[:1], rtol=1e-5, atol=1e-5)
    torch_out = moe_torch(x, w13, w2, ids, wts)
    assert torch.linalg.vector_norm(torch_out.double() - ref) / torch.linalg.vector_norm(ref) < 1e-4


def test_rules_and_errors_name_the_thing():
    shape = MOE.shapes("test")[0]  # 3 tokens x top-2 = 6 pairs
    assert MOE.check_config(_cfg(BM=64), shape).startswith("block_m")
    assert MOE.check_config(_cfg(BN=24), shape).startswith("tile_size")
    assert MOE.check_config({**_cfg(), "SPLIT_K": 2}, shape).startswith("unknown_param")
    assert MOE.check_config(_cfg(BM=64, BN=128, BK=256, nw=4, ns=4), dict(shape, tokens=64)).startswith("shared_memory")
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="w13"):
        fused_moe(
            x, torch.randn(2, 16, 10), torch.randn(2, 4, 16), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1)
        )
    with pytest.raises(ValueError, match="share one of"):
        fused_moe(
            x,
            torch.randn(2, 16, 8).half(),
            torch.randn(2, 4, 16).half(),
            torch.zeros(2, 1, dtype=torch.long),
            torch.ones(2, 1),
        )


def test_default_configs_pass_the_rules_on_v4flash_shapes():
    for shape in MOE.shapes("v4flash"):
        assert MOE.check_config(MOE.default_config(shape), shape, dtype="bfloat16") is None
        assert len(list(MOE.configs(shape, dtype="bfloat16"))) > 20
        c = MOE.cost(shape, "bfloat16")
        assert 0 < c.bytes <= 32 * 3 * 4096 * 2048 * 2 + 2e6  # never more than every local expert once
    one = MOE.cost(MOE.shapes("v4flash")[0], "bfloat16")  # one token: its 6 experts
    assert one.bytes == pytest.approx(6 * 3 * 4096 * 2048 * 2, rel=1e-3)


@pytest.mark.parametrize("batch", [1, 3, 16])  # 1: the gather path of the torch MoE; 3, 16: its capacity path
def test_workload_moe_paths_agree(batch):
    """The decode workload's MoE through the fused kernel equals its torch path on the same weights and routing."""
    from tuner.targets.workload.gpu_ops import triton_moe
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import get_preset

    p = get_preset("dsv4-flash-tiny")
    model = DecodeModel(p, {"gemm_moe": "fp32"}, DEV, seed=2)  # bf16 is broken in the Triton interpreter
    h = torch.randn(batch, p.hidden, generator=torch.Generator(device=DEV).manual_seed(batch), device=DEV).to(
        model.act_dtype
    )
    gw, gi = torch.softmax(model.w.gate(h.float()), dim=-1).topk(p.topk_experts, dim=-1)
    ids = gi % p.experts_local
    x = h.to(model.w.w13.dtype).contiguous()  # the experts' dtype (the activations are bf16 on a GPU)
    out = triton_moe({})(x, model.w.w13, model.w.w2, ids, gw)
    ref = moe_reference(x, model.w.w13, model.w.w2, ids, gw)
    tol = 1e-4 if DEV == "cpu" else MoEKernel.instance.tolerance("float32")  # tf32 dots on an NVIDIA GPU
    assert torch.linalg.vector_norm(out.double() - ref.double()) / torch.linalg.vector_norm(ref.double()) < tol
    if batch == 1:  # the torch gather path computes the same; its capacity path (larger batches) drops overflow pairs
        torch_path = model._moe_torch(h, gi, gw)
        assert torch.linalg.vector_norm(torch_path.double() - ref) / torch.linalg.vector_norm(ref) < 1e-4


def test_input_sets_share_the_expert_weights_and_vary_the_routing():
    """Timing rotates several routings: each seed's set has its own tokens and routing over one copy of the
    weights, so a 1.5 GB expert set still leaves room for four routings."""
    k = MoEKernel.instance
    shape = k.shapes("test")[1]
    a, b = k.make_inputs(shape, "float16", "cpu", 1), k.make_inputs(shape, "float16", "cpu", 2)
    assert a["w13"] is b["w13"] and a["w2"] is b["w2"]
    assert not torch.equal(a["x"], b["x"]) and not torch.equal(a["ids"], b["ids"])
    from kernels.base import release_shared_inputs

    release_shared_inputs()  # what a compile helper does once it has the shapes: the next set makes new weights
    assert k.make_inputs(shape, "float16", "cpu", 1)["w13"] is not a["w13"]
    big = k.shapes("v4flash")[2]
    assert k.cost(big).bytes > 1e9 > 1e7 > k.rotation_bytes(big)
