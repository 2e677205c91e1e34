"""SGLang's decode q path, ``fused_q_norm_rope``, as a Triton kernel on SGLang's own argument layout.

What SGLang 0.5.23 computes (``sglang/kernels/ops/attention/dsv4/norm_rope.py: fused_q_norm_rope`` and the CUDA
kernel it compiles, ``sglang/jit_kernel/.../deepseek_v4/main_norm_rope.cuh: fused_q_norm_rope``, warp per
(token, head)):

* ``q_input [B, H, D]`` bf16 (fp16/fp32 here too), the heads contiguous (``stride(1) == D``, ``stride(2) == 1``),
  any batch stride; ``q_output`` of the same shape, written (not in place of ``q_input``, though the kernel is
  correct when both are the same tensor); returns None. SGLang's wrapper also takes an fp8 e4m3 ``q_output``
  (it computes bf16 and copies): :func:`fused_q_norm_rope` here does the same.
* ``eps``: a float applies the RMSNorm of each head **without weight**, in fp32: ``x * rsqrt(mean(x^2) + eps)``,
  **rounded to the input dtype** before the rope; ``None`` skips the norm (copy + rope).
* ``freqs_cis [max_pos, R/2]`` complex64 (the model's table; SGLang flattens it to ``[max_pos, R]`` float32,
  real and imaginary interleaved); ``positions [B]`` int32 or int64.
* The rope touches the **last** ``R`` dims of each head (V4: ``D = 512``, ``R = 64``, 448 nope dims before),
  as **interleaved** pairs ``(x[2i], x[2i+1])`` = (real, imag): ``(x0*c - x1*s, x0*s + x1*c)`` with
  ``c, s = freqs[pos, 2i], freqs[pos, 2i+1]``, in fp32, stored in the output dtype. SGLang's kernel requires
  ``R == 64`` (one pair per lane); this one takes any even ``R`` with ``R/2`` a power of two.

This file imports only torch and triton: the SGLang plug-in that ``tuner export`` writes ships a copy of it.
Config: ``{BLOCK_H, num_warps}`` (heads per program); :data:`DEFAULT_CONFIG` is always correct.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["DEFAULT_CONFIG", "q_norm_rope", "fused_q_norm_rope", "q_norm_rope_reference", "freqs_real_of"]

DEFAULT_CONFIG = {"BLOCK_H": 1, "num_warps": 2}
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _q_norm_rope_kernel(
    x_ptr,
    y_ptr,
    freqs_ptr,
    pos_ptr,
    H,
    eps,
    stride_xb,
    stride_xh,
    stride_yb,
    stride_yh,
    stride_f,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    APPLY_NORM: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h[:, None] < H
    x_base = x_ptr + b * stride_xb + offs_h[:, None] * stride_xh
    y_base = y_ptr + b * stride_yb + offs_h[:, None] * stride_yh
    nope: tl.constexpr = D - 2 * HALF
    # the whole head: its sum of squares (fp32), then the nope dims normed, rounded and stored
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    x = tl.load(x_base + offs_d, mask=h_mask & (offs_d < D), other=0.0).to(tl.float32)
    if APPLY_NORM:
        r = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
    else:
        r = tl.full([BLOCK_H, 1], 1.0, tl.float32)
    tl.store(y_base + offs_d, (x * r).to(y_ptr.dtype.element_ty), mask=h_mask & (offs_d < nope))
    # the rope dims as (real, imag) pairs: normed and rounded to the input dtype as SGLang's kernel does
    pos = tl.load(pos_ptr + b).to(tl.int64)
    offs_p = tl.arange(0, HALF)[None, :]
    c = tl.load(freqs_ptr + pos * stride_f + 2 * offs_p)
    s = tl.load(freqs_ptr + pos * stride_f + 2 * offs_p + 1)
    even = nope + 2 * offs_p
    x0 = (tl.load(x_base + even, mask=h_mask).to(tl.float32) * r).to(x_ptr.dtype.element_ty).to(tl.float32)
    x1 = (tl.load(x_base + even + 1, mask=h_mask).to(tl.float32) * r).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_base + even, (x0 * c - x1 * s).to(y_ptr.dtype.element_ty), mask=h_mask)
    tl.store(y_base + even + 1, (x0 * s + x1 * c).to(y_ptr.dtype.element_ty), mask=h_mask)


def freqs_real_of(freqs_cis: torch.Tensor) -> torch.Tensor:
    """SGLang's ``[max_pos, R/2]`` complex table as the ``[max_pos, R]`` float32 (re, im interleaved) view."""
    return torch.view_as_real(freqs_cis).flatten(-2)


