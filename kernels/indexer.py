"""Sparse-attention indexer (DSA "lightning indexer"): fused scoring, then top-k.

For request ``b`` and row ``j < width``::

    score[b, j] = k_scale[j] * sum_h relu(q[b, h, :] · k[j, :]) * w[b, h]

``q : [B, H, D]`` (H = 64, D = 128), ``w : [B, H]`` float32 head weights, ``k`` either per request
``[B, num_rows, D]`` (each request its own compressed rows: the serving case) or shared
``[num_rows, D]``. ``k`` and ``q`` are bf16/fp16/fp32, or fp8 e4m3 with a per-row float32
``k_scale`` (``[B, num_rows]`` or ``[num_rows]``); a per-request q scale is folded into ``w`` by the
caller. ``width`` rows are scored: the configured context (SGLang's static, CUDA-graph behaviour)
or the live length. With ``lengths : [B]`` given, rows ``j >= lengths[b]`` score ``-inf`` and their
``k`` is never read. Tiles wholly past the live length are skipped (``-inf`` written, nothing
computed) unless ``skip_dead=False``: then every tile of the width runs its dot products, weighting
and reduction on masked loads, as a fused indexer launched on a capacity-sized grid does (SGLang
0.5.23's under CUDA graphs; skipping such tiles is its open PR #40431).

The kernel tiles rows (``BLOCK_N`` per step, ``TILES`` steps per program, q loaded once per
program) and does the head reduction on the ``tl.dot`` result in registers, so the
``[B, rows, H]`` intermediate of a torch implementation never reaches memory.
Top-k is ``torch.topk`` on the scores; positions that are ``-inf`` come back as index -1.

Tunables: BLOCK_N, TILES, num_warps, num_stages (pipelines the k loads across the TILES loop).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .base import Cost, TunableKernel, cdiv, device_limits, dtype_of
from .configs import tuned_config

__all__ = ["indexer_scores", "indexer_topk", "indexer_reference", "indexer_torch", "IndexerKernel"]

logger = logging.getLogger(__name__)


@triton.jit(do_not_specialize=["width"])
def _indexer_kernel(
    q_ptr,
    k_ptr,
    w_ptr,
    ks_ptr,
    len_ptr,
    out_ptr,
    width,
    H,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_wb,
    stride_ksb,
    stride_ob,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_LEN: tl.constexpr,
    SKIP_DEAD: tl.constexpr,
):
    pid_b = tl.program_id(0)  # fastest: with a shared k, all requests read a row tile together
    pid_n = tl.program_id(1)
    b64 = pid_b.to(tl.int64)
    live = width
    if HAS_LEN:
        live = tl.minimum(tl.load(len_ptr + pid_b).to(tl.int32), width)
        live = tl.maximum(live, 0)
    base = pid_n * (BLOCK_N * TILES)
    stop = tl.minimum(base + BLOCK_N * TILES, width)
    live_end = tl.minimum(stop, live)
    if not SKIP_DEAD:
        live_end = stop  # the whole tile range computes; the masks alone keep dead rows -inf and unread

    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_d = tl.arange(0, D)
    q = tl.load(
        q_ptr + b64 * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0
    )
    w = tl.load(w_ptr + b64 * stride_wb + offs_h, mask=h_mask, other=0.0).to(tl.float32)
    out_base = out_ptr + b64 * stride_ob
    k_base = k_ptr + b64 * stride_kb

    for n0 in range(base, live_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_live = offs_n < live
        k = tl.load(
            k_base + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :], mask=n_live[:, None], other=0.0
        )
        s = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_H], float32
        score = tl.sum(tl.maximum(s, 0.0) * w[None, :], 1)
        if HAS_SCALE:
            score *= tl.load(ks_ptr + b64 * stride_ksb + offs_n, mask=n_live, other=0.0)
        score = tl.where(n_live, score, float("-inf"))
        tl.store(out_base + offs_n, score, mask=offs_n < width)

    # tiles wholly past the live length: -inf, nothing read
    fill = base + tl.cdiv(tl.maximum(live_end - base, 0), BLOCK_N) * BLOCK_N
    for n0 in range(fill, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        tl.store(out_base + offs_n, tl.full([BLOCK_N], float("-inf"), tl.float32), mask=offs_n < width)


_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, getattr(torch, "float8_e4m3fn", None))


def _check(q, k, w, k_scale, lengths, width):
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, dim], got shape {tuple(q.shape)}")
    B, H, D = q.shape
    if k.dim() not in (2, 3) or k.shape[-1] != D or (k.dim() == 3 and k.shape[0] != B):
        raise ValueError(f"k must be [num_rows, {D}] or [{B}, num_rows, {D}], got shape {tuple(k.shape)}")
    if D < 16 or D & (D - 1):
        raise ValueError(f"dim={D} must be a power of two >= 16")
    if q.dtype != k.dtype or q.dtype not in _SUPPORTED:
        raise ValueError(f"q.dtype={q.dtype} and k.dtype={k.dtype} must match and be one of {_SUPPORTED}")
    if tuple(w.shape) != (B, H):
        raise ValueError(f"w must be [{B}, {H}], got shape {tuple(w.shape)}")
    num_rows = k.shape[-2]
    width = num_rows if width is None else int(width)
    if not 0 < width <= num_rows:
        raise ValueError(f"width={width} must be in [1, num_rows={num_rows}]")
    if k_scale is not None and tuple(k_scale.shape) != tuple(k.shape[:-1]):
        raise ValueError(f"k_scale must have shape {tuple(k.shape[:-1])}, got {tuple(k_scale.shape)}")
    if k_scale is None and q.dtype == _SUPPORTED[3]:
        raise ValueError("k_scale is required for fp8 k (one float32 scale per row)")
    if lengths is not None and (lengths.dim() != 1 or lengths.shape[0] != B):
        raise ValueError(f"lengths must be [{B}], got shape {tuple(lengths.shape)}")
    if q.stride(2) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k must be contiguous in their last dim")
    return B, H, D, width


def indexer_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    width: int | None = None,
    config: dict | None = None,
    *,
    out: torch.Tensor | None = None,
    skip_dead: bool = True,
) -> torch.Tensor:
    """Scores ``[batch, width]`` float32 (``-inf`` at rows >= lengths[b] when lengths are given).

    ``skip_dead=False`` computes every tile of the width, dead ones too (the scores are the same).
    """
    B, H, D, width = _check(q, k, w, k_scale, lengths, width)
    shape = {"batch": B, "heads": H, "dim": D, "width": width, "shared_k": int(k.dim() == 2)}
    kernel = IndexerKernel.instance
    if config is None:
        config = tuned_config(kernel, shape, q.dtype, q.device)
    else:
        kernel.require_config(config, shape, q.device, q.dtype)
    if out is None:
        out = torch.empty((B, width), device=q.device, dtype=torch.float32)
    elif tuple(out.shape) != (B, width) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out must be [{B}, {width}] float32, got {tuple(out.shape)} {out.dtype}")
    if B == 0:
        return out
    w = w.float() if w.dtype != torch.float32 else w
    stride_kb = k.stride(0) if k.dim() == 3 else 0
    stride_ksb = (k_scale.stride(0) if k_scale.dim() == 2 else 0) if k_scale is not None else 0
    per_program = config["BLOCK_N"] * config["TILES"]
    grid = (B, cdiv(width, per_program))
    _indexer_kernel[grid](
        q,
        k,
        w,
        k_scale if k_scale is not None else w,
        lengths if lengths is not None else w,
        out,
        width,
        H,
        q.stride(0),
        q.stride(1),
        stride_kb,
        k.stride(-2),
        w.stride(0),
        stride_ksb,
        out.stride(0),
        D=D,
        BLOCK_H=max(16, triton.next_power_of_2(H)),
        BLOCK_N=config["BLOCK_N"],
        TILES=config["TILES"],
        HAS_SCALE=k_scale is not None,
        HAS_LEN=lengths is not None,
        SKIP_DEAD=bool(skip_dead),
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return out


def indexer_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    topk: int,
    k_scale: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    width: int | None = None,
    config: dict | None = None,
    *,
    skip_dead: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices [B, topk] int32, scores [B, topk] float32)``; index -1 where fewer rows are live.

    The indices feed ``sparse_decode`` directly (-1 is its padding).
    """
    if topk < 1:
        raise ValueError(f"topk={topk} must be >= 1")
    scores = indexer_scores(q, k, w, k_scale, lengths, width, config, skip_dead=skip_dead)
    kk = min(topk, scores.shape[1])
    values, idx = torch.topk(scores, kk, dim=1)
    idx = torch.where(torch.isinf(values), torch.full_like(idx, -1), idx).to(torch.int32)
    if kk < topk:
        pad = topk - kk
        idx = torch.nn.functional.pad(idx, (0, pad), value=-1)
        values = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
    return idx, values


