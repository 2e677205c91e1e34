"""SGLang 0.5.23's own glue and block-FP8 GEMM in the decode twin (``glue=sglang``, ``gemm_impl=sglang_triton``),
on an sm_90 GPU with the sglang package importable (marked ``gpu``; ``benchmarks/sglang_jit_gpu.sh`` installs it on
the lent H200): each against float64 or the twin's own path on the same inputs, and replayed in a CUDA graph."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tuner.targets.workload.ops import rope_tables

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sglang = pytest.mark.skipif(
    not (HOPPER and importlib.util.find_spec("sglang")),
    reason="needs an sm_90 GPU and the sglang package (benchmarks/sglang_jit_gpu.sh)",
)
needs_flashmla = pytest.mark.skipif(
    not importlib.util.find_spec("flash_mla"), reason="the step's attention is FlashMLA: needs sgl-flash-mla"
)
pytestmark = [pytest.mark.gpu, needs_sglang]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("m", [1, 16, 64])
def test_sglangs_activation_quantisation_runs_with_power_of_two_scales_and_feeds_the_deepgemm_linear(m):
    from tuner.targets.workload.ops import Linear
    from tuner.targets.workload.sglang_gemm import sglang_activation_quant

    quant = sglang_activation_quant()
    assert quant is not None  # SGLang's JIT builds on this machine (the fixture's premise)
    x = (torch.randn(m, 4096, device="cuda") * 3).to(torch.bfloat16)
    q, s = quant(x)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == (m, 32) and s.dtype == torch.float32
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # ue8m0: powers of two
    back = (q.float().view(m, 32, 128) * s[..., None]).view(m, 4096)
    assert _rel(back, x.float()) < 0.05
    if importlib.util.find_spec("deep_gemm"):
        w = torch.randn(1024, 4096, device="cuda") / 64
        y = Linear.make(w, "fp8", "deepgemm")(x)
        assert _rel(y, x.double() @ w.double().t()) < 0.08


@pytest.mark.skipif(not importlib.util.find_spec("deep_gemm"), reason="wo_a's fp8 einsum is DeepGEMM's")
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_v4s_grouped_wo_a_runs_deepgemms_fp8_einsum_as_sglang_does_and_captures_in_a_graph(batch):
    """V4-Flash's wo_a (8 groups, 4096 -> 1024 each): SGLang's quantisation with float32 scales and DeepGEMM's
    fp8_einsum, against float64 on the e4m3 weight it holds, then replayed in a CUDA graph."""
    from tuner.targets.workload.ops import GroupedLinear
    from tuner.targets.workload.sglang_gemm import dequantize_blocks, wo_a_einsum_runs

    assert wo_a_einsum_runs()
    w = torch.randn(8, 4096, 1024, device="cuda") / 64  # [G, D, R], as the twin draws it
    lin = GroupedLinear.make(w, "fp8", "deepgemm")
    assert (
        lin.impl == "deepgemm"
        and lin.weight.dtype == torch.float8_e4m3fn
        and tuple(lin.weight.shape) == (8, 1024, 4096)
    )
    assert tuple(lin.scale.shape) == (8, 8, 32)
    o = (torch.randn(batch, 8, 4096, device="cuda") * 2).to(torch.bfloat16)
    want = torch.einsum("bgd,grd->bgr", o.double(), dequantize_blocks(lin.weight, lin.scale).double())
    got = lin(o)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (batch, 8, 1024)
    assert _rel(got, want) < 0.05
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lin(o)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_sglangs_q_norm_rope_is_the_twins_q_preparation_and_captures_in_a_graph(batch):
    from tuner.targets.workload.gpu_ops import fused_norm_rope, sglang_q_norm_rope
    from tuner.targets.workload.ops import norm_rope

    st = rope_tables(batch, 700, 64, "cuda")
    q = (torch.randn(batch, 64, 512, device="cuda") * 4).to(torch.bfloat16)
    ref = norm_rope(q.double().float(), st["cos"], st["sin"], 64)  # float32 math on the bf16 values
    ours, sglang = fused_norm_rope(1e-6)(q, st), sglang_q_norm_rope(1e-6)(q, st)
    assert _rel(sglang, ref) < 8e-3 and _rel(ours, ref) < 8e-3
    fn = sglang_q_norm_rope(1e-6)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, st)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sglang)


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_sglangs_k_norm_rope_store_writes_what_the_twin_writes_at_each_slot_and_nothing_else(batch):
    from tuner.targets.workload.gpu_ops import dequantize_v4, quantize_v4, sglang_k_norm_rope_store, store_v4
    from tuner.targets.workload.ops import norm_rope

    n = 4 * 64
    st = rope_tables(batch, 700, 64, "cuda")
    pool = torch.randn(n, 512, device="cuda")
    ours, sglang = quantize_v4(pool), quantize_v4(pool)
    before = dequantize_v4(sglang, n)
    kv = (torch.randn(batch, 512, device="cuda") * 3).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(512, device="cuda")).to(torch.bfloat16)
    slots = torch.randperm(n, device="cuda")[:batch]
    store_v4(ours, norm_rope(kv, st["cos"], st["sin"], 64, weight), slots)
    sglang_k_norm_rope_store(kv, weight, 1e-6, st, sglang, slots)
    a, b = dequantize_v4(ours, n), dequantize_v4(sglang, n)
    assert _rel(b[slots], a[slots]) < 0.05  # e4m3 under power-of-two scales, from fp32 or bf16-rounded values
    keep = torch.ones(n, dtype=torch.bool, device="cuda")
    keep[slots] = False
    assert torch.equal(b[keep], before[keep])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sglang_k_norm_rope_store(kv, weight, 1e-6, st, sglang, slots)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dequantize_v4(sglang, n), b)


@needs_flashmla
def test_the_decode_step_with_sglangs_glue_and_gemm_is_within_the_fp8_tolerance_of_the_twins_own():
    """The H200 baseline (SGLang's glue, DeepGEMM), the twin's Triton glue and SGLang's Triton GEMM on the same
    weights and inputs: one function, within the numerics gate's fp8 tolerance of each other."""
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import PRESETS

    base = {
        "attention_impl": "flashmla_kv",
        "kv_cache_dtype": "fp8_e4m3",
        "gemm_proj": "fp8",
        "gemm_indexer": "fp8",
        "context_length": 32768,
        "glue": "sglang",
        "gemm_impl": "deepgemm" if importlib.util.find_spec("deep_gemm") else "torch",
    }
    outs = {}
    for name, knobs in (
        ("base", base),
        ("fused", {**base, "glue": "fused"}),
        ("eager", {**base, "glue": "eager"}),
        ("sglang_triton", {**base, "gemm_impl": "sglang_triton"}),
    ):
        model = DecodeModel(PRESETS["dsv4-flash"], knobs, "cuda")
        with torch.inference_mode():
            outs[name] = model.step(model.state(4, 512)).float()
        del model
    for name in ("fused", "eager", "sglang_triton"):
        assert _rel(outs[name], outs["base"]) < 0.30, name
    assert torch.isfinite(outs["base"]).all()
