"""Sparse MLA/MQA decode: MMA split-K kernel and SIMT baseline against the float64 reference."""

import math
import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.base import InvalidConfig
from kernels.sparse_decode import (
    sparse_decode,
    sparse_decode_reference,
    sparse_decode_simt,
)

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"

MMA = get_kernel("sparse_decode")
SIMT = get_kernel("sparse_decode_simt")
SHAPE = {"batch": 3, "heads": 16, "d_qk": 64, "d_v": 64, "topk": 40, "num_rows": 97, "ragged": 1}


def _cfg(S, BLOCK_H=16, BLOCK_T=16, num_warps=4, num_stages=1):
    return {"S": S, "BLOCK_H": BLOCK_H, "BLOCK_T": BLOCK_T, "num_warps": num_warps, "num_stages": num_stages}


@pytest.mark.parametrize("S", [1, 2, 3, 4, 7, 8, 16, 32, 40])
def test_every_split_count(S):
    err = check(MMA, SHAPE, "float16", _cfg(S), DEV, seed=S)
    assert err <= MMA.tolerance("float16"), err


@pytest.mark.parametrize(
    "cfg",
    [_cfg(1, 32, 32), _cfg(4, 16, 64, 8, 2), _cfg(2, 64, 16, 8, 3), _cfg(8, 32, 16, 4, 2)],
    ids=str,
)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_tile_configs(cfg, dtype):
    err = check(MMA, SHAPE, dtype, cfg, DEV, seed=11)
    assert err <= MMA.tolerance(dtype), err


def test_default_config_and_lookup_path():
    err = check(MMA, SHAPE, "float16", None, DEV, seed=3)
    assert err <= MMA.tolerance("float16")


@pytest.mark.parametrize("heads", [20, 5])
def test_heads_not_multiple_of_block(heads):
    shape = dict(SHAPE, heads=heads)
    assert check(MMA, shape, "float16", _cfg(3, 16, 16), DEV, seed=heads) <= 5e-3
    assert check(SIMT, shape, "float16", None, DEV, seed=heads) <= 5e-3


def test_rope_tail_like_v32():
    shape = dict(SHAPE, d_qk=80, d_v=64)  # 64 "nope+v" dims + a 16-dim tail, like 512 + 64
    for cfg in (_cfg(1), _cfg(5, 32, 32)):
        assert check(MMA, shape, "float32", cfg, DEV, seed=5) <= 5e-3
    assert check(SIMT, shape, "float32", None, DEV, seed=5) <= 5e-3


@pytest.mark.parametrize("cfg", [None, {"BLOCK_T": 32, "num_warps": 2}], ids=str)
def test_simt_baseline(cfg):
    assert check(SIMT, SHAPE, "float16", cfg, DEV, seed=7) <= SIMT.tolerance("float16")


def test_padding_last_row_and_out_of_range():
    gen = torch.Generator().manual_seed(0)
    B, H, D, rows = 4, 16, 64, 50
    q = torch.randn(B, H, D, generator=gen).half()
    kv = torch.randn(rows, D, generator=gen).half()
    idx = torch.randint(0, rows, (B, 24), generator=gen, dtype=torch.int32)
    idx[0, :] = -1  # no valid row at all: zeros
    idx[1, 3:] = -1  # one valid row after padding starts
    idx[1, :3] = torch.tensor([rows - 1, -1, rows - 1])  # last cache row, twice
    idx[2, 5] = rows  # out of range counts as padding
    idx[3, ::2] = rows - 1
    q, kv, idx = q.to(DEV), kv.to(DEV), idx.to(DEV)
    ref = sparse_decode_reference(q, kv, idx)
    for fn, cfg in ((sparse_decode, _cfg(4)), (sparse_decode, _cfg(1)), (sparse_decode_simt, None)):
        out = torch.full((B, H, D), float("nan"), device=DEV, dtype=q.dtype)
        fn(q, kv, idx, config=cfg, out=out)
        assert torch.isfinite(out).all()
        assert torch.all(out[0] == 0)
        rel = (out.double() - ref.double().to(out.device)).norm() / ref.double().norm()
        assert rel < 5e-3


