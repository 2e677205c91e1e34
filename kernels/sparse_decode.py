"""Sparse MLA/MQA decode attention (DeepSeek-V3.2 / V4-Flash), MMA form with split-K.

Each request ``b`` has ``H`` query heads ``q[b] : [H, d_qk]`` and attends to ``topk`` rows of one
shared K=V latent cache ``kv : [num_rows, d_qk]`` picked by ``indices[b] : [topk]`` (int32; a
negative index, or one >= num_rows, is padding and is masked). V is the first ``d_v`` columns of
the same rows::

    out[b, h] = softmax(sm_scale * q[b, h] @ kv[idx[b]].T) @ kv[idx[b], :d_v]

A request with no valid row gets zeros.

Because all heads of a request read the same rows, one program gathers a tile of ``BLOCK_T`` rows
once and feeds ``BLOCK_H`` heads through ``tl.dot`` (tensor cores), keeping an online softmax.
The selected rows are split into at most ``S`` chunks of whole ``BLOCK_T`` tiles (split-K, see
:func:`split_rows`) so that batch 1 still fills the GPU; the partial results (normalised output and
log-sum-exp per split) are merged by a second kernel that takes all splits of one (request, head,
column block) in one load: ``heads * d_v / BLOCK_D`` programs per request. (Before issue 20 the merge
was 4-head programs looping over the splits: 16 programs at batch 1, and at 32 splits it cost more
than the attention itself; on an H200 at the issue's batch-1 config the new pair measured 2.6x faster,
``benchmarks/results/kernels_issue20_h200.md``.) The merge kernel is launched with programmatic
dependent launch where the GPU has it (Hopper): its launch overlaps the split kernel and it waits
in-kernel (``gdc_wait``) for that grid's stores. With ``S == 1`` the first kernel writes the output
directly.

The cache may be float8 e4m3 with one float32 scale per row (``kv_scale``): the rows are widened to
q's dtype in registers (exact) and the scales multiply the [heads, rows] score and probability tiles,
so the tensor-core math stays bf16/fp16.

``d_v`` must be a power of two (512); ``d_qk - d_v`` (0 for V4-Flash, 64 for V3.2's rope part) is
handled as a separate, padded "tail" dot.

Tunables: S, BLOCK_H, BLOCK_T, num_warps, num_stages. ``sparse_decode_simt`` is the per-head
baseline: one program per (request, head), no tensor cores, every head re-reads its rows.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import torch
import triton
import triton.language as tl

from .base import Cost, TunableKernel, cdiv, device_limits, dtype_of, gpu_target, zeroed_counters

try:  # programmatic dependent launch (Hopper+): the merge kernel's launch overlaps the split kernel
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _PDL = os.environ.get("TUNER_SPARSE_DECODE_PDL", "1") != "0"  # "0": plain launches, process-wide
except ImportError:  # an older Triton: two plain launches
    _PDL = False

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass

from .configs import tuned_config

__all__ = ["SparseDecodeKernel", "SparseDecodeSimtKernel", "launch_combine", "one_wave", "quantize_kv_fp8", "sparse_decode",
           "sparse_decode_simt", "split_rows"]

logger = logging.getLogger(__name__)

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the lines of ``ptrs`` without waiting (PTX ``prefetch.global.L2``); returns a dummy."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit(do_not_specialize=["B", "num_rows", "n_splits"])
def _sparse_decode_kernel(
    q_ptr, kv_ptr, kv_scale_ptr, idx_ptr, part_ptr, lse_ptr, out_ptr, lock_ptr,
    B, H, num_rows, topk, rows_per_split, n_splits, qk_scale,
    stride_qb, stride_qh, stride_kv, stride_ib,
    stride_pb, stride_ps, stride_ph,
    stride_lb, stride_ls,
    stride_ob, stride_oh,
    DV: tl.constexpr, DT: tl.constexpr, D_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, DIRECT: tl.constexpr, FUSED_COMBINE: tl.constexpr,
    KV_SCALED: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
    PREFETCH_NEXT: tl.constexpr = False, LINES: tl.constexpr = 8, LINE_ELTS: tl.constexpr = 64,
    V_SPLIT: tl.constexpr = 1, IDX_AHEAD: tl.constexpr = False, QK_AHEAD: tl.constexpr = False,
):
    # fastest: the column parts, then the head blocks of one (request, split): they read the same rows, share L2
    pid_h = tl.program_id(0) // V_SPLIT
    pid_v = tl.program_id(0) % V_SPLIT  # which DV / V_SPLIT columns of V this program accumulates
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2)
    if PDL:
        # programmatic dependent launch: the merge kernel may be launched now; it waits (gdc_wait) for this grid
        # to complete before it reads a partial, so only its launch latency overlaps this kernel
        gdc_launch_dependents()

    start = pid_s * rows_per_split  # rows_per_split is a multiple of BLOCK_T: every split but the last is full
    end = tl.minimum(start + rows_per_split, topk)
    idx_base = idx_ptr + pid_b.to(tl.int64) * stride_ib
    if PREFETCH:
        # the first index tile's DRAM round trip overlaps the q load below instead of following it
        _prefetch_l2(idx_base + start + tl.arange(0, BLOCK_T))

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_d = tl.arange(0, DV)
    q_base = q_ptr + pid_b.to(tl.int64) * stride_qb + offs_h[:, None] * stride_qh
    q = tl.load(q_base + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    if DT > 0:
        offs_e = tl.arange(0, DT)
        e_mask = offs_e < D_TAIL
        q_tail = tl.load(q_base + DV + offs_e[None, :], mask=h_mask[:, None] & e_mask[None, :], other=0.0)

    DVC: tl.constexpr = DV // V_SPLIT
    offs_c = pid_v * DVC + tl.arange(0, DVC)  # this program's output columns (all of them when V_SPLIT == 1)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DVC], tl.float32)
    if QK_AHEAD:
        # the next tile's gather and QK product are issued before this tile's softmax and PV product, so that the
        # (asynchronous) tensor-core work of one overlaps the other's vector work (bf16/fp16 cache, one V part only)
        kv_c, valid_c, safe_c = _gather_tile(kv_ptr, idx_base, start, end, num_rows, stride_kv, offs_d, BLOCK_T)
        s_c = _tile_scores(q, q_tail if DT > 0 else q, kv_c, valid_c, safe_c, kv_ptr, stride_kv, qk_scale, DV, DT, D_TAIL)
        for t0 in range(start + BLOCK_T, end, BLOCK_T):
            kv_n, valid_n, safe_n = _gather_tile(kv_ptr, idx_base, t0, end, num_rows, stride_kv, offs_d, BLOCK_T)
            s_n = _tile_scores(q, q_tail if DT > 0 else q, kv_n, valid_n, safe_n, kv_ptr, stride_kv, qk_scale, DV, DT, D_TAIL)
            m_i, l_i, acc = _online_pv(s_c, kv_c, m_i, l_i, acc)
            kv_c = kv_n
            s_c = s_n
        m_i, l_i, acc = _online_pv(s_c, kv_c, m_i, l_i, acc)
    else:
        if IDX_AHEAD:
            rows_next = tl.load(idx_base + start + tl.arange(0, BLOCK_T), mask=start + tl.arange(0, BLOCK_T) < end, other=-1)
        for t0 in range(start, end, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            if IDX_AHEAD:
                # this tile's indices were loaded one iteration ago; the next tile's load overlaps this tile's work
                rows = rows_next
                nxt = offs_t + BLOCK_T
                rows_next = tl.load(idx_base + nxt, mask=nxt < end, other=-1)
            else:
                rows = tl.load(idx_base + offs_t, mask=offs_t < end, other=-1)
            valid = (rows >= 0) & (rows < num_rows)
            safe = tl.where(valid, rows, 0).to(tl.int64)
            row_ptr = kv_ptr + safe[:, None] * stride_kv
            kv = tl.load(row_ptr + offs_d[None, :], mask=valid[:, None], other=0.0)  # [BLOCK_T, DV]: K and V
            if PREFETCH_NEXT:
                # the next tile's rows, asked of L2 now, so that their DRAM round trip overlaps this tile's dots and
                # softmax (measured slower: see the launcher's docstring)
                nxt = offs_t + BLOCK_T
                rows_n = tl.load(idx_base + nxt, mask=nxt < end, other=0)
                rows_n = tl.where((rows_n >= 0) & (rows_n < num_rows), rows_n, 0).to(tl.int64)
                cols = tl.minimum(tl.arange(0, LINES) * LINE_ELTS, DV + D_TAIL - 1)  # one address per 128-byte line
                _prefetch_l2(kv_ptr + rows_n[:, None] * stride_kv + cols[None, :])
            if KV_SCALED:
                # fp8 e4m3 rows, one float32 scale per row: widen exactly, scale the [H, T] tiles instead. K is loaded
                # a second time as a [DV, BLOCK_T] tile (from L2): widening a transposed fp8 tile in registers spills
                k_t = tl.load(kv_ptr + safe[None, :] * stride_kv + offs_d[:, None], mask=valid[None, :], other=0.0)
                row_scale = tl.load(kv_scale_ptr + safe, mask=valid, other=0.0)
                s = tl.dot(q, k_t.to(q.dtype))
                kv = kv.to(q.dtype)
            else:
                s = tl.dot(q, tl.trans(kv))
            if DT > 0:
                k_tail = tl.load(row_ptr + DV + offs_e[None, :], mask=valid[:, None] & e_mask[None, :], other=0.0)
                s += tl.dot(q_tail, tl.trans(k_tail.to(q.dtype)))
            if KV_SCALED:
                s = s * (row_scale * qk_scale)[None, :]
            else:
                s = s * qk_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if KV_SCALED:
                p = p * row_scale[None, :]
            if V_SPLIT == 1:
                v = kv
            else:  # every part computes the same scores from whole rows; V is its own columns of them (from L1)
                v = tl.load(row_ptr + offs_c[None, :], mask=valid[:, None], other=0.0).to(q.dtype)
            acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None])
            m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if DIRECT:
        out_ptrs = out_ptr + pid_b.to(tl.int64) * stride_ob + offs_h[:, None] * stride_oh + offs_c[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
    else:
        part_ptrs = part_ptr + pid_b.to(tl.int64) * stride_pb + pid_s * stride_ps + offs_h[:, None] * stride_ph + offs_c[None, :]
        tl.store(part_ptrs, o, mask=h_mask[:, None])
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # the same in every part: written once
        tl.store(lse_ptr + pid_b.to(tl.int64) * stride_lb + pid_s * stride_ls + offs_h, lse,
                 mask=h_mask & (tl.zeros([BLOCK_H], tl.int32) + pid_v == 0))
        if FUSED_COMBINE:
            # The last split of this (request, head block) to finish merges all splits: no second
            # launch. Barrier, then a gpu-scope acq_rel atomic publishes this CTA's partial stores
            # (the split-K semaphore pattern of CUTLASS and Triton's layer-norm tutorial).
            tl.debug_barrier()
            lock = lock_ptr + pid_b * tl.num_programs(0) + pid_h
            done = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:
                _merge_splits(part_ptr + pid_b.to(tl.int64) * stride_pb, lse_ptr + pid_b.to(tl.int64) * stride_lb,
                              out_ptr + pid_b.to(tl.int64) * stride_ob, offs_h, h_mask, n_splits,
                              stride_ps, stride_ph, stride_ls, stride_oh, BLOCK_H, DV, ".cg")
                tl.atomic_xchg(lock, 0)  # ready for the next call (CUDA-graph replays reuse the counters)


@triton.jit
def _gather_tile(kv_ptr, idx_base, t0, end, num_rows, stride_kv, offs_d, BLOCK_T: tl.constexpr):
    """Rows ``t0 .. t0 + BLOCK_T`` of this split: (the [BLOCK_T, DV] tile, valid mask, safe row numbers)."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    rows = tl.load(idx_base + offs_t, mask=offs_t < end, other=-1)
    valid = (rows >= 0) & (rows < num_rows)
    safe = tl.where(valid, rows, 0).to(tl.int64)
    kv = tl.load(kv_ptr + safe[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None], other=0.0)
    return kv, valid, safe


