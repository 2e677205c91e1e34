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
column block) in one load: ``heads * d_v / BLOCK_D`` programs per request, so the merge stays small beside the
attention at every split count (``benchmarks/results/kernels/h200/2026-11-30_6462420_issue20.md``). The merge kernel is launched with
programmatic dependent launch where the GPU has it (Hopper): its launch overlaps the split kernel and it waits
in-kernel (``gdc_wait``) for that grid's stores. With ``S == 1`` the first kernel writes the output
directly.

The cache may be float8 e4m3 with one float32 scale per row (``kv_scale``): the rows are widened to
q's dtype in registers (exact) and the scales multiply the [heads, rows] score and probability tiles,
so the tensor-core math stays bf16/fp16.

``d_v`` must be a power of two (512); ``d_qk - d_v`` (0 for V4-Flash, 64 for V3.2's rope part) is
handled as a separate, padded "tail" dot.

Tunables: S, BLOCK_H, BLOCK_T, num_warps, num_stages (:meth:`SparseDecodeKernel.default_config` gives the shipped
choice and why). Slower paths that were measured and removed: ``benchmarks/results/sparse_decode_history.md``. ``sparse_decode_simt`` is the per-head
baseline: one program per (request, head), no tensor cores, every head re-reads its rows.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .base import cdiv, device_limits, dtype_of, gpu_target
from .configs import tuned_config
from .sparse_decode_common import (
    LOG2E,
    PDL,
    SparseDecodeBase,
    check_args,
    combine_grid,
    gdc_launch_dependents,
    launch_combine,
    one_wave,
    quantize_kv_fp8,
    shape_of,
    sparse_decode_reference,
    sparse_decode_torch,
    split_rows,
    tail_width,
)

# the shared helpers callers import from here: re-exported
__all__ = [
    "SparseDecodeKernel",
    "SparseDecodeSimtKernel",
    "combine_grid",
    "launch_combine",
    "one_wave",
    "quantize_kv_fp8",
    "shape_of",
    "sparse_decode",
    "sparse_decode_reference",
    "sparse_decode_simt",
    "sparse_decode_torch",
    "split_rows",
]


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the lines of ``ptrs`` without waiting (PTX ``prefetch.global.L2``); returns a dummy."""
    return tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit(do_not_specialize=["B", "num_rows", "n_splits"])
def _sparse_decode_kernel(
    q_ptr,
    kv_ptr,
    kv_scale_ptr,
    idx_ptr,
    part_ptr,
    lse_ptr,
    out_ptr,
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
    KV_SCALED: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    # fastest: the head blocks of one (request, split): they read the same rows, share L2
    pid_h = tl.program_id(0)
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

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        rows = tl.load(idx_base + offs_t, mask=offs_t < end, other=-1)
        valid = (rows >= 0) & (rows < num_rows)
        safe = tl.where(valid, rows, 0).to(tl.int64)
        row_ptr = kv_ptr + safe[:, None] * stride_kv
        kv = tl.load(row_ptr + offs_d[None, :], mask=valid[:, None], other=0.0)  # [BLOCK_T, DV]: K and V
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
        acc = tl.dot(p.to(q.dtype), kv, acc * alpha[:, None])
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


@triton.jit(do_not_specialize=["num_rows", "topk"])
def _sparse_decode_simt_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    num_rows,
    topk,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kv,
    stride_ib,
    stride_ob,
    stride_oh,
    DV: tl.constexpr,
    DT: tl.constexpr,
    D_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr,
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
    pdl: bool | None = None,
) -> torch.Tensor:
    """Sparse MQA decode attention; returns ``[batch, heads, d_v]`` in ``q.dtype``.

    ``kv`` in ``q.dtype``, or in float8 e4m3 with ``kv_scale`` (float32 ``[num_rows]``, row r holds
    ``kv[r] * kv_scale[r]``): half the bytes of a bf16 cache, same bf16 tensor-core math (the fp8 values
    widen exactly; the row scales multiply the [heads, rows] score and probability tiles).
    ``config`` keys: S, BLOCK_H, BLOCK_T, num_warps, num_stages; None looks up the tuned config
    (``kernels.configs.lookup``, cached per shape, keyed by the kv dtype) or the default. S is an upper bound:
    see :func:`split_rows`.
    ``pdl``: launch the merge kernel with programmatic dependent launch (its launch overlaps the split kernel; it
    waits for that grid before reading), None = wherever the GPU supports it (compute capability 9.0 and up).
    """
    B, H, d_qk, d_v = check_args(q, kv, indices, d_v, out, kv_scale)
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    shape = shape_of(q, kv, indices, d_v)
    kernel = SparseDecodeKernel.instance
    if config is None:
        config = tuned_config(kernel, shape, kv.dtype, q.device)
    else:
        kernel.require_config(config, shape, q.device, kv.dtype)
    BLOCK_H, BLOCK_T = config["BLOCK_H"], config["BLOCK_T"]
    rows_per_split, S = split_rows(topk, config["S"], BLOCK_T)
    DT, D_TAIL = tail_width(d_qk, d_v)
    if out is None:
        out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    direct = S == 1
    if direct:
        part, lse = out, out  # unused
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((B, S, H, d_v), device=q.device, dtype=torch.float32)
        lse = torch.empty((B, S, H), device=q.device, dtype=torch.float32)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    target = gpu_target(q.device)  # meta tensors in a compile helper answer the GPU's: same binary as a real launch
    on_gpu = target is not None
    if pdl is None:
        pdl = on_gpu and PDL and target >= (9, 0)
    pdl = bool(pdl) and on_gpu and not direct
    grid = (cdiv(H, BLOCK_H), S, B)
    _sparse_decode_kernel[grid](
        q,
        kv,
        kv if kv_scale is None else kv_scale,
        indices,
        part,
        lse,
        out,
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
        KV_SCALED=kv_scale is not None,
        PREFETCH=on_gpu,
        PDL=pdl,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    if not direct:
        launch_combine(part, lse, out, pdl)
    return out


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
    B, H, d_qk, d_v = check_args(q, kv, indices, d_v, out)
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    shape = shape_of(q, kv, indices, d_v)
    kernel = SparseDecodeSimtKernel.instance
    if config is None:
        config = tuned_config(kernel, shape, q.dtype, q.device)
    else:
        kernel.require_config(config, shape, q.device, q.dtype)
    DT, D_TAIL = tail_width(d_qk, d_v)
    if out is None:
        out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    _sparse_decode_simt_kernel[(H, B)](
        q,
        kv,
        indices,
        out,
        kv.shape[0],
        topk,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        indices.stride(0),
        out.stride(0),
        out.stride(1),
        DV=d_v,
        DT=DT,
        D_TAIL=D_TAIL,
        BLOCK_T=config["BLOCK_T"],
        num_warps=config["num_warps"],
    )
    return out


# ----------------------------------------------------------------------------------------------------
# Tunable-kernel descriptions
# ----------------------------------------------------------------------------------------------------
class SparseDecodeKernel(SparseDecodeBase):
    """MMA form with split-K: ``sparse_decode``."""

    name = "sparse_decode"
    instance: SparseDecodeKernel

    def default_config(self, shape):
        """16-head tiles and enough splits for about two programs per SM (:func:`one_wave`: 132 on an H200), one
        64-row tile per split at most; 32-head tiles once 16-head tiles alone give more programs than SMs (each row
        is then read by half as many programs); within a few percent of the H200 sweep's best at V4-Flash's batches
        (``benchmarks/results/kernels/h200/2026-11-30_6462420_issue20.md``)."""
        B, H, topk = shape["batch"], shape["heads"], shape["topk"]
        block_t = 64  # 128 is often faster on an H200 but needs 256 KiB of shared memory in float32
        sms = one_wave()
        block_h = 32 if B * cdiv(H, 16) > sms else 16
        programs = B * cdiv(H, block_h)
        tiles = cdiv(topk, block_t)
        S = 1
        while S < 32 and programs * S * 2 <= 2 * sms and S < tiles:  # doubled, the grid stays within two an SM
            S *= 2
        return {"S": S, "BLOCK_H": block_h, "BLOCK_T": block_t, "num_warps": 4, "num_stages": 2}

    def adapt_config(self, config, tuned_shape, shape):
        """A config tuned at another batch keeps its tiles, warps and stages; its split count is set for this batch:
        the most splits of the space whose grid ``batch * ceil(heads / BLOCK_H) * splits`` (whole tiles,
        :func:`split_rows`) stays within one program an SM, S=1 where none does: the fastest split count at every
        batch the H200 measured, bf16 and fp8, where the nearest key's own count was slower
        (``benchmarks/results/sparse_decode_batches/h200/2026-12-01_936ffa3.md``)."""
        if shape["batch"] == tuned_shape["batch"]:
            return config
        return {**config, "S": self.splits_in_one_wave(config, shape)}

    def splits_in_one_wave(self, config: dict, shape: dict) -> int:
        """The split count of the space giving the most splits (whole tiles: two counts may give the same; the smaller
        then) whose grid fits one program an SM (:func:`one_wave`), else 1."""
        sms = one_wave()
        per_split = shape["batch"] * cdiv(shape["heads"], config["BLOCK_H"])
        splits = {
            s: split_rows(shape["topk"], s, config["BLOCK_T"])[1]
            for s in self.config_space(shape)["S"]
            if s <= shape["topk"]
        }
        fits = [s for s, n in splits.items() if per_split * n <= sms]
        return min(fits, key=lambda s: (-splits[s], s), default=1)

    def config_space(self, shape):
        # No 16 warps: never the best on the H200 (spills on 64-head tiles at 512 threads, barrier stalls;
        # benchmarks/results/tuner_efficiency/h200/2026-11-30_6e5fadf_issue20_sd2.json.gz)
        return {
            "S": [1, 2, 4, 8, 16, 32],
            "BLOCK_H": [16, 32, 64],
            "BLOCK_T": [16, 32, 64, 128],
            "num_warps": [4, 8],
            "num_stages": [1, 2, 3],
        }

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
        dqk = shape["d_v"] + tail_width(shape["d_qk"], shape["d_v"])[0]
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
            return (
                f"register_pressure: fp32 accumulator BLOCK_H*d_v/threads = {acc_regs} registers/thread "
                f"> {limits['registers_per_thread']} (raise num_warps or lower BLOCK_H)"
            )
        return None

    def run(self, inputs, config=None, out=None):
        return sparse_decode(
            inputs["q"],
            inputs["kv"],
            inputs["indices"],
            inputs["sm_scale"],
            config,
            d_v=inputs["d_v"],
            out=out,
            kv_scale=inputs.get("kv_scale"),
        )


class SparseDecodeSimtKernel(SparseDecodeBase):
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
        return sparse_decode_simt(
            inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], config, d_v=inputs["d_v"], out=out
        )


SparseDecodeKernel.instance = SparseDecodeKernel()
SparseDecodeSimtKernel.instance = SparseDecodeSimtKernel()