def q_norm_rope(
    q_input: torch.Tensor,
    q_output: torch.Tensor,
    eps: float | None,
    freqs_real: torch.Tensor,
    positions: torch.Tensor,
    config: dict | None = None,
) -> None:
    """The launcher: checks the layout, then writes ``q_output`` (see the module docstring)."""
    if q_input.dim() != 3:
        raise ValueError(f"q_input must be [batch, heads, head_dim], got shape {tuple(q_input.shape)}")
    B, H, D = q_input.shape
    if q_input.dtype not in _FLOAT or q_input.stride(2) != 1:
        raise ValueError(
            f"q_input must be float16/bfloat16/float32 with contiguous head dims, got {q_input.dtype}, "
            f"strides {q_input.stride()}"
        )
    if tuple(q_output.shape) != (B, H, D) or q_output.dtype != q_input.dtype or q_output.stride(2) != 1:
        raise ValueError(
            f"q_output must be [{B}, {H}, {D}] of {q_input.dtype}, got {tuple(q_output.shape)} {q_output.dtype}"
        )
    R = freqs_real.shape[-1] if freqs_real.dim() == 2 else -1
    if (
        freqs_real.dtype != torch.float32
        or R < 2
        or R % 2
        or (R // 2) & (R // 2 - 1)
        or R > D
        or freqs_real.stride(1) != 1
    ):
        raise ValueError(
            f"freqs must be [max_pos, R] float32 with R even, R/2 a power of two and R <= {D}, got "
            f"{tuple(freqs_real.shape)} {freqs_real.dtype}"
        )
    if positions.dim() != 1 or positions.shape[0] != B or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be [{B}] int32/int64, got {tuple(positions.shape)} {positions.dtype}")
    cfg = DEFAULT_CONFIG if config is None else config
    if B == 0 or H == 0:
        return
    _q_norm_rope_kernel[(B, triton.cdiv(H, cfg["BLOCK_H"]))](
        q_input,
        q_output,
        freqs_real,
        positions,
        H,
        0.0 if eps is None else float(eps),
        q_input.stride(0),
        q_input.stride(1),
        q_output.stride(0),
        q_output.stride(1),
        freqs_real.stride(0),
        D=D,
        BLOCK_D=triton.next_power_of_2(D),
        HALF=R // 2,
        BLOCK_H=cfg["BLOCK_H"],
        APPLY_NORM=eps is not None,
        num_warps=cfg["num_warps"],
    )


def fused_q_norm_rope(
    q_input: torch.Tensor,
    q_output: torch.Tensor,
    eps: float | None,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    config: dict | None = None,
) -> None:
    """SGLang's signature: ``freqs_cis`` complex; an fp8 ``q_output`` gets the result computed in ``q_input``'s
    dtype, then copied (SGLang's wrapper rounds the same way)."""
    freqs_real = freqs_real_of(freqs_cis)
    if q_output.dtype == torch.float8_e4m3fn:
        tmp = torch.empty_like(q_input)
        q_norm_rope(q_input, tmp, eps, freqs_real, positions, config)
        q_output.copy_(tmp)
        return
    q_norm_rope(q_input, q_output, eps, freqs_real, positions, config)


def q_norm_rope_reference(
    q_input: torch.Tensor,
    eps: float | None,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    *,
    round_normed: bool = True,
) -> torch.Tensor:
    """SGLang's semantics in float64 (float32 on a GPU): returns the output. ``round_normed`` rounds the normed
    values to the input dtype before the rope, as SGLang's kernel does."""
    dt = torch.float64 if q_input.device.type == "cpu" else torch.float32
    x = q_input.to(dt)
    if eps is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if round_normed:
            x = x.to(q_input.dtype).to(dt)
    fr = freqs_real_of(freqs_cis)[positions.long()].to(dt)  # [B, R]
    R = fr.shape[-1]
    c, s = fr[:, None, 0::2], fr[:, None, 1::2]
    y = x.clone()
    x0, x1 = x[..., _rope_dims(x, R, 0)], x[..., _rope_dims(x, R, 1)]
    y[..., _rope_dims(x, R, 0)] = x0 * c - x1 * s
    y[..., _rope_dims(x, R, 1)] = x0 * s + x1 * c
    return y


def _rope_dims(x: torch.Tensor, rope_dim: int, parity: int) -> slice:
    """The even (``parity`` 0) or odd dims of the last ``rope_dim`` of ``x``'s head."""
    return slice(x.shape[-1] - rope_dim + parity, None, 2)