@triton.jit
def _tile_scores(q, q_tail, kv, valid, safe, kv_ptr, stride_kv, qk_scale, DV: tl.constexpr, DT: tl.constexpr,
                 D_TAIL: tl.constexpr):
    """[BLOCK_H, BLOCK_T] scores in log2 units, -inf where a row is padding."""
    s = tl.dot(q, tl.trans(kv))
    if DT > 0:
        offs_e = tl.arange(0, DT)
        e_mask = offs_e < D_TAIL
        k_tail = tl.load(kv_ptr + safe[:, None] * stride_kv + DV + offs_e[None, :], mask=valid[:, None] & e_mask[None, :],
                         other=0.0)
        s += tl.dot(q_tail, tl.trans(k_tail.to(q.dtype)))
    return tl.where(valid[None, :], s * qk_scale, float("-inf"))


@triton.jit
def _online_pv(s, v, m_i, l_i, acc):
    """One online-softmax step: fold the [BLOCK_H, BLOCK_T] scores ``s`` and their rows ``v`` into (m, l, acc)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _merge_splits(part_base, lse_base, out_base, offs_h, h_mask, n_splits,
                  stride_ps, stride_ph, stride_ls, stride_oh, BLOCK_H: tl.constexpr, DV: tl.constexpr,
                  CACHE: tl.constexpr):
    """out = sum_s 2^(lse_s - m) * o_s / sum_s 2^(lse_s - m), m = max_s lse_s (zeros if all -inf), 64 columns at a
    time: a [BLOCK_H, 64] float32 tile a step, so the merge adds no register pressure to the split's program."""
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(n_splits):
        m = tl.maximum(m, tl.load(lse_base + s * stride_ls + offs_h, mask=h_mask, other=float("-inf"), cache_modifier=CACHE))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wsum = tl.zeros([BLOCK_H], tl.float32)
    for s in range(n_splits):
        wsum += tl.exp2(tl.load(lse_base + s * stride_ls + offs_h, mask=h_mask, other=float("-inf"), cache_modifier=CACHE) - m_safe)
    inv = 1.0 / tl.where(wsum > 0.0, wsum, 1.0)
    BD: tl.constexpr = 64 if DV > 64 else DV
    for d0 in tl.static_range(0, DV, BD):
        offs_c = d0 + tl.arange(0, BD)
        acc = tl.zeros([BLOCK_H, BD], tl.float32)
        for s in range(n_splits):
            w = tl.exp2(tl.load(lse_base + s * stride_ls + offs_h, mask=h_mask, other=float("-inf"), cache_modifier=CACHE) - m_safe)
            acc += w[:, None] * tl.load(part_base + s * stride_ps + offs_h[:, None] * stride_ph + offs_c[None, :],
                                        mask=h_mask[:, None], other=0.0, cache_modifier=CACHE)
        tl.store(out_base + offs_h[:, None] * stride_oh + offs_c[None, :], (acc * inv[:, None]).to(out_base.dtype.element_ty),
                 mask=h_mask[:, None])


