"""SGLang's Hopper indexer in the twin (indexer_impl=deepgemm: DeepGEMM's paged MQA logits over SGLang's paged fp8
index cache, then the top-k of the live columns).

On any machine: the cache, page table and lengths the twin builds have SGLang's layout and hold the keys within e4m3's
error, and the float64 reference scores them as ``sum_h relu(q_h . k_j) w_h``. On an sm_90 GPU with deep_gemm (marked
``gpu``): DeepGEMM's logits agree with the reference, its top-k picks the reference's rows, it captures in a CUDA
graph, and the decode step runs with it; with the sglang package, apache-tvm-ffi and nvcc there, the same for SGLang's
own JIT top-k (indexer_topk=sglang)."""

import importlib.util

import pytest
import torch

from tuner.targets.workload.sglang_indexer import (
    COMPRESSED_PAGE_ROWS,
    ROW_BYTES,
    dequantize_index_pages,
    page_table_width,
    paged_index_state,
    quantize_index_pages,
    quantize_query,
    reference_logits,
)

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_deep_gemm = pytest.mark.skipif(
    not (HOPPER and importlib.util.find_spec("deep_gemm")),
    reason="needs an sm_90 GPU and deep_gemm (benchmarks/deepgemm_build.sh)",
)


def test_the_page_table_of_a_cap_is_a_page_per_256_tokens():
    assert page_table_width(1048576) == 4096 and page_table_width(8192) == 32 and page_table_width(8193) == 33
    assert page_table_width(1048576) * COMPRESSED_PAGE_ROWS == 1048576 // 4  # SGLang's max_compressed_seq_len


def test_the_index_cache_has_sglangs_layout_and_holds_the_keys():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(3 * 64, 128, generator=g)
    cache = quantize_index_pages(keys)
    assert cache.dtype == torch.uint8 and tuple(cache.shape) == (3, 64, 1, ROW_BYTES) and ROW_BYTES == 132
    raw = cache.reshape(3, -1)
    scales = raw[:, 64 * 128 :].contiguous().view(torch.float32)  # each page: 64 x 128 e4m3, then 64 float32 scales
    assert torch.allclose(scales.reshape(-1), keys.abs().amax(-1).clamp(min=1e-4) / 448.0)
    back = dequantize_index_pages(cache)
    err = ((back - keys).norm() / keys.norm()).item()
    assert 0 < err < 0.04  # e4m3 with one scale per row


def test_the_paged_state_maps_each_request_to_its_own_pages_and_live_length():
    g = torch.Generator().manual_seed(1)
    batch, live = 3, 100  # two pages a request, the second partly live
    keys = torch.randn(1 + batch * live, 128, generator=g)
    st = paged_index_state(keys, batch, live, width_pages=5)
    table = st["idx_table"]
    assert table.dtype == torch.int32 and tuple(table.shape) == (3, 5)
    assert table[:, 2:].eq(0).all() and table[:, :2].tolist() == [[1, 2], [3, 4], [5, 6]]
    assert st["idx_lens"].tolist() == [[100]] * 3 and st["idx_base"].tolist() == [1, 101, 201]
    rows = dequantize_index_pages(st["idx_cache"]).reshape(-1, 64, 128)
    for b in range(batch):  # request b's j-th live row holds pool row 1 + b * live + j
        got = rows[table[b, :2].long()].reshape(-1, 128)[:live]
        ref = keys[1 + b * live : 1 + (b + 1) * live]
        assert ((got - ref).norm() / ref.norm()).item() < 0.04
    with pytest.raises(ValueError, match="cannot hold 100 live compressed rows"):
        paged_index_state(keys, batch, live, width_pages=1)


def test_the_reference_scores_relu_of_the_quantised_products_weighted_by_head():
    g = torch.Generator().manual_seed(2)
    batch, live, heads = 2, 70, 64
    keys = torch.randn(1 + batch * live, 128, generator=g)
    st = paged_index_state(keys, batch, live, width_pages=4)
    qi, w = torch.randn(batch, heads, 128, generator=g), torch.randn(batch, heads, generator=g)
    ref = reference_logits(qi, w, st["idx_cache"], st["idx_table"], live)
    k = dequantize_index_pages(st["idx_cache"]).double()[64:].reshape(batch, 128, 128)[:, :live]  # pages 1-2, 3-4
    q, ws = quantize_query(qi, w)
    direct = (torch.relu(torch.einsum("bhd,bjd->bhj", q.double(), k)) * ws.double()[..., None]).sum(1)
    assert torch.allclose(ref, direct)
    exact = (
        torch.relu(torch.einsum("bhd,bjd->bhj", qi.double(), keys[1:].double().reshape(batch, live, 128)))
        * w.double()[..., None]
    ).sum(1)
    assert ((ref - exact).norm() / exact.norm()).item() < 0.1  # fp8 q and keys against the unquantised scores


def _sglang_jit() -> bool:
    from search_spaces.hardware import _sglang_jit_buildable

    return HOPPER and _sglang_jit_buildable()


