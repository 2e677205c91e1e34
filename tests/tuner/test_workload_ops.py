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