@triton.jit(do_not_specialize=["n_splits"])
def _combine_kernel(
    part_ptr, lse_ptr, out_ptr, n_splits,
    stride_pb, stride_ps, stride_ph,
    stride_lb, stride_ls,
    stride_ob, stride_oh,
    S_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
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
    parts = tl.load(part_ptr + b * stride_pb + offs_s[:, None] * stride_ps + h * stride_ph + offs_d[None, :],
                    mask=s_mask[:, None], other=0.0)
    o = tl.sum(w[:, None] * parts, 0) / tl.where(wsum > 0.0, wsum, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["num_rows", "topk"])
def _sparse_decode_simt_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr,
    num_rows, topk, qk_scale,
    stride_qb, stride_qh, stride_kv, stride_ib, stride_ob, stride_oh,
    DV: tl.constexpr, DT: tl.constexpr, D_TAIL: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One program per (head, request); plain FMA dot products; each head re-reads its rows."""
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_d = tl.arange(0, DV)
    q_base = q_ptr + pid_b.to(tl.int64) * stride_qb + pid_h * stride_qh
    q = tl.load(q_base + offs_d).to(tl.float32)
    if DT > 0:
        offs_e = tl.arange(0, DT)
        e_mask = offs_e < D_TAIL
        q_tail = tl.load(q_base + DV + offs_e, mask=e_mask, other=0.0).to(tl.float32)
    m_i = tl.max(tl.full([BLOCK_T], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([BLOCK_T], tl.float32), 0)
    acc = tl.zeros([DV], tl.float32)
    idx_base = idx_ptr + pid_b.to(tl.int64) * stride_ib
    for t0 in range(0, topk, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        rows = tl.load(idx_base + offs_t, mask=offs_t < topk, other=-1)
        valid = (rows >= 0) & (rows < num_rows)
        row_ptr = kv_ptr + tl.where(valid, rows, 0).to(tl.int64)[:, None] * stride_kv
        kv = tl.load(row_ptr + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(kv * q[None, :], 1)
        if DT > 0:
            k_tail = tl.load(row_ptr + DV + offs_e[None, :], mask=valid[:, None] & e_mask[None, :], other=0.0)
            s += tl.sum(k_tail.to(tl.float32) * q_tail[None, :], 1)
        s = tl.where(valid, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * kv, 0)
        m_i = m_new
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(out_ptr + pid_b.to(tl.int64) * stride_ob + pid_h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------
_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)
_FP8 = getattr(torch, "float8_e4m3fn", None)


def _check_args(q, kv, indices, d_v, out, kv_scale=None):
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
    if q.dtype not in _SUPPORTED:
        raise ValueError(f"q.dtype={q.dtype} must be one of {_SUPPORTED}")
    if _FP8 is not None and kv.dtype == _FP8:
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
    return device_limits(("cuda" if torch.cuda.is_available() else None) if device is None else device)["sms"]


@functools.lru_cache(maxsize=4096)
def split_rows(topk: int, S: int, block_t: int) -> tuple[int, int]:
    """(rows per split, splits that hold a row) for at most ``S`` splits of ``topk`` rows: rows per split is
    rounded up to a whole number of ``block_t`` tiles, so no split runs a mostly empty tile (640 rows, S=32,
    BLOCK_T=16: 20 splits of 32 rows, not 32 splits of 20 rows, each ending in a 4-row tile)."""
    rows = cdiv(cdiv(topk, max(1, min(S, topk))), block_t) * block_t
    return rows, cdiv(topk, rows)


def _tail(d_qk: int, d_v: int) -> tuple[int, int]:
    d_tail = d_qk - d_v
    return (0, 0) if d_tail == 0 else (max(16, triton.next_power_of_2(d_tail)), d_tail)


def _shape_of(q, kv, indices, d_v) -> dict:
    return {"batch": q.shape[0], "heads": q.shape[1], "d_qk": q.shape[2], "d_v": d_v,
            "topk": indices.shape[1], "num_rows": kv.shape[0]}


_COUNTERS: dict[str, torch.Tensor] = {}


def _split_counters(device, n: int) -> torch.Tensor:
    """Zeroed int32 counters, one per (request, head block); each launch leaves them at zero."""
    return zeroed_counters(_COUNTERS, device, n)


def sparse_decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    config: dict | None = None,
    *,
    d_v: int | None = None,
    out: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    fused_combine: bool = False,
    pdl: bool | None = None,
    prefetch_next: bool = False,
    v_split: int = 1,
    idx_ahead: bool = False,
    qk_ahead: bool = False,
    _pdl_trigger: bool | None = None,
) -> torch.Tensor:
    """Sparse MQA decode attention; returns ``[batch, heads, d_v]`` in ``q.dtype``.

    ``kv`` in ``q.dtype``, or in float8 e4m3 with ``kv_scale`` (float32 ``[num_rows]``, row r holds
    ``kv[r] * kv_scale[r]``): half the bytes of a bf16 cache, same bf16 tensor-core math (the fp8 values
    widen exactly; the row scales multiply the [heads, rows] score and probability tiles).
    ``config`` keys: S, BLOCK_H, BLOCK_T, num_warps, num_stages; None looks up the tuned config
    (``kernels.configs.lookup``, cached per shape, keyed by the kv dtype) or the default. S is an upper bound:
    see :func:`split_rows`.
    ``fused_combine``: with S > 1, True makes the last split to finish merge the partials in the same
    launch (per-(request, head block) counters reset by the kernel itself, so CUDA-graph replays are
    safe; calls in flight concurrently on two streams of one device must not overlap). Off by
    default: one CTA per (request, head block) merges serially what the combine kernel spreads over
    ``heads * d_v / BLOCK_D`` programs (H200, 2026-11-29: B=1 20.6 vs 17.1 µs with the older 4-head combine;
    2026-11-30 at 7b6c32a, merging 64 columns at a time: 0.35x / 0.76x / 1.00x the merge kernel's best at batch
    1 / 16 / 64, ``benchmarks/results/sparse_decode_fused_h200.md``).
    ``pdl``: launch the merge kernel with programmatic dependent launch (its launch overlaps the split kernel; it
    waits for that grid before reading), None = wherever the GPU supports it (compute capability 9.0 and up).
    ``prefetch_next``: while a tile is computed, load the next tile's indices and ask L2 for its rows (PTX
    ``prefetch.global.L2``, one per 128-byte line). Off by default: measured slower on an H200 (2026-11-30, 5e448d4,
    ``benchmarks/results/sparse_decode_prefetch_h200.md``: best config 0.88x at batch 16, 0.90x at 64, 1.04x only for
    an fp8 cache at 64; the shipped batch-64 config spilled to 30x slower). Kept so that result can be re-measured.
    ``v_split``: each (request, head block, split) runs as ``v_split`` programs that compute the same scores from
    whole rows and accumulate ``d_v / v_split`` columns of V each: a 1/v_split accumulator a program and v_split
    times the programs, for the QK products and the rows' reads done v_split times (the rows from L2). Off by
    default: measured slower on an H200 (2026-11-30, c9272ae, ``benchmarks/results/sparse_decode_variants_h200.md``:
    v_split=2's best against the shipped path's 0.96x at batch 1, 0.77x at 16, 0.55x at 64 with a bf16 cache; 1.05x
    only for an fp8 cache at batch 1), so what bounds the kernel is the per-row work of the scores (gather, QK
    product, softmax), not the accumulator. Kept, like ``prefetch_next``, to re-measure on other GPUs.
    ``idx_ahead``: load each tile's indices one iteration early (a loop-carried tile), so that the gather's
    address round trip to DRAM overlaps the previous tile's products instead of preceding its own gather (the
    compiled loop had the next tile's index load, a plain ``ld.global``, right before its gather). Off by default:
    on an H200 (2026-11-30, 77f77f3 and 7b6c32a, ``benchmarks/results/sparse_decode_ahead_h200.md`` and
    ``sparse_decode_fused_h200.md``) its best config beat the plain loop's best by 1.01-1.05x at batch 1/16/64,
    but per config it ranged 0.61-1.77x (mostly gains with 3 stages), so it is a choice per config, which the
    config space does not hold yet.
    ``_pdl_trigger`` (timing only, a correct result either way): with a PDL-launched merge, False keeps the split
    kernel from letting it start early (``griddepcontrol.launch_dependents``), so it starts as the split kernel's
    programs exit; None or True: early, as always before.
    ``qk_ahead``: gather the next tile and issue its QK product before this tile's softmax and PV product (the
    next tile's scores are carried to the next iteration), so the asynchronous tensor-core work of one tile can
    overlap the vector work of the other; a 16-bit cache and ``v_split=1`` only. Measured slower (same run:
    0.78-0.94x at the best configs; 32-head, 128-row tiles no longer fit shared memory). Kept to re-measure.
    """
    B, H, d_qk, d_v = _check_args(q, kv, indices, d_v, out, kv_scale)
    if v_split not in (1, 2, 4) or d_v // v_split < 16:
        raise ValueError(f"v_split={v_split} must be 1, 2 or 4 with d_v / v_split >= 16 (d_v={d_v})")
    if qk_ahead and (kv_scale is not None or v_split != 1 or prefetch_next):
        raise ValueError("qk_ahead needs a 16-bit kv cache, v_split=1 and prefetch_next=False: drop qk_ahead or those")
    if v_split > 1 and fused_combine:
        raise ValueError("v_split > 1 merges through the combine kernel: pass fused_combine=False")
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    shape = _shape_of(q, kv, indices, d_v)
    kernel = SparseDecodeKernel.instance
    if config is None:
        config = tuned_config(kernel, shape, kv.dtype, q.device)
    else:
        kernel.require_config(config, shape, q.device, kv.dtype)
    BLOCK_H, BLOCK_T = config["BLOCK_H"], config["BLOCK_T"]
    rows_per_split, S = split_rows(topk, config["S"], BLOCK_T)
    DT, D_TAIL = _tail(d_qk, d_v)
    if out is None:
        out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    direct = S == 1
    n_hblocks = cdiv(H, BLOCK_H)
    if direct:
        part, lse, locks = out, out, indices  # unused
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((B, S, H, d_v), device=q.device, dtype=torch.float32)
        lse = torch.empty((B, S, H), device=q.device, dtype=torch.float32)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
        locks = _split_counters(q.device, B * n_hblocks) if fused_combine else indices
    target = gpu_target(q.device)  # meta tensors in a compile helper answer the GPU's: same binary as a real launch
    on_gpu = target is not None
    if pdl is None:
        pdl = on_gpu and _PDL and target >= (9, 0)
    pdl = bool(pdl) and on_gpu and not direct and not fused_combine
    prefetch_next = bool(prefetch_next) and on_gpu
    row_bytes = kv.element_size() * d_qk
    lines = triton.next_power_of_2(cdiv(row_bytes, 128))
    grid = (n_hblocks * v_split, S, B)
    _sparse_decode_kernel[grid](
        q, kv, kv if kv_scale is None else kv_scale, indices, part, lse, out, locks,
        B, H, kv.shape[0], topk, rows_per_split, S, sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
        *part_strides, *lse_strides,
        out.stride(0), out.stride(1),
        DV=d_v, DT=DT, D_TAIL=D_TAIL, BLOCK_H=BLOCK_H, BLOCK_T=BLOCK_T, DIRECT=direct,
        FUSED_COMBINE=bool(fused_combine and not direct), KV_SCALED=kv_scale is not None,
        PREFETCH=on_gpu, PDL=pdl and _pdl_trigger is not False, PREFETCH_NEXT=prefetch_next, LINES=lines, LINE_ELTS=128 // kv.element_size(),
        V_SPLIT=v_split, IDX_AHEAD=bool(idx_ahead), QK_AHEAD=bool(qk_ahead), num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    if not direct and not fused_combine:
        launch_combine(part, lse, out, pdl)
    return out


def combine_grid(B: int, S: int, H: int, d_v: int, min_programs: int = 0) -> tuple[int, int, int]:
    """The merge kernel's grid for ``S`` splits: (column blocks, heads, requests), each program one [S_PAD, BLOCK_D]
    float32 tile of 32 values a thread; with ``min_programs``, narrower column blocks (down to 32 columns, fewer
    values a thread) until the grid has that many programs."""
    block_d = min(d_v, max(32, 4096 // triton.next_power_of_2(S)))
    while block_d > 32 and (d_v // block_d) * H * B < min_programs:
        block_d //= 2
    return d_v // block_d, H, B


def launch_combine(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, pdl: bool, min_programs: int = 0) -> None:
    """Merge the split partials ``part [B, S, H, d_v]`` (normalised; float32, or 16-bit from the wgmma kernel's
    ``PART16``, read and summed in float32) by their log-sum-exp ``lse [B, S, H]``
    (base 2) into ``out [B, H, d_v]``; ``pdl``: launched with programmatic dependent launch (it waits in-kernel for
    the grid that wrote the partials); ``min_programs``: see :func:`combine_grid`."""
    B, S, H, d_v = part.shape
    grid = combine_grid(B, S, H, d_v, min_programs)
    _combine_kernel[grid](
        part, lse, out, S,
        *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
        S_PAD=triton.next_power_of_2(S), BLOCK_D=d_v // grid[0], PDL=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}),
    )


def sparse_decode_simt(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    config: dict | None = None,
    *,
    d_v: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head baseline of :func:`sparse_decode` (config keys: BLOCK_T, num_warps)."""
    B, H, d_qk, d_v = _check_args(q, kv, indices, d_v, out)
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    shape = _shape_of(q, kv, indices, d_v)
    kernel = SparseDecodeSimtKernel.instance
    if config is None:
        config = tuned_config(kernel, shape, q.dtype, q.device)
    else:
        kernel.require_config(config, shape, q.device, q.dtype)
    DT, D_TAIL = _tail(d_qk, d_v)
    if out is None:
        out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    _sparse_decode_simt_kernel[(H, B)](
        q, kv, indices, out, kv.shape[0], topk, sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1),
        DV=d_v, DT=DT, D_TAIL=D_TAIL, BLOCK_T=config["BLOCK_T"], num_warps=config["num_warps"],
    )
    return out


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
    return (kv32 / scale[:, None]).to(_FP8), scale


