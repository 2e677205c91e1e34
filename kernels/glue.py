"""Glue around the attention and GEMM kernels, each one pass over memory.

* ``fused_add_rmsnorm(x, residual, weight, eps)``: ``s = x + residual`` (float32 math);
  returns ``(rmsnorm(s) * weight`` in ``out_dtype``, ``s`` in ``residual.dtype``) — the new residual.
  With ``BLOCK >= hidden`` a row lives in registers (one read, two writes); a smaller BLOCK loops
  twice over the row (the second read of the new residual hits L2).
* ``store_kv_rows(rows, pool, pool_scale, slots)``: each new KV row quantised to the cache's e4m3 with its float32
  scale (``max|row| / 448``, the layout ``kernels.sparse_decode.quantize_kv_fp8`` makes) and written at its slot of
  the cache and of its scales, in one launch (the same in torch ops is nine: cast, abs, row max, two divisions,
  clamp, cast to e4m3, and a copy each into the cache and the scales).
* ``rope(x, positions, cos_sin, rope_dim=64)``: rotary embedding on the LAST ``rope_dim`` dims of
  each head (DeepSeek's 448 nope + 64 rope layout), **interleaved** pairs ``(x[2i], x[2i+1])`` as in
  DeepSeek's reference ``apply_rotary_emb`` (complex multiply of consecutive pairs); other dims are
  copied. ``cos_sin : [max_pos, rope_dim]`` float32, cos in the first half, sin in the second
  (SGLang's cos_sin_cache layout). Output is a new tensor in ``out_dtype`` (default x.dtype): the
  dtype cast happens in the same pass.

Tunables: rmsnorm BLOCK, num_warps; rope BLOCK_H, num_warps.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .base import Cost, TunableKernel, cdiv, dtype_of
from .configs import tuned_config

__all__ = [
    "fused_add_rmsnorm",
    "store_kv_rows",
    "rope",
    "rmsnorm_reference",
    "rope_reference",
    "rope_cos_sin",
    "RMSNormKernel",
    "RopeKernel",
]

logger = logging.getLogger(__name__)

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------------------------------
# fused residual add + RMSNorm
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    rout_ptr,
    N,
    eps,
    stride_x,
    stride_r,
    stride_y,
    stride_ro,
    BLOCK: tl.constexpr,
    SINGLE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row, r_row = x_ptr + row * stride_x, r_ptr + row * stride_r
    y_row, ro_row = y_ptr + row * stride_y, rout_ptr + row * stride_ro
    if SINGLE:
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        s = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) + tl.load(r_row + offs, mask=mask, other=0.0).to(
            tl.float32
        )
        tl.store(ro_row + offs, s.to(rout_ptr.dtype.element_ty), mask=mask)
        rstd = tl.rsqrt(tl.sum(s * s, 0) / N + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        sq = tl.zeros([BLOCK], tl.float32)
        for n0 in range(0, N, BLOCK):
            offs = n0 + tl.arange(0, BLOCK)
            mask = offs < N
            s = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) + tl.load(
                r_row + offs, mask=mask, other=0.0
            ).to(tl.float32)
            tl.store(ro_row + offs, s.to(rout_ptr.dtype.element_ty), mask=mask)
            sq += s * s
        rstd = tl.rsqrt(tl.sum(sq, 0) / N + eps)
        for n0 in range(0, N, BLOCK):
            offs = n0 + tl.arange(0, BLOCK)
            mask = offs < N
            # re-read what this program wrote (same threads, same offsets: program order holds)
            s = tl.load(ro_row + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + offs, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    config: dict | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rmsnorm(x + residual) * weight, x + residual)`` for ``x, residual : [tokens, hidden]``."""
    if x.dim() != 2 or tuple(residual.shape) != tuple(x.shape):
        raise ValueError(
            f"x and residual must both be [tokens, hidden], got {tuple(x.shape)} and {tuple(residual.shape)}"
        )
    T, N = x.shape
    if weight.dim() != 1 or weight.shape[0] != N:
        raise ValueError(f"weight must be [{N}], got {tuple(weight.shape)}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        if t.dtype not in _FLOAT or t.stride(-1) != 1:
            raise ValueError(
                f"{name} must be float16/bfloat16/float32 and contiguous in its last dim, got {t.dtype}, strides {t.stride()}"
            )
    if out_dtype not in _FLOAT:
        raise ValueError(f"out_dtype={out_dtype} must be one of {_FLOAT}")
    kernel = RMSNormKernel.instance
    shape = {"tokens": T, "hidden": N}
    if config is None:
        config = tuned_config(kernel, shape, x.dtype, x.device)
    else:
        kernel.require_config(config, shape, x.device, x.dtype)
    if out is None:
        out = torch.empty((T, N), device=x.device, dtype=out_dtype)
    elif tuple(out.shape) != (T, N) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{T}, {N}] of {out_dtype}, got {tuple(out.shape)} {out.dtype}")
    if residual_out is None:
        new_residual = torch.empty_like(residual)
    elif tuple(residual_out.shape) != (T, N) or residual_out.dtype != residual.dtype or residual_out.stride(1) != 1:
        raise ValueError(
            f"residual_out must be [{T}, {N}] of {residual.dtype}, got {tuple(residual_out.shape)} {residual_out.dtype}"
        )
    else:
        new_residual = residual_out
    if T == 0:
        return out, new_residual
    _add_rmsnorm_kernel[(T,)](
        x,
        residual,
        weight,
        out,
        new_residual,
        N,
        float(eps),
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        new_residual.stride(0),
        BLOCK=config["BLOCK"],
        SINGLE=config["BLOCK"] >= N,
        num_warps=config["num_warps"],
    )
    return out, new_residual


