"""The Triton replacement of SGLang's ``fused_q_norm_rope`` against a float64 torch reference of SGLang's semantics
(norm without weight, rounded to the input dtype, interleaved rope on the last R dims); fresh random inputs,
poisoned outputs, relative norm error. On CPU the kernel runs in Triton's interpreter (fp16/fp32)."""

import os

import pytest
import torch

from kernels.sglang_q_norm_rope import fused_q_norm_rope, q_norm_rope_reference

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
TOL = {torch.float16: 2e-3, torch.float32: 1e-5}


def _freqs(max_pos, rope_dim, gen):
    ang = torch.rand(max_pos, rope_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64).to(DEV)


def _inputs(B, H, D, R, dtype, seed, batch_stride=None):
    gen = torch.Generator().manual_seed(seed)
    bs = batch_stride or H * D
    buf = (torch.randn(B * bs, generator=gen) * 3).to(dtype).to(DEV)
    q = buf.as_strided((B, H, D), (bs, D, 1))
    pos = torch.randint(0, 300, (B,), generator=gen).to(DEV)
    return q, _freqs(300, R, gen), pos


def _rel(out, ref):
    return ((out.to(ref.dtype) - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("B,H,D,R", [(1, 4, 512, 64), (3, 5, 96, 32), (2, 3, 64, 64)], ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK_H": 4, "num_warps": 4}], ids=str)
@pytest.mark.parametrize("eps", [1e-6, None], ids=["norm", "no_norm"])
def test_matches_sglang_semantics_in_float64(dtype, B, H, D, R, cfg, eps):
    q, freqs, pos = _inputs(B, H, D, R, dtype, seed=B * 100 + H)
    out = torch.full_like(q, float("nan"))
    fused_q_norm_rope(q, out, eps, freqs, pos, cfg)
    ref = q_norm_rope_reference(q, eps, freqs, pos)
    assert not out.isnan().any()
    assert _rel(out, ref) <= TOL[dtype]


def test_the_rope_is_interleaved_on_the_last_dims_and_the_rest_only_normed():
    q, freqs, pos = _inputs(2, 3, 96, 32, torch.float32, seed=7)
    out = torch.full_like(q, float("nan"))
    fused_q_norm_rope(q, out, 1e-6, freqs, pos)
    normed = q.double() * torch.rsqrt(q.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(out[..., :64].double(), normed[..., :64], rtol=1e-5, atol=1e-6)
    fr = torch.view_as_real(freqs)[pos.long()].double()  # [B, 16, 2]
    x0, x1 = normed[..., 64::2], normed[..., 65::2]
    c, s = fr[:, None, :, 0], fr[:, None, :, 1]
    assert torch.allclose(out[..., 64::2].double(), x0 * c - x1 * s, rtol=1e-5, atol=1e-5)
    assert torch.allclose(out[..., 65::2].double(), x0 * s + x1 * c, rtol=1e-5, atol=1e-5)


def test_a_padded_batch_stride_and_int32_positions_are_read_as_sglang_passes_them():
    q, freqs, pos = _inputs(3, 4, 128, 64, torch.float16, seed=3, batch_stride=4 * 128 + 64)
    out = torch.full((3, 4, 128), float("nan"), dtype=torch.float16, device=DEV)
    fused_q_norm_rope(q, out, 1e-6, freqs, pos.int())
    assert _rel(out, q_norm_rope_reference(q, 1e-6, freqs, pos)) <= TOL[torch.float16]


def test_in_place_gives_the_same_result():
    q, freqs, pos = _inputs(2, 4, 128, 64, torch.float32, seed=5)
    ref = q_norm_rope_reference(q, 1e-6, freqs, pos)
    fused_q_norm_rope(q, q, 1e-6, freqs, pos)
    assert _rel(q, ref) <= TOL[torch.float32]


def test_a_wrong_layout_is_refused_naming_the_argument():
    q, freqs, pos = _inputs(2, 4, 128, 64, torch.float32, seed=5)
    with pytest.raises(ValueError, match="positions must be"):
        fused_q_norm_rope(q, torch.empty_like(q), 1e-6, freqs, pos[:1])
    with pytest.raises(ValueError, match="q_output must be"):
        fused_q_norm_rope(q, torch.empty_like(q).half(), 1e-6, freqs, pos)