# ----------------------------------------------------------------------------------------------------
# Tunable-kernel descriptions
# ----------------------------------------------------------------------------------------------------
def _pow2(x: int) -> bool:
    return x >= 1 and not x & (x - 1)


class _SparseDecodeBase(TunableKernel):
    batch_dim = "batch"

    def key_dims(self, shape):
        return {k: shape[k] for k in ("batch", "heads", "d_qk", "d_v", "topk")}

    def make_inputs(self, shape, dtype, device, seed=0):
        dev = torch.device(device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        B, H, d_qk, d_v = shape["batch"], shape["heads"], shape["d_qk"], shape["d_v"]
        topk, num_rows = shape["topk"], shape["num_rows"]
        dt = dtype_of(dtype)
        fp8 = dt == _FP8
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
        return {"q": q, "kv": kv, "indices": idx.to(device=device, dtype=torch.int32),
                "sm_scale": 1.0 / math.sqrt(d_qk), "d_v": d_v, "kv_scale": kv_scale}

    def output_like(self, inputs):
        q = inputs["q"]
        return torch.empty(q.shape[0], q.shape[1], inputs["d_v"], device=q.device, dtype=q.dtype)

    def reference(self, inputs):
        return sparse_decode_reference(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], inputs["d_v"],
                                       kv_scale=inputs.get("kv_scale"))

    def torch_baseline(self, inputs):
        return sparse_decode_torch(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], inputs["d_v"],
                                   kv_scale=inputs.get("kv_scale"))

    def tolerance(self, dtype):
        # an fp8 cache is compared with the float32 reference of its dequantised rows, so bf16 arithmetic bounds it
        return 2e-2 if dtype_of(dtype) == _FP8 else super().tolerance(dtype)

    def cost(self, shape, dtype="bfloat16"):
        """An fp8 cache moves one byte per value plus a float32 scale per row; q and out stay 16-bit."""
        dt = dtype_of(dtype)
        fp8 = dt == _FP8
        row_bytes = shape["d_qk"] + 4 if fp8 else shape["d_qk"] * dt.itemsize
        elt = 2 if fp8 else dt.itemsize
        B, H, d_qk, d_v, topk = (shape[k] for k in ("batch", "heads", "d_qk", "d_v", "topk"))
        rows = min(topk, shape.get("num_rows", topk) * 1)
        nbytes = B * rows * row_bytes + B * topk * 4 + B * H * d_qk * elt + B * H * d_v * elt
        flops = 2 * B * H * topk * (d_qk + d_v)
        return Cost(float(nbytes), float(flops))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":  # 64 heads, one shared 512 latent, top-512 compressed + 128-window rows
            return [{"batch": b, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536} for b in (1, 16, 64)]
        if preset == "v32":
            return [{"batch": b, "heads": 128, "d_qk": 576, "d_v": 512, "topk": 2048, "num_rows": 131072} for b in (1, 16, 64)]
        if preset == "test":
            return [{"batch": 3, "heads": 16, "d_qk": 64, "d_v": 64, "topk": 40, "num_rows": 97, "ragged": 1}]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash', 'v32' or 'test'")

    def _common_rules(self, config, shape):
        if not _pow2(shape["d_v"]) or shape["d_v"] < 16 or shape["d_v"] > shape["d_qk"]:
            return f"d_v: d_v={shape['d_v']} must be a power of two in [16, d_qk={shape['d_qk']}]"
        for key in ("BLOCK_T", "BLOCK_H"):
            if key in config and (not _pow2(config[key]) or config[key] < 16):
                return f"tile_size: {key}={config[key]} must be a power of two >= 16 (tl.dot)"
        if config.get("num_warps", 4) not in (1, 2, 4, 8, 16):
            return f"num_warps: {config['num_warps']} not a power of two <= 16"
        return None