def rmsnorm_reference(x, residual, weight, eps=1e-6):
    dt = torch.float64 if x.device.type == "cpu" else torch.float32
    s = x.to(dt) + residual.to(dt)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.to(dt)
    return y, s


# ----------------------------------------------------------------------------------------------------
# RoPE on the last rope_dim dims, interleaved pairs
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _rope_kernel(
    x_ptr,
    pos_ptr,
    cs_ptr,
    y_ptr,
    H,
    stride_xt,
    stride_xh,
    stride_yt,
    stride_yh,
    stride_cs,
    NOPE: tl.constexpr,
    BLOCK_NOPE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    x_base = x_ptr + t * stride_xt + offs_h[:, None] * stride_xh
    y_base = y_ptr + t * stride_yt + offs_h[:, None] * stride_yh
    if NOPE > 0:  # pass-through dims, cast in the same pass
        offs_c = tl.arange(0, BLOCK_NOPE)
        cmask = h_mask[:, None] & (offs_c[None, :] < NOPE)
        tl.store(
            y_base + offs_c[None, :],
            tl.load(x_base + offs_c[None, :], mask=cmask).to(y_ptr.dtype.element_ty),
            mask=cmask,
        )
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_p = tl.arange(0, HALF)
    cos = tl.load(cs_ptr + pos * stride_cs + offs_p)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + offs_p)[None, :]
    even = NOPE + 2 * offs_p[None, :]
    x0 = tl.load(x_base + even, mask=h_mask[:, None]).to(tl.float32)
    x1 = tl.load(x_base + even + 1, mask=h_mask[:, None]).to(tl.float32)
    tl.store(y_base + even, (x0 * cos - x1 * sin).to(y_ptr.dtype.element_ty), mask=h_mask[:, None])
    tl.store(y_base + even + 1, (x0 * sin + x1 * cos).to(y_ptr.dtype.element_ty), mask=h_mask[:, None])


def rope_cos_sin(max_pos: int, rope_dim: int = 64, base: float = 10000.0, device=None) -> torch.Tensor:
    """``[max_pos, rope_dim]`` float32 cache: cos of pair i at column i, sin at column rope_dim/2 + i."""
    inv = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(device=device, dtype=torch.float32)


def rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    rope_dim: int = 64,
    config: dict | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Interleaved RoPE on the last ``rope_dim`` dims of ``x : [tokens, heads, head_dim]``."""
    if x.dim() != 3:
        raise ValueError(f"x must be [tokens, heads, head_dim], got shape {tuple(x.shape)}")
    T, H, D = x.shape
    half = rope_dim // 2
    if rope_dim < 2 or rope_dim % 2 or half & (half - 1) or rope_dim > D:
        raise ValueError(f"rope_dim={rope_dim} must be even, rope_dim/2 a power of two, and <= head_dim={D}")
    if positions.dim() != 1 or positions.shape[0] != T or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be [{T}] int32/int64, got {tuple(positions.shape)} {positions.dtype}")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != rope_dim or cos_sin.dtype != torch.float32 or cos_sin.stride(1) != 1:
        raise ValueError(f"cos_sin must be [max_pos, {rope_dim}] float32, got {tuple(cos_sin.shape)} {cos_sin.dtype}")
    if x.dtype not in _FLOAT or x.stride(2) != 1:
        raise ValueError(f"x must be float16/bfloat16/float32, contiguous in head_dim, got {x.dtype}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    kernel = RopeKernel.instance
    shape = {"tokens": T, "heads": H, "head_dim": D, "rope_dim": rope_dim}
    if config is None:
        config = tuned_config(kernel, shape, x.dtype, x.device)
    else:
        kernel.require_config(config, shape, x.device, x.dtype)
    if out is None:
        out = torch.empty((T, H, D), device=x.device, dtype=out_dtype)
    elif tuple(out.shape) != (T, H, D) or out.dtype != out_dtype or out.stride(2) != 1:
        raise ValueError(f"out must be [{T}, {H}, {D}] of {out_dtype}, got {tuple(out.shape)} {out.dtype}")
    if T == 0:
        return out
    nope = D - rope_dim
    _rope_kernel[(T, cdiv(H, config["BLOCK_H"]))](
        x,
        positions,
        cos_sin,
        out,
        H,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        cos_sin.stride(0),
        NOPE=nope,
        BLOCK_NOPE=max(1, triton.next_power_of_2(nope)),
        HALF=half,
        BLOCK_H=config["BLOCK_H"],
        num_warps=config["num_warps"],
    )
    return out


def rope_reference(x, positions, cos_sin, rope_dim=64):
    dt = torch.float64 if x.device.type == "cpu" else torch.float32
    y = x.to(dt).clone()
    half = rope_dim // 2
    cs = cos_sin[positions.long()].to(dt)
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    r = y[..., -rope_dim:]
    x0, x1 = r[..., 0::2].clone(), r[..., 1::2].clone()
    r[..., 0::2] = x0 * cos - x1 * sin
    r[..., 1::2] = x0 * sin + x1 * cos
    return y


# ----------------------------------------------------------------------------------------------------
# new KV rows quantised into an fp8 cache
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _store_kv_rows_kernel(
    x_ptr, slot_ptr, pool_ptr, scale_ptr, D, stride_x, stride_slot, stride_pool, BLOCK_D: tl.constexpr
):
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i * stride_slot).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + i.to(tl.int64) * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), 0) / 448.0, 1e-12)
    tl.store(pool_ptr + slot * stride_pool + offs, (x / scale).to(pool_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + slot, scale)


def store_kv_rows(rows: torch.Tensor, pool: torch.Tensor, pool_scale: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantise ``rows [n, d]`` (16- or 32-bit) and write row ``i`` at ``pool[slots[i]]`` with its scale at
    ``pool_scale[slots[i]]`` (``slots`` may be strided: a column of a per-request table): ``pool [N, d]`` (float8 e4m3; float16 or float32 where Triton's interpreter runs it,
    whose e4m3 rounding is wrong), ``pool_scale [N]`` float32, ``slots [n]`` integer. Row r of the cache then holds
    ``pool[r] * pool_scale[r]``, as :func:`kernels.sparse_decode.quantize_kv_fp8` lays it out."""
    n, d = rows.shape
    problems = []
    if pool.dim() != 2 or pool.shape[1] != d or pool.stride(1) != 1:
        problems.append(f"pool {tuple(pool.shape)} (contiguous rows of {d})")
    if pool_scale.dtype != torch.float32 or tuple(pool_scale.shape) != (pool.shape[0],):
        problems.append(f"pool_scale {tuple(pool_scale.shape)} {pool_scale.dtype} (float32 [{pool.shape[0]}])")
    if tuple(slots.shape) != (n,):
        problems.append(f"slots {tuple(slots.shape)} ([{n}])")
    if rows.dtype not in _FLOAT or rows.stride(1) != 1:
        problems.append(f"rows {rows.dtype} (contiguous float16, bfloat16 or float32)")
    if problems:
        raise ValueError("store_kv_rows: " + "; ".join(problems))
    if n == 0:
        return
    _store_kv_rows_kernel[(n,)](
        rows,
        slots,
        pool,
        pool_scale,
        d,
        rows.stride(0),
        slots.stride(0),
        pool.stride(0),
        BLOCK_D=triton.next_power_of_2(d),
        num_warps=4,
    )