def indexer_reference(q, k, w, k_scale=None, lengths=None, width=None, compute_dtype=None) -> torch.Tensor:
    """float64 (CPU) / float32 (GPU) scores with the [B, rows, H] intermediate materialised."""
    dt = compute_dtype or (torch.float64 if q.device.type == "cpu" else torch.float32)
    width = k.shape[-2] if width is None else width
    kk = k[..., :width, :].to(dt)
    if kk.dim() == 2:
        kk = kk.unsqueeze(0).expand(q.shape[0], -1, -1)
    s = torch.einsum("bnd,bhd->bnh", kk, q.to(dt)).clamp_min(0)
    score = (s * w.to(dt)[:, None, :]).sum(-1)
    if k_scale is not None:
        ks = k_scale[..., :width].to(dt)
        score = score * (ks if ks.dim() == 2 else ks[None, :])
    if lengths is not None:
        pos = torch.arange(width, device=q.device)[None, :]
        score = score.masked_fill(pos >= lengths.to(q.device)[:, None], float("-inf"))
    return score


def indexer_torch(q, k, w, k_scale=None, lengths=None, width=None) -> torch.Tensor:
    """Plain PyTorch as a serving stack would write it (bf16 [B, rows, H] intermediate)."""
    width = k.shape[-2] if width is None else width
    cdt = torch.bfloat16 if q.dtype.itemsize == 1 else q.dtype
    kk = k[..., :width, :].to(cdt)
    s = torch.matmul(kk, q.to(cdt).transpose(-1, -2))  # [B, rows, H]
    score = (torch.relu(s) * w.to(cdt)[:, None, :]).sum(-1, dtype=torch.float32)
    if k_scale is not None:
        score = score * k_scale[..., :width]
    if lengths is not None:
        pos = torch.arange(width, device=q.device)[None, :]
        score = score.masked_fill(pos >= lengths[:, None], float("-inf"))
    return score