class SparseDecodeKernel(_SparseDecodeBase):
    """MMA form with split-K: ``sparse_decode``."""

    name = "sparse_decode"
    instance: SparseDecodeKernel

    def default_config(self, shape):
        """16-head tiles and enough splits for about two programs per SM (132), one 64-row tile per split at
        most; 32-head tiles once 16-head tiles alone give more programs than SMs (each row is then read by half as
        many programs). H200, V4-Flash, 2026-11-30: 9.9 / 20.3 / 41.3 µs at batch 1 / 16 / 64
        against the sweep's best 9.5 / 20.2 / 38.9 (``benchmarks/results/kernels_issue20_h200.md``)."""
        B, H, topk = shape["batch"], shape["heads"], shape["topk"]
        block_t = 64  # 128 is often faster on an H200 but needs 256 KiB of shared memory in float32
        block_h = 32 if B * cdiv(H, 16) > 132 else 16
        programs = B * cdiv(H, block_h)
        tiles = cdiv(topk, block_t)
        S = 1
        while S < 32 and programs * S * 2 <= 264 and S < tiles:
            S *= 2
        return {"S": S, "BLOCK_H": block_h, "BLOCK_T": block_t, "num_warps": 4, "num_stages": 2}

    def adapt_config(self, config, tuned_shape, shape):
        """A config tuned at another batch keeps its tiles, warps and stages; its split count is set for this batch:
        the most splits of the space whose grid ``batch * ceil(heads / BLOCK_H) * splits`` (whole tiles,
        :func:`split_rows`) stays within one program an SM, S=1 where none does. Measured on an H200 (2026-12-01,
        ``sparse_decode_batches_h200_936ffa3.md``, every split count at batches 2-96 with the nearest key's tiles, bf16
        and fp8 caches): the rule picks the fastest split count in all 18 cases (fp8 batch 7: 23.6 µs, against 23.9
        at the next), where the nearest key's own count ran up to 1.33x slower (fp8 batch 32: 8 splits, 224 programs,
        49.0 µs against 36.7 at 4 splits and 128)."""
        if shape["batch"] == tuned_shape["batch"]:
            return config
        return {**config, "S": self.splits_in_one_wave(config, shape)}

    def splits_in_one_wave(self, config: dict, shape: dict) -> int:
        """The split count of the space giving the most splits (whole tiles: two counts may give the same; the smaller
        then) whose grid fits one program an SM (:func:`one_wave`), else 1."""
        sms = one_wave()
        per_split = shape["batch"] * cdiv(shape["heads"], config["BLOCK_H"])
        splits = {s: split_rows(shape["topk"], s, config["BLOCK_T"])[1] for s in self.config_space(shape)["S"]
                  if s <= shape["topk"]}
        fits = [s for s, n in splits.items() if per_split * n <= sms]
        return min(fits, key=lambda s: (-splits[s], s), default=1)

    def config_space(self, shape):
        # No 16 warps: tried 2026-11-30 (6e5fadf, tuner_efficiency_h200_issue20_sd2.json, all 552 configs at batch
        # 1/16/64, bf16 and fp8): never the best, its best 13-33% behind, and Nsight Compute read spills on 64-head
        # tiles (128 registers a thread is the cap at 512 threads) and barrier stalls (kernels_issue20_h200_ncu2.txt)
        return {"S": [1, 2, 4, 8, 16, 32], "BLOCK_H": [16, 32, 64], "BLOCK_T": [16, 32, 64, 128],
                "num_warps": [4, 8], "num_stages": [1, 2, 3]}

    def seed_configs(self, shape, device=None, dtype=None):
        """One wave: for each head tile (16, 32, 64) and row tile (64, 128), the split count whose grid
        ``batch * ceil(heads / BLOCK_H) * S`` is nearest to the SM count (log scale). On the H200 sweeps the best
        configs sit at such grids, while their tiles' average times look poor, which misleads a sampler that
        learns from averages (batch 64: best BLOCK_H=32, BLOCK_T=128, S=1 = 128 programs on 132 SMs)."""
        sms = device_limits(device)["sms"]
        B, H = shape["batch"], shape["heads"]
        splits = self.config_space(shape)["S"]
        default = self.default_config(shape)
        seeds: list[dict] = []
        for bh in (16, 32, 64):
            s = min(splits, key=lambda n: abs(math.log2(B * cdiv(H, bh) * n / sms)))
            for bt in (64, 128):
                c = {"S": s, "BLOCK_H": bh, "BLOCK_T": bt, "num_warps": 8 if bh == 64 else 4, "num_stages": 2}
                if c not in seeds and c != default and not self.check_config(c, shape, device, dtype):
                    seeds.append(c)
        return seeds

    def smem_bytes(self, config, shape, dtype="bfloat16"):
        """Shared-memory estimate, calibrated on the recorded H200 sweep: the gathered tile is
        multi-buffered (num_stages) only on the wgmma path (BLOCK_H >= 64); p goes through smem."""
        elt = 4 if dtype_of(dtype) == torch.float32 else 2
        dqk = shape["d_v"] + _tail(shape["d_qk"], shape["d_v"])[0]
        buffers = max(1, config["num_stages"]) if config["BLOCK_H"] >= 64 else 1
        return elt * (config["BLOCK_T"] * dqk * buffers + config["BLOCK_H"] * config["BLOCK_T"])

    def check_config(self, config, shape, device=None, dtype=None):
        dtype = dtype or "bfloat16"
        why = super().check_config(config, shape, device) or self._common_rules(config, shape)
        if why:
            return why
        if config["S"] > shape["topk"]:
            return f"split_rows: S={config['S']} > topk={shape['topk']} leaves empty splits"
        limits = device_limits(device)
        smem = self.smem_bytes(config, shape, dtype)
        if smem > limits["shared_memory"]:
            return f"shared_memory: {smem // 1024} KiB > {limits['shared_memory'] // 1024} KiB"
        acc_regs = config["BLOCK_H"] * shape["d_v"] // (32 * config["num_warps"])
        if acc_regs > limits["registers_per_thread"]:
            return (f"register_pressure: fp32 accumulator BLOCK_H*d_v/threads = {acc_regs} registers/thread "
                    f"> {limits['registers_per_thread']} (raise num_warps or lower BLOCK_H)")
        return None

    def run(self, inputs, config=None, out=None):
        return sparse_decode(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], config,
                             d_v=inputs["d_v"], out=out, kv_scale=inputs.get("kv_scale"))


class SparseDecodeSimtKernel(_SparseDecodeBase):
    """Per-head SIMT baseline: ``sparse_decode_simt``."""

    name = "sparse_decode_simt"
    instance: SparseDecodeSimtKernel

    def default_config(self, shape):
        return {"BLOCK_T": 16, "num_warps": 4}

    def config_space(self, shape):
        return {"BLOCK_T": [16, 32, 64], "num_warps": [2, 4, 8]}

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device) or self._common_rules(config, shape)
        if why:
            return why
        regs = config["BLOCK_T"] * shape["d_v"] // (32 * config["num_warps"])
        if regs > 128:
            return f"register_pressure: fp32 tile BLOCK_T*d_v/threads = {regs} registers/thread > 128"
        return None

    def run(self, inputs, config=None, out=None):
        return sparse_decode_simt(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], config,
                                  d_v=inputs["d_v"], out=out)


SparseDecodeKernel.instance = SparseDecodeKernel()
SparseDecodeSimtKernel.instance = SparseDecodeSimtKernel()
