"""The twin's eager ops against SGLang's semantics, in float64 on the CPU."""

from __future__ import annotations

import pytest
import torch

from kernels.sglang_q_norm_rope import q_norm_rope_reference
from tuner.errors import KnobError
from tuner.targets.workload.model import DecodeModel
from tuner.targets.workload.ops import NORM_EPS, norm_rope
from tuner.targets.workload.presets import PRESETS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_eager_q_and_kv_preparation_is_sglangs_fused_q_norm_rope_in_float64(dtype):
    """SGLang 0.5.23's ``fused_q_norm_rope``: each head RMS-normed without weight, rounded to the input dtype, then
    interleaved RoPE on the last 64 dims at the token's position (the reference: kernels/sglang_q_norm_rope.py)."""
    g = torch.Generator().manual_seed(3)
    B, H, D, R, L = 4, 3, 512, 64, 700
    q = (torch.randn(B, H, D, generator=g) * 5).to(dtype)
    half = R // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang_all = torch.arange(L + 1, dtype=torch.float32)[:, None] * inv[None, :]
    freqs = torch.polar(torch.ones_like(ang_all), ang_all)
    ang = torch.full((B, 1), float(L)) * inv[None, :]
    out = norm_rope(q, torch.cos(ang), torch.sin(ang), R)
    ref = q_norm_rope_reference(q, NORM_EPS, freqs, torch.full((B,), L, dtype=torch.int32))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-6 if dtype == torch.float32 else 8e-3), err


def test_sglang_glue_is_refused_on_a_cpu_and_without_flashmla_with_the_knob_and_the_fix():
    with pytest.raises(KnobError, match="glue=sglang.*needs a GPU"):
        DecodeModel(
            PRESETS["dsv4-flash-tiny"],
            {"glue": "sglang", "attention_impl": "flashmla_kv", "kv_cache_dtype": "fp8_e4m3"},
            "cpu",
        )
    with pytest.raises(KnobError, match="attention_impl=flashmla_kv"):
        DecodeModel(PRESETS["dsv4-flash-tiny"], {"glue": "sglang", "attention_impl": "torch"}, "cpu")
    with pytest.raises(KnobError, match="gemm_impl=sglang_triton.*needs a GPU"):
        DecodeModel(PRESETS["dsv4-flash-tiny"], {"gemm_impl": "sglang_triton"}, "cpu")


@pytest.mark.parametrize("dtype_name", ["bf16", "fp32", "fp8"])
def test_the_grouped_wo_a_off_deepgemm_is_the_bmm_the_twin_always_ran(dtype_name):
    from tuner.targets.workload.ops import GroupedLinear

    g = torch.Generator().manual_seed(4)
    w = torch.randn(4, 256, 128, generator=g)  # [G, D, R]
    o = torch.randn(3, 4, 256, generator=g)  # [B, G, D]
    lin = GroupedLinear.make(w, dtype_name, "deepgemm" if dtype_name == "fp8" else "torch")  # no GPU: no einsum
    dt = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    assert lin.impl == "torch" and lin.weight.dtype == dt and lin.scale is None
    before = torch.bmm(o.transpose(0, 1).to(dt), w.to(dt)).transpose(0, 1)  # model.py's two lines until this change
    assert torch.equal(lin(o), before)


def test_the_grouped_wo_a_for_deepgemm_holds_each_groups_weight_transposed_in_128_blocks(monkeypatch):
    from tuner.targets.workload import sglang_gemm
    from tuner.targets.workload.ops import GroupedLinear
    from tuner.targets.workload.sglang_gemm import dequantize_blocks

    monkeypatch.setattr(sglang_gemm, "wo_a_einsum_runs", lambda: True)  # as on an H200 with DeepGEMM
    g = torch.Generator().manual_seed(5)
    w = torch.randn(2, 256, 384, generator=g)  # [G, D, R]
    lin = GroupedLinear.make(w, "fp8", "sglang_triton")  # SGLang runs wo_a on DeepGEMM under both Hopper backends
    assert lin.impl == "deepgemm" and lin.weight.dtype == torch.float8_e4m3fn
    assert tuple(lin.weight.shape) == (2, 384, 256) and tuple(lin.scale.shape) == (
        2,
        3,
        2,
    )  # [G, R, D], [G, R/128, D/128]
    back = dequantize_blocks(lin.weight, lin.scale)
    err = float((back - w.transpose(1, 2)).norm() / w.norm())
    assert err < 0.05  # e4m3 with a scale per 128 x 128 block
    assert GroupedLinear.make(w[:, :200], "fp8", "deepgemm").impl == "torch"  # D not a multiple of 128: the bmm