TOPKS = [
    "torch",
    pytest.param(
        "sglang",
        marks=pytest.mark.skipif(
            not _sglang_jit(), reason="SGLang's JIT top-k needs the sglang package, apache-tvm-ffi and nvcc"
        ),
    ),
]


@pytest.mark.gpu
@needs_deep_gemm
@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("batch,cap,live", [(1, 8192, 128), (16, 262144, 1000), (64, 1048576, 700)])
def test_deepgemm_logits_and_picks_agree_with_the_reference_and_capture_in_a_graph(batch, cap, live, topk):
    from tuner.targets.workload.sglang_indexer import SGLangIndexer

    g = torch.Generator(device="cuda").manual_seed(batch)
    keys = torch.randn(1 + batch * live, 128, device="cuda", generator=g)
    st = paged_index_state(keys, batch, live, page_table_width(cap))
    ix = SGLangIndexer(512, topk)
    st["idx_live"] = live
    ix.prepare(st)
    qi = torch.randn(batch, 64, 128, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(batch, 64, device="cuda", generator=g)
    got = ix.logits(qi, w, st)
    assert tuple(got.shape) == (batch, page_table_width(cap) * 64)
    ref = reference_logits(qi, w, st["idx_cache"], st["idx_table"], live)
    assert ((got[:, :live].double() - ref).norm() / ref.norm()).item() < 1e-3
    rows = ix(qi, w, st)
    k = min(512, live)
    assert tuple(rows.shape) == (batch, 512) and rows[:, k:].eq(-1).all()
    # the picks are the k best of DeepGEMM's own logits (SGLang's kernel writes them unordered), as pool rows
    want = st["idx_base"][:, None] + got[:, :live].topk(k, dim=-1).indices
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(rows[:, :k], want))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ix(qi, w, st)
    graph.replay()
    torch.cuda.synchronize()
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(out, rows))


@pytest.mark.gpu
@needs_deep_gemm
def test_the_decode_step_runs_with_sglangs_indexer_within_the_fp8_tolerance_of_the_torch_one():
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import PRESETS

    knobs = {"gemm_proj": "bf16", "gemm_indexer": "fp8", "context_length": 32768}
    outs = {}
    for impl in ("torch", "deepgemm"):
        model = DecodeModel(PRESETS["dsv4-flash"], {**knobs, "indexer_impl": impl}, "cuda")
        st = model.state(4, 512)
        outs[impl] = model.step(st).float()
    err = ((outs["deepgemm"] - outs["torch"]).norm() / outs["torch"].norm()).item()
    assert err < 0.30  # the numerics gate's fp8 family tolerance


def test_block_and_group_scales_hold_the_values_within_e4m3s_error():
    from tuner.targets.workload.ops import deepgemm_servable
    from tuner.targets.workload.sglang_gemm import block_quantize, group_quantize

    g = torch.Generator().manual_seed(3)
    w = torch.randn(192, 256, generator=g)  # 192 rows: the last block of rows half full
    q, s = block_quantize(w)
    assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (192, 256) and tuple(s.shape) == (2, 2)
    back = (q.float().view(192, 2, 128) * s.repeat_interleave(128, 0)[:192, :, None]).view(192, 256)
    assert 0 < ((back - w).norm() / w.norm()).item() < 0.04
    assert torch.allclose(s[0, 1], w[:128, 128:].abs().max() / 448.0)
    x = torch.randn(5, 256, generator=g)
    xq, xs = group_quantize(x)
    assert tuple(xs.shape) == (5, 2)
    xb = (xq.float().view(5, 2, 128) * xs[..., None]).view(5, 256)
    assert 0 < ((xb - x).norm() / x.norm()).item() < 0.04
    assert deepgemm_servable(4096, 8192) and deepgemm_servable(64, 4096) and not deepgemm_servable(100, 4096)


needs_sglang = pytest.mark.skipif(
    not (HOPPER and importlib.util.find_spec("sglang")),
    reason="needs an sm_90 GPU and the sglang package (benchmarks/sglang_jit_gpu.sh)",
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "impl", [pytest.param("deepgemm", marks=needs_deep_gemm), pytest.param("sglang_triton", marks=needs_sglang)]
)
@pytest.mark.parametrize("m,n,k", [(1, 32768, 1024), (16, 4096, 8192), (64, 64, 4096)])
def test_each_block_fp8_linear_agrees_with_float64_and_captures_in_a_graph(impl, m, n, k):
    """DeepGEMM's (SGLang's default on sm_90) and SGLang's Triton block-FP8 GEMM (--fp8-gemm-backend triton)."""
    from tuner.targets.workload.ops import Linear

    g = torch.Generator(device="cuda").manual_seed(m + n)
    w = torch.randn(n, k, device="cuda", generator=g) / k**0.5
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    lin = Linear.make(w, "fp8", impl)
    assert lin.impl == impl and tuple(lin.scale.shape) == (-(-n // 128), k // 128)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    y.copy_(lin(x))
    ref = x.double() @ w.double().t()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 0.08  # two e4m3 operands
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lin(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, lin(x))