def test_launcher_errors_name_the_argument():
    q = torch.randn(2, 16, 64).half()
    kv = torch.randn(10, 64).half()
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="indices.dtype"):
        sparse_decode(q, kv, idx.long())
    with pytest.raises(ValueError, match=r"kv.shape\[1\]"):
        sparse_decode(q, kv[:, :32].contiguous(), idx)
    with pytest.raises(ValueError, match="d_v"):
        sparse_decode(torch.randn(2, 16, 80).half(), torch.randn(10, 80).half(), idx)
    with pytest.raises(InvalidConfig, match="tile_size"):
        sparse_decode(q, kv, idx, config=_cfg(1, BLOCK_T=8))


def test_reference_matches_plain_softmax_attention():
    gen = torch.Generator().manual_seed(1)
    q, kv = (
        torch.randn(1, 2, 8, generator=gen, dtype=torch.float64),
        torch.randn(6, 8, generator=gen, dtype=torch.float64),
    )
    idx = torch.tensor([[5, 0, 2]], dtype=torch.int32)
    k = kv[[5, 0, 2]]
    expect = torch.softmax(q[0] @ k.T / math.sqrt(8), -1) @ k
    assert torch.allclose(sparse_decode_reference(q, kv, idx)[0], expect)


def test_seed_configs_fill_one_wave_and_pass_the_rules():
    from kernels import get_kernel

    sd = get_kernel("sparse_decode")
    for shape in sd.shapes("v4flash"):
        seeds = sd.seed_configs(shape, None, "bfloat16")
        assert seeds and sd.default_config(shape) not in seeds
        for c in seeds:
            assert sd.check_config(c, shape, None, dtype="bfloat16") is None
            programs = shape["batch"] * -(-shape["heads"] // c["BLOCK_H"]) * c["S"]
            assert 132 / 2**0.5 <= programs <= 132 * 2**0.5 or c["S"] in (1, 32)  # nearest to one wave
    b64 = dict(sd.shapes("v4flash")[-1], batch=64)
    assert {"S": 1, "BLOCK_H": 32, "BLOCK_T": 128, "num_warps": 4, "num_stages": 2} in sd.seed_configs(b64)


def test_split_rows_are_whole_row_tiles():
    from kernels.sparse_decode import split_rows

    assert split_rows(640, 32, 16) == (32, 20)  # not 32 splits of 20 rows, each ending in a 4-row tile
    assert split_rows(640, 8, 128) == (128, 5)
    assert split_rows(640, 1, 64) == (640, 1)
    for topk in (1, 40, 200, 640, 2048):
        for S in (1, 3, 8, 32, 64):
            for bt in (16, 64, 128):
                rows, n = split_rows(topk, S, bt)
                assert rows % bt == 0 and n <= max(1, S) and (n - 1) * rows < topk <= n * rows


@pytest.mark.parametrize("S", [5, 13, 64])
def test_many_splits_with_whole_splits_of_padding(S):
    """More splits than the 40-row test shape allows; request 1 has its first 96 rows padded, so whole splits hold
    no valid row (log-sum-exp -inf) and the merge must weigh them zero; request 2 has no valid row at all."""
    shape = dict(SHAPE, topk=200, num_rows=301)
    inputs = MMA.make_inputs(shape, "float32", DEV, seed=S)
    idx = inputs["indices"]
    idx[1, :96] = -1
    idx[2, :] = -1
    out = torch.full((3, 16, 64), float("nan"), device=DEV)
    sparse_decode(inputs["q"], inputs["kv"], idx, inputs["sm_scale"], _cfg(S), out=out)
    ref = sparse_decode_reference(inputs["q"], inputs["kv"], idx, inputs["sm_scale"])
    assert torch.isfinite(out).all() and torch.all(out[2] == 0)
    rel = (out.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()
    assert rel <= 5e-3, rel


def _fp8_inputs(shape, seed):
    inputs = MMA.make_inputs(shape, "float8_e4m3fn", DEV, seed=seed)
    if not CUDA:  # the interpreter runs fp8 but not bf16: q in fp16 on the CPU
        inputs["q"] = inputs["q"].to(torch.float16)
    return inputs


@pytest.mark.parametrize("cfg", [_cfg(1), _cfg(3), _cfg(2, 32, 32, 8, 2)], ids=str)
def test_fp8_cache_against_float32_reference_of_dequantised_rows(cfg):
    from kernels.base import rel_error

    shape = dict(SHAPE, topk=100, num_rows=211)
    inputs = _fp8_inputs(shape, seed=cfg["S"])
    assert inputs["kv"].dtype == torch.float8_e4m3fn and inputs["kv_scale"].shape == (211,)
    assert inputs["kv_scale"].std() > 0.1 * inputs["kv_scale"].mean()  # rows really have different scales
    out = MMA.output_like(inputs).fill_(float("nan"))
    MMA.run(inputs, cfg, out=out)
    err = rel_error(out, MMA.reference(inputs))
    assert err <= MMA.tolerance("float8_e4m3fn"), err
    # the scales matter: ignoring them is far off
    wrong = sparse_decode_reference(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], inputs["d_v"])
    assert rel_error(out, wrong) > 10 * MMA.tolerance("float8_e4m3fn")


def test_fp8_cache_arguments_are_checked():
    q = torch.randn(2, 16, 64).half()
    kv8 = torch.randn(10, 64).to(torch.float8_e4m3fn)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_scale"):
        sparse_decode(q, kv8, idx)
    with pytest.raises(ValueError, match="kv_scale"):
        sparse_decode(q, kv8, idx, kv_scale=torch.ones(9))
    with pytest.raises(ValueError, match="kv_scale is only for an fp8"):
        sparse_decode(q, torch.randn(10, 64).half(), idx, kv_scale=torch.ones(10))
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        sparse_decode(q.float(), kv8, idx, kv_scale=torch.ones(10))


def test_fp8_cost_moves_half_the_cache_bytes():
    """Gathered rows: 512 bytes + a 4-byte scale instead of 1024 bytes; q and the output stay bf16."""
    shape = MMA.shapes("v4flash")[-1]
    bf16, fp8 = MMA.cost(shape, "bfloat16"), MMA.cost(shape, "float8_e4m3fn")
    rows = shape["batch"] * shape["topk"]
    assert bf16.bytes - fp8.bytes == rows * (2 * 512 - (512 + 4)) and fp8.flops == bf16.flops


@pytest.mark.parametrize("splits", [10, 3, 1])
def test_the_split_k_merge_matches_the_float64_merge(splits, device):
    """``launch_combine`` merges the splits' partials by their log-sum-exps (base 2): the result matches a float64
    merge of the same partials, into NaN-poisoned outputs, and its grid covers every column of every head."""
    from kernels.sparse_decode import combine_grid, launch_combine

    g = torch.Generator().manual_seed(splits)
    B, H, d_v = 1, 4, 512
    part = torch.randn(B, splits, H, d_v, generator=g)
    lse = torch.randn(B, splits, H, generator=g) * 3
    w = torch.softmax(lse.double() * math.log(2), dim=1)  # base-2 log-sum-exps
    ref = (w[..., None] * part.double()).sum(1)
    out = torch.full((B, H, d_v), float("nan"), device=device)
    launch_combine(part.to(device), lse.to(device), out, pdl=False)
    assert (out.double().cpu() - ref).norm() / ref.norm() < 1e-5
    assert combine_grid(B, splits, H, d_v)[1:] == (H, B)


def _h200_sms(monkeypatch):
    """The tl.dot rule counts this machine's SMs; these tests read the H200's (132, what a CPU assumes)."""
    import kernels.sparse_decode as sd

    sms = sd.device_limits(None)["sms"]
    monkeypatch.setattr(sd, "one_wave", lambda: sms)


def test_the_tl_dot_kernel_keeps_a_config_at_its_own_batch_and_sets_only_the_split_count_at_another(monkeypatch):
    from kernels.sparse_decode import SparseDecodeKernel

    _h200_sms(monkeypatch)
    kernel = SparseDecodeKernel.instance
    tuned = {"S": 2, "BLOCK_H": 16, "BLOCK_T": 128, "num_warps": 8, "num_stages": 2}
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
    assert kernel.adapt_config(tuned, shape, shape) is tuned
    # 24 requests x 4 head tiles: two splits make 192 programs, one 96
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 24}) == {**tuned, "S": 1}
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 7}) == {**tuned, "S": 4}  # 84 programs
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 200})["S"] == 1  # no split count fits: one
