"""What the sparse decode kernels share: argument checks, the split-K partition, the merge of split partials, the
reference and torch baseline, fp8 quantisation of a cache, and the tunable-kernel base class.

:mod:`kernels.sparse_decode` (the ``tl.dot`` and SIMT kernels) and :mod:`kernels.sparse_decode_wgmma` (the Gluon
Hopper kernel) both launch :func:`launch_combine` after their split kernel, with the same partial layout
(``part [B, S, H, d_v]``, ``lse [B, S, H]``, base 2), so the two are interchangeable behind their launchers.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from .base import Cost, TunableKernel, cdiv, dtype_of, sm_count

try:  # programmatic dependent launch (Hopper+): the merge kernel's launch overlaps the split kernel
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    PDL = os.environ.get("TUNER_SPARSE_DECODE_PDL", "1") != "0"  # "0": plain launches, process-wide
except ImportError:  # an older Triton: two plain launches
    PDL = False

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass


__all__ = [
    "FP8",
    "LOG2E",
    "PDL",
    "SparseDecodeBase",
    "check_args",
    "combine_grid",
    "combine_kernel",
    "gdc_launch_dependents",
    "gdc_wait",
    "launch_combine",
    "one_wave",
    "quantize_kv_fp8",
    "sparse_decode_reference",
    "sparse_decode_torch",
    "shape_of",
    "split_rows",
    "tail_width",
]

LOG2E = 1.4426950408889634
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)
FP8 = getattr(torch, "float8_e4m3fn", None)


@triton.jit(do_not_specialize=["n_splits"])
def combine_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    n_splits,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    stride_ob,
    stride_oh,
    S_PAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """Merge the splits of one (request, head, column block) by their log-sum-exp (base 2), all splits at once:
    one [S_PAD, BLOCK_D] load, no loop, so a batch-1 merge spreads over H * DV / BLOCK_D programs."""
    pid_d = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if PDL:
        gdc_wait()  # launched early (programmatic dependent launch): wait for the split kernel's grid and its stores
    offs_s = tl.arange(0, S_PAD)
    s_mask = offs_s < n_splits
    lse = tl.load(lse_ptr + b * stride_lb + offs_s * stride_ls + h, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # 0 for empty splits
    wsum = tl.sum(w, 0)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    parts = tl.load(
        part_ptr + b * stride_pb + offs_s[:, None] * stride_ps + h * stride_ph + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )
    o = tl.sum(w[:, None] * parts, 0) / tl.where(wsum > 0.0, wsum, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


def check_args(q, kv, indices, d_v, out, kv_scale=None):
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, d_qk], got shape {tuple(q.shape)}")
    if kv.dim() != 2:
        raise ValueError(f"kv must be [num_rows, d_qk], got shape {tuple(kv.shape)}")
    B, H, d_qk = q.shape
    if kv.shape[1] != d_qk:
        raise ValueError(f"kv.shape[1]={kv.shape[1]} must equal q.shape[2]=d_qk={d_qk}")
    if indices.dim() != 2 or indices.shape[0] != B:
        raise ValueError(f"indices must be [batch={B}, topk], got shape {tuple(indices.shape)}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices.dtype must be torch.int32, got {indices.dtype}")
    if q.dtype not in SUPPORTED:
        raise ValueError(f"q.dtype={q.dtype} must be one of {SUPPORTED}")
    if FP8 is not None and kv.dtype == FP8:
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"an fp8 kv cache needs q in bfloat16 or float16, got q.dtype={q.dtype}")
        if kv_scale is None or kv_scale.dtype != torch.float32 or tuple(kv_scale.shape) != (kv.shape[0],):
            got = None if kv_scale is None else f"{tuple(kv_scale.shape)} {kv_scale.dtype}"
            raise ValueError(f"an fp8 kv cache needs kv_scale: float32 [{kv.shape[0]}] (one scale per row), got {got}")
    elif q.dtype != kv.dtype:
        raise ValueError(f"q.dtype={q.dtype} and kv.dtype={kv.dtype} must match (or kv in float8_e4m3fn with kv_scale)")
    elif kv_scale is not None:
        raise ValueError(f"kv_scale is only for an fp8 kv cache; kv.dtype is {kv.dtype}")
    if not (q.device == kv.device == indices.device):
        raise ValueError(f"q, kv, indices on different devices: {q.device}, {kv.device}, {indices.device}")
    d_v = d_qk if d_v is None else int(d_v)
    if d_v < 16 or d_v & (d_v - 1) or d_v > d_qk:
        raise ValueError(f"d_v={d_v} must be a power of two >= 16 and <= d_qk={d_qk} (pass d_v=512 for d_qk=576)")
    if q.stride(2) != 1 or kv.stride(1) != 1 or indices.stride(1) != 1:
        raise ValueError("q, kv and indices must be contiguous in their last dim")
    if indices.shape[1] < 1:
        raise ValueError(f"indices must select at least one row per request, got topk={indices.shape[1]}")
    if out is not None and (tuple(out.shape) != (B, H, d_v) or out.dtype != q.dtype or out.stride(2) != 1):
        raise ValueError(f"out must be [{B}, {H}, {d_v}] of {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    return B, H, d_qk, d_v


@functools.lru_cache(maxsize=None)
def one_wave(device: torch.device | str | None = None) -> int:
    """Programs in one wave of a split kernel at one program an SM: the SM count of ``device`` (a tensor's device;
    None: this process's current GPU) (an H100 PCIe has 114), an H200's 132 without a GPU. Read once a device: the
    split-count rules ask for it at every default config, the wgmma launcher at every launch."""
    return sm_count(device)


@functools.lru_cache(maxsize=4096)
def split_rows(topk: int, S: int, block_t: int) -> tuple[int, int]:
    """(rows per split, splits that hold a row) for at most ``S`` splits of ``topk`` rows: rows per split is
    rounded up to a whole number of ``block_t`` tiles, so no split runs a mostly empty tile (640 rows, S=32,
    BLOCK_T=16: 20 splits of 32 rows, not 32 splits of 20 rows, each ending in a 4-row tile)."""
    rows = cdiv(cdiv(topk, max(1, min(S, topk))), block_t) * block_t
    return rows, cdiv(topk, rows)


def tail_width(d_qk: int, d_v: int) -> tuple[int, int]:
    d_tail = d_qk - d_v
    return (0, 0) if d_tail == 0 else (max(16, triton.next_power_of_2(d_tail)), d_tail)


def shape_of(q, kv, indices, d_v) -> dict:
    return {
        "batch": q.shape[0],
        "heads": q.shape[1],
        "d_qk": q.shape[2],
        "d_v": d_v,
        "topk": indices.shape[1],
        "num_rows": kv.shape[0],
    }


def combine_grid(B: int, S: int, H: int, d_v: int) -> tuple[int, int, int]:
    """The merge kernel's grid for ``S`` splits: (column blocks, heads, requests), each program one [S_PAD, BLOCK_D]
    float32 tile of 32 values a thread."""
    block_d = min(d_v, max(32, 4096 // triton.next_power_of_2(S)))
    return d_v // block_d, H, B


def launch_combine(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
    """Merge the split partials ``part [B, S, H, d_v]`` (normalised; float32, or 16-bit from the wgmma kernel's
    ``PART16``, read and summed in float32) by their log-sum-exp ``lse [B, S, H]``
    (base 2) into ``out [B, H, d_v]``; ``pdl``: launched with programmatic dependent launch (it waits in-kernel for
    the grid that wrote the partials)."""
    B, S, H, d_v = part.shape
    grid = combine_grid(B, S, H, d_v)
    combine_kernel[grid](
        part,
        lse,
        out,
        S,
        *part.stride()[:3],
        *lse.stride()[:2],
        out.stride(0),
        out.stride(1),
        S_PAD=triton.next_power_of_2(S),
        BLOCK_D=d_v // grid[0],
        PDL=pdl,
        num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )


# ----------------------------------------------------------------------------------------------------
# Torch reference and baseline
# ----------------------------------------------------------------------------------------------------
def sparse_decode_reference(q, kv, indices, sm_scale=None, d_v=None, compute_dtype=None, kv_scale=None) -> torch.Tensor:
    """Gather + matmul + softmax in float64 on CPU / float32 on GPU (or ``compute_dtype``); an fp8 cache is
    dequantised first (``kv * kv_scale[:, None]`` in that dtype)."""
    d_qk = q.shape[2]
    d_v = d_qk if d_v is None else d_v
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else sm_scale
    dt = compute_dtype or (torch.float64 if q.device.type == "cpu" else torch.float32)
    valid = (indices >= 0) & (indices < kv.shape[0])
    rows = torch.where(valid, indices, torch.zeros_like(indices)).long()
    k = kv[rows].to(dt)  # [B, T, d_qk]
    if kv_scale is not None:
        k = k * kv_scale[rows].to(dt)[..., None]
    s = torch.einsum("bhd,btd->bht", q.to(dt), k) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return torch.einsum("bht,btd->bhd", p, k[..., :d_v])


def sparse_decode_torch(q, kv, indices, sm_scale=None, d_v=None, kv_scale=None) -> torch.Tensor:
    """Plain PyTorch in q's dtype: gather (+ dequantise an fp8 cache) + bmm + float32 softmax + bmm (the baseline)."""
    d_qk = q.shape[2]
    d_v = d_qk if d_v is None else d_v
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else sm_scale
    valid = (indices >= 0) & (indices < kv.shape[0])
    rows = torch.where(valid, indices, 0).long()
    k = kv[rows]
    if kv_scale is not None:
        k = (k.to(torch.float32) * kv_scale[rows][..., None]).to(q.dtype)
    s = torch.bmm(q, k.transpose(1, 2)).float() * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.bmm(p, k[..., :d_v])


def quantize_kv_fp8(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 rows, float32 per-row scales) of a cache: ``scale[r] = max|kv[r]| / 448`` (448: e4m3's largest value)."""
    kv32 = kv.to(torch.float32)
    scale = (kv32.abs().amax(dim=1) / 448.0).clamp(min=1e-12)
    return (kv32 / scale[:, None]).to(FP8), scale


# ----------------------------------------------------------------------------------------------------
# Tunable-kernel descriptions
# ----------------------------------------------------------------------------------------------------
def pow2(x: int) -> bool:
    return x >= 1 and not x & (x - 1)


class SparseDecodeBase(TunableKernel):
    batch_dim = "batch"

    def key_dims(self, shape):
        return {k: shape[k] for k in ("batch", "heads", "d_qk", "d_v", "topk")}

    def make_inputs(self, shape, dtype, device, seed=0):
        dev = torch.device(device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        B, H, d_qk, d_v = shape["batch"], shape["heads"], shape["d_qk"], shape["d_v"]
        topk, num_rows = shape["topk"], shape["num_rows"]
        dt = dtype_of(dtype)
        fp8 = dt == FP8
        q = torch.randn(B, H, d_qk, generator=gen, device=dev).to(torch.bfloat16 if fp8 else dt)
        kv = torch.randn(num_rows, d_qk, generator=gen, device=dev)
        kv_scale = None
        if fp8:  # rows of different magnitudes, so that a wrong row's scale shows
            kv = kv * torch.exp(0.5 * torch.randn(num_rows, 1, generator=gen, device=dev))
            kv, kv_scale = quantize_kv_fp8(kv)
        else:
            kv = kv.to(dt)
        # distinct rows per request (like a real top-k), the cache's last row always in play
        if num_rows >= topk:
            idx = torch.rand(B, num_rows, generator=gen, device=dev).argsort(dim=1)[:, :topk]
        else:
            idx = torch.randint(0, num_rows, (B, topk), generator=gen, device=dev)
        idx[:, 0] = num_rows - 1
        if shape.get("ragged", 0):  # ragged padding: request b > 0 keeps a random number of valid rows
            keep = torch.randint(0, topk + 1, (B, 1), generator=gen, device=dev)
            keep[0] = topk
            pos = torch.rand(B, topk, generator=gen, device=dev).argsort(dim=1)
            idx = torch.where(pos < keep, idx, torch.full_like(idx, -1))
        return {
            "q": q,
            "kv": kv,
            "indices": idx.to(device=device, dtype=torch.int32),
            "sm_scale": 1.0 / math.sqrt(d_qk),
            "d_v": d_v,
            "kv_scale": kv_scale,
        }

    def output_like(self, inputs):
        q = inputs["q"]
        return torch.empty(q.shape[0], q.shape[1], inputs["d_v"], device=q.device, dtype=q.dtype)

    def reference(self, inputs):
        return sparse_decode_reference(
            inputs["q"],
            inputs["kv"],
            inputs["indices"],
            inputs["sm_scale"],
            inputs["d_v"],
            kv_scale=inputs.get("kv_scale"),
        )

    def torch_baseline(self, inputs):
        return sparse_decode_torch(
            inputs["q"],
            inputs["kv"],
            inputs["indices"],
            inputs["sm_scale"],
            inputs["d_v"],
            kv_scale=inputs.get("kv_scale"),
        )

    def tolerance(self, dtype):
        # an fp8 cache is compared with the float32 reference of its dequantised rows, so bf16 arithmetic bounds it
        return 2e-2 if dtype_of(dtype) == FP8 else super().tolerance(dtype)

    def cost(self, shape, dtype="bfloat16"):
        """An fp8 cache moves one byte per value plus a float32 scale per row; q and out stay 16-bit."""
        dt = dtype_of(dtype)
        fp8 = dt == FP8
        row_bytes = shape["d_qk"] + 4 if fp8 else shape["d_qk"] * dt.itemsize
        elt = 2 if fp8 else dt.itemsize
        B, H, d_qk, d_v, topk = (shape[k] for k in ("batch", "heads", "d_qk", "d_v", "topk"))
        rows = min(topk, shape.get("num_rows", topk) * 1)
        nbytes = B * rows * row_bytes + B * topk * 4 + B * H * d_qk * elt + B * H * d_v * elt
        flops = 2 * B * H * topk * (d_qk + d_v)
        return Cost(float(nbytes), float(flops))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":  # 64 heads, one shared 512 latent, top-512 compressed + 128-window rows
            return [
                {"batch": b, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536} for b in (1, 16, 64)
            ]
        if preset == "v32":
            return [
                {"batch": b, "heads": 128, "d_qk": 576, "d_v": 512, "topk": 2048, "num_rows": 131072}
                for b in (1, 16, 64)
            ]
        if preset == "test":
            return [{"batch": 3, "heads": 16, "d_qk": 64, "d_v": 64, "topk": 40, "num_rows": 97, "ragged": 1}]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash', 'v32' or 'test'")

    def _common_rules(self, config, shape):
        if not pow2(shape["d_v"]) or shape["d_v"] < 16 or shape["d_v"] > shape["d_qk"]:
            return f"d_v: d_v={shape['d_v']} must be a power of two in [16, d_qk={shape['d_qk']}]"
        for key in ("BLOCK_T", "BLOCK_H"):
            if key in config and (not pow2(config[key]) or config[key] < 16):
                return f"tile_size: {key}={config[key]} must be a power of two >= 16 (tl.dot)"
        if config.get("num_warps", 4) not in (1, 2, 4, 8, 16):
            return f"num_warps: {config['num_warps']} not a power of two <= 16"
        return None
