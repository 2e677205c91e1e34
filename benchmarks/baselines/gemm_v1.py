"""The skinny GEMM kernel as it was before its tiles were known to be 16-byte aligned (kernels/gemm.py at commit
ae13479), frozen.

Each split's first K index, ``pid_k * k_per_split``, comes from an unspecialised argument, so the compiler could not
prove the W tile's alignment: it read W two bytes at a time with no cp.async pipeline (sm_90 PTX, triton 3.6). Kept
so that ``benchmarks/kernels.py`` times this kernel and the fixed one side by side in one run. The launcher is a
copy of ``kernels.gemm.gemm``'s at that commit, without the config lookup (the caller passes a config); the split-K
reduce kernel and the argument checks are imported (unchanged since). Not imported by ``kernels/``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gemm import _check, _mode, _split_k_reduce_kernel, _tile_counters

__all__ = ["gemm_v1"]


@triton.jit(do_not_specialize=["M", "k_per_split", "n_splits"])
def _gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    xs_ptr,
    ws_ptr,
    p_ptr,
    lock_ptr,
    M,
    N,
    K,
    k_per_split,
    n_splits,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,
    stride_ps,
    stride_xs,
    stride_ws,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SPLIT: tl.constexpr,
    FUSED: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row blocks share each W column block while it sits in L2
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_xm = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)  # wrap: no row masks
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    k_start = pid_k * k_per_split
    offs_k = k_start + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_wn[None, :] * stride_wn + offs_k[:, None] * stride_wk  # W.T tile [BLOCK_K, BLOCK_N]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_mask = (k0 + tl.arange(0, BLOCK_K)) < K
            a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    if HAS_SCALE:  # one scale per row of x and per row of w (stride 1), or one per tensor (stride 0)
        acc = acc * (tl.load(xs_ptr + offs_xm * stride_xs)[:, None] * tl.load(ws_ptr + offs_wn * stride_ws)[None, :])
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    if SPLIT:
        tl.store(p_ptr + pid_k * stride_ps + tile, acc, mask=mask)  # float32 partial of this split
        if FUSED:
            # last split of this output tile to finish sums the partials (semaphore pattern, as in
            # sparse_decode): no second launch, and the counter is reset for the next call
            tl.debug_barrier()
            done = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(n_splits):
                    total += tl.load(p_ptr + s * stride_ps + tile, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + tile, total.to(y_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(lock_ptr + pid, 0)
    else:
        tl.store(y_ptr + tile, acc.to(y_ptr.dtype.element_ty), mask=mask)


def gemm_v1(x: torch.Tensor, w: torch.Tensor, dtype: str, config: dict, *, x_scale=None, w_scale=None) -> torch.Tensor:
    """``x @ w.T`` by the frozen kernel at ``config`` (fused split-K for M <= 16, as ``kernels.gemm.gemm`` runs it)."""
    mode = _mode(dtype)
    M, N, K, out_dt = _check(x, w, mode, x_scale, w_scale, None)
    out = torch.empty((M, N), device=x.device, dtype=out_dt)
    fused = M <= 16
    BM, BN, BK, SK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    k_per_split = triton.cdiv(K, SK * BK) * BK
    SK = triton.cdiv(K, k_per_split)
    n_tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    partial = out if SK == 1 else torch.empty((SK, M, N), device=x.device, dtype=torch.float32)
    locks = _tile_counters(x.device, n_tiles) if SK > 1 and fused else x
    scale_a = x_scale.reshape(-1).contiguous() if x_scale is not None else x
    scale_b = w_scale.reshape(-1).contiguous() if w_scale is not None else w
    xs_stride = 1 if x_scale is not None and x_scale.numel() > 1 else 0
    ws_stride = 1 if w_scale is not None and w_scale.numel() > 1 else 0
    _gemm_kernel[(n_tiles, SK)](
        x,
        w,
        out,
        scale_a,
        scale_b,
        partial,
        locks,
        M,
        N,
        K,
        k_per_split,
        SK,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        out.stride(1),
        partial.stride(0),
        xs_stride,
        ws_stride,
        BLOCK_M=BM,
        BLOCK_N=BN,
        BLOCK_K=BK,
        GROUP_M=config["GROUP_M"],
        EVEN_K=(K % (SK * BK) == 0 and k_per_split * SK == K),
        IEEE=(mode == "fp32"),
        HAS_SCALE=(mode == "fp8"),
        SPLIT=SK > 1,
        FUSED=fused,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    if SK > 1 and not fused:
        block = 1024
        _split_k_reduce_kernel[(triton.cdiv(M * N, block),)](partial, out, M * N, SPLIT_K=SK, BLOCK=block, num_warps=4)
    return out
