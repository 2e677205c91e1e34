"""The sparse decode kernel as it was before issue 20 (kernels/sparse_decode.py at commit f4eeb51), frozen.

Kept so that ``benchmarks/kernels.py`` measures the new kernel and this one side by side in one run: the gain is a
ratio of two timings of the same inputs on the same GPU, not of figures from different runs. Only the kernels and a
launcher are kept (no config lookup: the caller passes a config of S, BLOCK_H, BLOCK_T, num_warps, num_stages).
Not imported by ``kernels/``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["sparse_decode_v1"]

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["B", "num_rows", "topk", "rows_per_split", "n_splits"])
def _sparse_decode_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    part_ptr,
    lse_ptr,
    out_ptr,
    lock_ptr,
    B,
    H,
    num_rows,
    topk,
    rows_per_split,
    n_splits,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kv,
    stride_ib,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    stride_ob,
    stride_oh,
    DV: tl.constexpr,
    DT: tl.constexpr,
    D_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DIRECT: tl.constexpr,
    FUSED_COMBINE: tl.constexpr,
):
    pid_h = tl.program_id(0)  # fastest: head blocks of one (request, split) run together, share L2
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2)

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_d = tl.arange(0, DV)
    q_base = q_ptr + pid_b.to(tl.int64) * stride_qb + offs_h[:, None] * stride_qh
    q = tl.load(q_base + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    if DT > 0:
        offs_e = tl.arange(0, DT)
        e_mask = offs_e < D_TAIL
        q_tail = tl.load(q_base + DV + offs_e[None, :], mask=h_mask[:, None] & e_mask[None, :], other=0.0)

    start = pid_s * rows_per_split
    end = tl.minimum(start + rows_per_split, topk)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    idx_base = idx_ptr + pid_b.to(tl.int64) * stride_ib
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        rows = tl.load(idx_base + offs_t, mask=offs_t < end, other=-1)
        valid = (rows >= 0) & (rows < num_rows)
        row_ptr = kv_ptr + tl.where(valid, rows, 0).to(tl.int64)[:, None] * stride_kv
        kv = tl.load(row_ptr + offs_d[None, :], mask=valid[:, None], other=0.0)  # [BLOCK_T, DV]: K and V
        s = tl.dot(q, tl.trans(kv))
        if DT > 0:
            k_tail = tl.load(row_ptr + DV + offs_e[None, :], mask=valid[:, None] & e_mask[None, :], other=0.0)
            s += tl.dot(q_tail, tl.trans(k_tail))
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if DIRECT:
        out_ptrs = out_ptr + pid_b.to(tl.int64) * stride_ob + offs_h[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
    else:
        part_ptrs = (
            part_ptr
            + pid_b.to(tl.int64) * stride_pb
            + pid_s * stride_ps
            + offs_h[:, None] * stride_ph
            + offs_d[None, :]
        )
        tl.store(part_ptrs, o, mask=h_mask[:, None])
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(lse_ptr + pid_b.to(tl.int64) * stride_lb + pid_s * stride_ls + offs_h, lse, mask=h_mask)
        if FUSED_COMBINE:
            # The last split of this (request, head block) to finish merges all splits: no second
            # launch. Barrier, then a gpu-scope acq_rel atomic publishes this CTA's partial stores
            # (the split-K semaphore pattern of CUTLASS and Triton's layer-norm tutorial).
            tl.debug_barrier()
            lock = lock_ptr + pid_b * tl.num_programs(0) + pid_h
            done = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:
                _merge_splits(
                    part_ptr + pid_b.to(tl.int64) * stride_pb,
                    lse_ptr + pid_b.to(tl.int64) * stride_lb,
                    out_ptr + pid_b.to(tl.int64) * stride_ob,
                    offs_h,
                    h_mask,
                    offs_d,
                    n_splits,
                    stride_ps,
                    stride_ph,
                    stride_ls,
                    stride_oh,
                    BLOCK_H,
                    DV,
                    ".cg",
                )
                tl.atomic_xchg(lock, 0)  # ready for the next call (CUDA-graph replays reuse the counters)


@triton.jit
def _merge_splits(
    part_base,
    lse_base,
    out_base,
    offs_h,
    h_mask,
    offs_d,
    n_splits,
    stride_ps,
    stride_ph,
    stride_ls,
    stride_oh,
    BLOCK_H: tl.constexpr,
    DV: tl.constexpr,
    CACHE: tl.constexpr,
):
    """out = sum_s 2^(lse_s - m) * o_s / sum_s 2^(lse_s - m), m = max_s lse_s (zeros if all -inf)."""
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(n_splits):
        m = tl.maximum(
            m, tl.load(lse_base + s * stride_ls + offs_h, mask=h_mask, other=float("-inf"), cache_modifier=CACHE)
        )
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    wsum = tl.zeros([BLOCK_H], tl.float32)
    for s in range(n_splits):
        w = tl.exp2(
            tl.load(lse_base + s * stride_ls + offs_h, mask=h_mask, other=float("-inf"), cache_modifier=CACHE) - m_safe
        )
        acc += w[:, None] * tl.load(
            part_base + s * stride_ps + offs_h[:, None] * stride_ph + offs_d[None, :],
            mask=h_mask[:, None],
            other=0.0,
            cache_modifier=CACHE,
        )
        wsum += w
    o = acc / tl.where(wsum > 0.0, wsum, 1.0)[:, None]
    tl.store(
        out_base + offs_h[:, None] * stride_oh + offs_d[None, :], o.to(out_base.dtype.element_ty), mask=h_mask[:, None]
    )


@triton.jit(do_not_specialize=["S"])
def _combine_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    H,
    S,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    stride_ob,
    stride_oh,
    DV: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Merge S partial results by their log-sum-exp (base 2): the unfused second pass."""
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    _merge_splits(
        part_ptr + pid_b.to(tl.int64) * stride_pb,
        lse_ptr + pid_b.to(tl.int64) * stride_lb,
        out_ptr + pid_b.to(tl.int64) * stride_ob,
        offs_h,
        offs_h < H,
        tl.arange(0, DV),
        S,
        stride_ps,
        stride_ph,
        stride_ls,
        stride_oh,
        BLOCK_H,
        DV,
        "",
    )


