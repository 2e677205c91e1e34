"""Indexer scoring (fused relu-weighted head sum) and top-k against the float64 reference."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.indexer import indexer_reference, indexer_scores, indexer_topk

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
K = get_kernel("indexer")
SHAPES = K.shapes("test")


@pytest.mark.parametrize("shape", SHAPES, ids=["per_request_ragged_scaled", "shared_k"])
@pytest.mark.parametrize(
    "cfg",
    [
        None,
        {"BLOCK_N": 16, "TILES": 1, "num_warps": 4, "num_stages": 1},
        {"BLOCK_N": 32, "TILES": 8, "num_warps": 2, "num_stages": 3},
        {"BLOCK_N": 64, "TILES": 2, "num_warps": 8, "num_stages": 2},
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_scores(shape, cfg, dtype):
    err = check(K, shape, dtype, cfg, DEV, seed=hash(str(cfg)) % 1000)
    assert err <= K.tolerance(dtype), err


def test_width_below_num_rows_and_lengths_mask():
    shape = dict(SHAPES[0], width=70)  # score 70 of 160 rows (live-length width)
    inputs = K.make_inputs(shape, "float32", DEV, seed=4)
    inputs["lengths"] = torch.tensor([70, 0, 33], dtype=torch.int32, device=DEV)
    out = indexer_scores(inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], inputs["lengths"], 70)
    ref = indexer_reference(inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], inputs["lengths"], 70)
    assert out.shape == (3, 70)
    assert torch.isinf(out[1]).all() and torch.isinf(out[2, 33:]).all() and torch.isfinite(out[2, :33]).all()
    fin = torch.isfinite(ref)
    tol = 1e-3 if DEV == "cpu" else K.tolerance("float32")  # float32 dots run as tf32 on an NVIDIA GPU
    assert torch.allclose(out[fin].double().cpu(), ref[fin].double().cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("skip_dead", [True, False])
def test_dead_tiles_computed_or_skipped_score_the_same(skip_dead):
    # a server's capacity-sized grid (skip_dead=False) runs every tile on masked loads; the scores must not change
    shape = dict(SHAPES[0], width=150)
    inputs = K.make_inputs(shape, "float32", DEV, seed=11)
    lengths = torch.tensor([150, 0, 21], dtype=torch.int32, device=DEV)  # full, none live, dead tiles past 21
    cfg = {"BLOCK_N": 16, "TILES": 2, "num_warps": 4, "num_stages": 1}
    out = torch.full((3, 150), float("nan"), device=DEV)
    indexer_scores(
        inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], lengths, 150, cfg, out=out, skip_dead=skip_dead
    )
    ref = indexer_reference(inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], lengths, 150)
    assert not out.isnan().any()
    assert torch.equal(torch.isinf(out).cpu(), torch.isinf(ref).cpu()) and torch.isinf(out[1]).all()
    fin = torch.isfinite(ref)
    err = (out[fin].double().cpu() - ref[fin].cpu()).norm() / ref[fin].norm()
    assert err <= K.tolerance("float32"), err
    idx, _ = indexer_topk(
        inputs["q"], inputs["k"], inputs["w"], 30, inputs["k_scale"], lengths, 150, cfg, skip_dead=skip_dead
    )
    assert (idx[2, 21:] == -1).all() and (idx[2, :21] >= 0).all()


def test_topk_indices_feed_sparse_decode():
    shape = dict(SHAPES[0])
    inputs = K.make_inputs(shape, "float32", DEV, seed=9)
    inputs["lengths"] = torch.tensor([150, 5, 40], dtype=torch.int32, device=DEV)
    idx, vals = indexer_topk(inputs["q"], inputs["k"], inputs["w"], 20, inputs["k_scale"], inputs["lengths"], 150)
    assert idx.dtype == torch.int32 and idx.shape == (3, 20)
    assert (idx[1, 5:] == -1).all() and (idx[1, :5] >= 0).all() and (idx[1, :5] < 5).all()
    ref = indexer_reference(inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], inputs["lengths"], 150)
    expect = torch.topk(ref[0], 20).indices.sort().values.cpu()
    assert torch.equal(idx[0].long().sort().values.cpu(), expect)
    # topk larger than width pads with -1
    idx2, _ = indexer_topk(inputs["q"], inputs["k"], inputs["w"], 200, inputs["k_scale"], None, 150)
    assert idx2.shape == (3, 200) and (idx2[:, 150:] == -1).all()


def test_launcher_errors_name_the_argument():
    q = torch.randn(2, 16, 32).half()
    k = torch.randn(2, 50, 32).half()
    w = torch.randn(2, 16)
    with pytest.raises(ValueError, match="width=60"):
        indexer_scores(q, k, w, width=60)
    with pytest.raises(ValueError, match="w must be"):
        indexer_scores(q, k, w[:, :8])
    with pytest.raises(ValueError, match="k_scale"):
        indexer_scores(q, k, w, k_scale=torch.ones(50))
    with pytest.raises(ValueError, match="topk"):
        indexer_topk(q, k, w, 0)