# ----------------------------------------------------------------------------------------------------
# Tunable-kernel descriptions
# ----------------------------------------------------------------------------------------------------
class RMSNormKernel(TunableKernel):
    name = "rmsnorm"
    batch_dim = "tokens"
    instance: "RMSNormKernel"

    def default_config(self, shape):
        block = min(triton.next_power_of_2(shape["hidden"]), 8192)
        return {"BLOCK": block, "num_warps": max(1, min(8, block // 512))}

    def config_space(self, shape):
        return {"BLOCK": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16]}

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        if config["BLOCK"] & (config["BLOCK"] - 1):
            return f"block: BLOCK={config['BLOCK']} must be a power of two"
        if config["BLOCK"] < 32 * config["num_warps"]:
            return f"block_per_thread: BLOCK={config['BLOCK']} < 32*num_warps={32 * config['num_warps']} (idle threads)"
        if config["BLOCK"] // (32 * config["num_warps"]) > 64:
            return (
                f"register_pressure: BLOCK/threads = {config['BLOCK'] // (32 * config['num_warps'])} floats/thread > 64"
            )
        return None

    def make_inputs(self, shape, dtype, device, seed=0):
        dev = torch.device(device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        T, N = shape["tokens"], shape["hidden"]
        dt = dtype_of(dtype)
        return {
            "x": torch.randn(T, N, generator=gen, device=dev).to(dt),
            "residual": torch.randn(T, N, generator=gen, device=dev).to(dt),
            "weight": (torch.rand(N, generator=gen, device=dev) + 0.5).to(dt),
            "eps": 1e-6,
        }

    def output_like(self, inputs):
        return torch.empty_like(inputs["x"])

    def run(self, inputs, config=None, out=None):
        r_out = None if out is None else torch.full_like(inputs["residual"], float("nan"))
        y, r = fused_add_rmsnorm(
            inputs["x"], inputs["residual"], inputs["weight"], inputs["eps"], config, out=out, residual_out=r_out
        )
        return torch.cat([y.flatten(), r.flatten()])

    def reference(self, inputs):
        y, s = rmsnorm_reference(inputs["x"], inputs["residual"], inputs["weight"], inputs["eps"])
        return torch.cat([y.flatten(), s.flatten()])

    def torch_baseline(self, inputs):
        s = inputs["x"] + inputs["residual"]
        sf = s.float()
        y = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + inputs["eps"])).to(s.dtype) * inputs["weight"]
        return torch.cat([y.flatten(), s.flatten()])

    def cost(self, shape, dtype="bfloat16"):
        elt = dtype_of(dtype).itemsize
        T, N = shape["tokens"], shape["hidden"]
        return Cost(float(4 * T * N * elt + N * elt), float(5 * T * N))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":
            return [{"tokens": t, "hidden": 4096} for t in (1, 16, 64)]
        if preset == "test":
            return [{"tokens": 3, "hidden": 300}, {"tokens": 2, "hidden": 1024}]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash' or 'test'")


class RopeKernel(TunableKernel):
    name = "rope"
    batch_dim = "tokens"
    instance: "RopeKernel"

    def default_config(self, shape):
        return {"BLOCK_H": 8, "num_warps": 4}

    def config_space(self, shape):
        return {"BLOCK_H": [1, 2, 4, 8, 16, 32, 64], "num_warps": [1, 2, 4, 8]}

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        if config["BLOCK_H"] & (config["BLOCK_H"] - 1):
            return f"block_h: BLOCK_H={config['BLOCK_H']} must be a power of two"
        nope = triton.next_power_of_2(max(1, shape["head_dim"] - shape["rope_dim"]))
        per_thread = config["BLOCK_H"] * nope // (32 * config["num_warps"])
        if per_thread > 128:
            return f"register_pressure: BLOCK_H*head_dim/threads = {per_thread} values/thread > 128"
        return None

    def make_inputs(self, shape, dtype, device, seed=0):
        dev = torch.device(device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        T, H, D = shape["tokens"], shape["heads"], shape["head_dim"]
        max_pos = 4096
        return {
            "x": torch.randn(T, H, D, generator=gen, device=dev).to(dtype_of(dtype)),
            "positions": torch.randint(0, max_pos, (T,), generator=gen, device=dev),
            "cos_sin": rope_cos_sin(max_pos, shape["rope_dim"], device=dev),
            "rope_dim": shape["rope_dim"],
        }

    def output_like(self, inputs):
        return torch.empty_like(inputs["x"])

    def run(self, inputs, config=None, out=None):
        return rope(inputs["x"], inputs["positions"], inputs["cos_sin"], inputs["rope_dim"], config, out=out)

    def reference(self, inputs):
        return rope_reference(inputs["x"], inputs["positions"], inputs["cos_sin"], inputs["rope_dim"])

    def torch_baseline(self, inputs):
        x, rd = inputs["x"], inputs["rope_dim"]
        cs = inputs["cos_sin"][inputs["positions"]]
        cos, sin = cs[:, None, : rd // 2], cs[:, None, rd // 2 :]
        r = x[..., -rd:].float()
        x0, x1 = r[..., 0::2], r[..., 1::2]
        rot = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
        return torch.cat([x[..., :-rd], rot.to(x.dtype)], dim=-1)

    def cost(self, shape, dtype="bfloat16"):
        elt = dtype_of(dtype).itemsize
        T, H, D, R = shape["tokens"], shape["heads"], shape["head_dim"], shape["rope_dim"]
        return Cost(float(2 * T * H * D * elt + T * R * 4 + T * 8), float(6 * T * H * R // 2))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":  # q: 64 heads of 512 (448 nope + 64 rope)
            return [{"tokens": t, "heads": 64, "head_dim": 512, "rope_dim": 64} for t in (1, 16, 64)]
        if preset == "test":
            return [
                {"tokens": 3, "heads": 5, "head_dim": 48, "rope_dim": 16},
                {"tokens": 2, "heads": 4, "head_dim": 64, "rope_dim": 64},
            ]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash' or 'test'")


RMSNormKernel.instance = RMSNormKernel()
RopeKernel.instance = RopeKernel()