def sparse_decode_v1(q, kv, indices, sm_scale=None, config=None, *, d_v=None):
    """The old launcher: split-K main kernel, then the 4-head combine kernel looping over splits."""
    B, H, d_qk = q.shape
    d_v = d_qk if d_v is None else d_v
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    BLOCK_H, BLOCK_T = config["BLOCK_H"], config["BLOCK_T"]
    rows_per_split = triton.cdiv(topk, min(config["S"], topk))
    S = triton.cdiv(topk, rows_per_split)
    d_tail = d_qk - d_v
    DT, D_TAIL = (0, 0) if d_tail == 0 else (max(16, triton.next_power_of_2(d_tail)), d_tail)
    out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    direct = S == 1
    if direct:
        part, lse = out, out
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((B, S, H, d_v), device=q.device, dtype=torch.float32)
        lse = torch.empty((B, S, H), device=q.device, dtype=torch.float32)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    _sparse_decode_kernel[(triton.cdiv(H, BLOCK_H), S, B)](
        q,
        kv,
        indices,
        part,
        lse,
        out,
        indices,
        B,
        H,
        kv.shape[0],
        topk,
        rows_per_split,
        S,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        indices.stride(0),
        *part_strides,
        *lse_strides,
        out.stride(0),
        out.stride(1),
        DV=d_v,
        DT=DT,
        D_TAIL=D_TAIL,
        BLOCK_H=BLOCK_H,
        BLOCK_T=BLOCK_T,
        DIRECT=direct,
        FUSED_COMBINE=False,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    if not direct:
        _combine_kernel[(triton.cdiv(H, 4), B)](
            part,
            lse,
            out,
            H,
            S,
            *part.stride()[:3],
            *lse.stride()[:2],
            out.stride(0),
            out.stride(1),
            DV=d_v,
            BLOCK_H=4,
            num_warps=4,
        )
    return out