class IndexerKernel(TunableKernel):
    name = "indexer"
    batch_dim = "batch"
    instance: "IndexerKernel"

    def default_config(self, shape):
        return {"BLOCK_N": 64, "TILES": 4, "num_warps": 4, "num_stages": 2}

    def config_space(self, shape):
        return {
            "BLOCK_N": [16, 32, 64, 128, 256],
            "TILES": [1, 2, 4, 8, 16],
            "num_warps": [2, 4, 8],
            "num_stages": [1, 2, 3, 4],
        }

    def check_config(self, config, shape, device=None, dtype=None):
        dtype = dtype or "bfloat16"
        why = super().check_config(config, shape, device)
        if why:
            return why
        if config["BLOCK_N"] < 16 or config["BLOCK_N"] & (config["BLOCK_N"] - 1):
            return f"tile_size: BLOCK_N={config['BLOCK_N']} must be a power of two >= 16 (tl.dot)"
        elt = dtype_of(dtype).itemsize
        dim = shape.get("dim", 128)
        block_h = max(16, triton.next_power_of_2(shape.get("heads", 64)))
        smem = elt * (config["BLOCK_N"] * dim * max(1, config["num_stages"]) + block_h * dim)
        limit = device_limits(device)["shared_memory"]
        if smem > limit:
            return f"shared_memory: {smem // 1024} KiB > {limit // 1024} KiB"
        regs = config["BLOCK_N"] * block_h // (32 * config["num_warps"])
        if regs > 128:
            return f"register_pressure: fp32 scores BLOCK_N*heads/threads = {regs} registers/thread > 128"
        return None

    def key_dims(self, shape):
        return {
            "batch": shape["batch"],
            "heads": shape["heads"],
            "dim": shape["dim"],
            "width": triton.next_power_of_2(shape["width"]),
            "shared_k": shape.get("shared_k", 0),
        }

    def make_inputs(self, shape, dtype, device, seed=0):
        dev = torch.device(device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        B, H, D, width = shape["batch"], shape["heads"], shape["dim"], shape["width"]
        rows = shape.get("num_rows", width)
        dt = dtype_of(dtype)
        fp8 = dt.itemsize == 1
        gen_dt = torch.float32 if fp8 or dev.type == "cpu" else dt  # randn straight into bf16/fp16 on GPU
        k_shape = (rows, D) if shape.get("shared_k", 0) else (B, rows, D)
        q = torch.randn(B, H, D, generator=gen, device=dev, dtype=gen_dt).to(dt)
        k = torch.randn(*k_shape, generator=gen, device=dev, dtype=gen_dt)
        k = (k * 4.0 if fp8 else k).to(dt)
        w = torch.randn(B, H, generator=gen, device=dev) * H**-0.5
        scaled = fp8 or shape.get("scaled", 0)
        k_scale = (torch.rand(*k_shape[:-1], generator=gen, device=dev) + 0.5) if scaled else None
        lengths = None
        if shape.get("ragged", 0):
            lengths = torch.randint(0, width + 1, (B,), generator=gen, device=dev).to(torch.int32)
            lengths[0] = width
        return {"q": q, "k": k, "w": w, "k_scale": k_scale, "lengths": lengths, "width": width}

    def output_like(self, inputs):
        q = inputs["q"]
        return torch.empty(q.shape[0], inputs["width"], device=q.device, dtype=torch.float32)

    def run(self, inputs, config=None, out=None):
        return indexer_scores(
            inputs["q"],
            inputs["k"],
            inputs["w"],
            inputs["k_scale"],
            inputs["lengths"],
            inputs["width"],
            config,
            out=out,
        )

    def reference(self, inputs):
        return indexer_reference(
            inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], inputs["lengths"], inputs["width"]
        )

    def torch_baseline(self, inputs):
        return indexer_torch(
            inputs["q"], inputs["k"], inputs["w"], inputs["k_scale"], inputs["lengths"], inputs["width"]
        )

    def tolerance(self, dtype):
        # scores sum relu'd products: fp8 inputs are exact in the reference (same quantised values)
        return {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 5e-3}.get(dtype_of(dtype), 2e-2)

    def cost(self, shape, dtype="bfloat16"):
        elt = dtype_of(dtype).itemsize
        B, H, D, width = shape["batch"], shape["heads"], shape["dim"], shape["width"]
        k_reads = width if shape.get("shared_k", 0) else B * width
        scale = 4 * k_reads if (elt == 1 or shape.get("scaled", 0)) else 0
        nbytes = k_reads * D * elt + scale + B * width * 4 + B * H * (D * elt + 4)
        return Cost(float(nbytes), float(2 * B * width * H * D))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":  # per-request compressed rows: 64K rows, and 262,208 = 1M/4 + 64 (1M context)
            return [
                {"batch": b, "heads": 64, "dim": 128, "width": n, "shared_k": 0}
                for n in (65536, 262208)
                for b in (1, 16, 64)
            ]
        if preset == "test":
            return [
                {
                    "batch": 3,
                    "heads": 16,
                    "dim": 32,
                    "width": 150,
                    "num_rows": 160,
                    "shared_k": 0,
                    "ragged": 1,
                    "scaled": 1,
                },
                {"batch": 2, "heads": 24, "dim": 32, "width": 100, "shared_k": 1},
            ]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash' or 'test'")


IndexerKernel.instance = IndexerKernel()
