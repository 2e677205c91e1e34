"""The Gluon device functions the wgmma kernel's schedules share: a tile's row numbers and its ``cp.async`` gather,
the program's split, the online softmax and O += P V, the result's stores, and the fp8 cache's staging helpers. The schedules themselves are in :mod:`.gluon_kernels`."""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon: sparse_decode_wgmma raises, the tl.dot kernel stays available
    HAVE_GLUON = False

__all__ = [
    "HAVE_GLUON",
    "async_load",
    "dequant_tile",
    "fp8_rows",
    "issue_fp8_tile",
    "issue_tile",
    "launch_merge_early",
    "online_softmax",
    "program_split",
    "softmax_pv",
    "thread_barrier",
    "tile_rows",
    "view",
    "write_result",
]

if HAVE_GLUON:
    # renamed between Triton 3.6 (the GPU image) and 3.9: the barrier, and the cp.async copy (the old name raises)
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

    @gluon.jit
    def launch_merge_early(PDL: gl.constexpr):
        """Programmatic dependent launch: the merge kernel (launched with ``launch_pdl``) may start now. It waits
        in-kernel (``gdc_wait``) for this whole grid to complete and its stores to land before it reads a partial, so
        only its launch and prologue overlap this kernel. Without it the merge starts as this grid's programs exit."""
        if PDL:
            gl.inline_asm_elementwise(
                "griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
            )

    @gluon.jit
    def tile_rows(idx_base, start, end, t, offs_t):
        """Tile ``t``'s row numbers (-1 past the split's end), in ``offs_t``'s layout."""
        ot = start + t * offs_t.shape[0] + offs_t
        return gl.load(idx_base + ot, mask=ot < end, other=-1)

    @gluon.jit
    def issue_tile(slot, kv_ptr, rows, num_rows, stride_kv, offs_d):
        """Start the ``cp.async`` copies of the rows ``rows`` into ``slot`` (zeros for padding rows); the caller
        commits the group."""
        valid = (rows >= 0) & (rows < num_rows)
        safe = gl.where(valid, rows, 0).to(gl.int64)
        async_load(slot, kv_ptr + safe[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None])

    @gluon.jit
    def program_split(rows_per_split, topk, BLOCK_T: gl.constexpr, V_SPLIT: gl.constexpr, DO: gl.constexpr):
        """This program's (split, request, first column of V, first row, end row, tiles). The V_SPLIT programs of a
        split are neighbours: they run together and the second one's gathers hit L2. Every split but the last starts
        at a multiple of BLOCK_T (whole tiles)."""
        pid_s = gl.program_id(0) // V_SPLIT
        pid_b = gl.program_id(1)
        col_off = (gl.program_id(0) % V_SPLIT) * DO
        start = pid_s * rows_per_split
        end = gl.minimum(start + rows_per_split, topk)
        return pid_s, pid_b, col_off, start, end, gl.cdiv(end - start, BLOCK_T)

    @gluon.jit
    def online_softmax(s, valid, qk_scale, m_i, scl=None, KV_SCALED: gl.constexpr = False):
        """One tile's raw scores ``s`` (padding rows masked to -inf) against the running row max ``m_i``: the
        probabilities P (base 2), the factor ``alpha`` that rescales what was summed before, and the new max.
        ``KV_SCALED``: the tile's rows are an fp8 cache's, widened without their scales ``scl`` (one a row, in the
        scores' column layout), which multiply the scores here."""
        if KV_SCALED:
            s = gl.where(valid[None, :], s * (scl * qk_scale)[None, :], float("-inf"))
        else:
            s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        return gl.exp2(s - m_safe[:, None]), gl.exp2(m_i - m_safe), m_new

    @gluon.jit
    def softmax_pv(
        s,
        valid,
        qk_scale,
        m_i,
        l_i,
        acc,
        v_tile,
        o_l: gl.constexpr,
        p_l: gl.constexpr,
        scl=None,
        KV_SCALED: gl.constexpr = False,
    ):
        """One tile's online softmax on its raw scores ``s`` (padding rows masked to -inf) and O += P V, P as wgmma's
        A from registers: the new (acc, m_i, l_i). ``KV_SCALED``: the rows' scales ``scl`` multiply the scores and,
        for the product with the unscaled V, the probabilities (not their row sum)."""
        p, alpha, m_new = online_softmax(s, valid, qk_scale, m_i, scl, KV_SCALED)
        l_i = l_i * alpha + gl.sum(p, 1)
        if KV_SCALED:
            p = p * scl[None, :]
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_l))
        acc = warpgroup_mma(gl.convert_layout(p.to(v_tile.dtype), p_l), v_tile, acc * alpha_o[:, None])
        return acc, m_new, l_i

    @gluon.jit
    def write_result(
        acc,
        m_i,
        l_i,
        part_ptr,
        lse_ptr,
        out_ptr,
        pid_b,
        pid_s,
        col_off,
        H,
        stride_pb,
        stride_ps,
        stride_ph,
        stride_lb,
        stride_ls,
        stride_ob,
        stride_oh,
        BLOCK_H: gl.constexpr,
        DO: gl.constexpr,
        DIRECT: gl.constexpr,
        STORE_CVT: gl.constexpr,
        s_l: gl.constexpr,
        o_l: gl.constexpr,
        NW: gl.constexpr,
    ):
        """The program's normalised output: straight into ``out`` with one split, else its float32 split-K partial and
        the log-sum-exp (base 2) of its heads (from the program with the split's first columns), for the merge
        kernel (:func:`kernels.sparse_decode_common.launch_combine`)."""
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_l))[:, None]
        o = o.to(out_ptr.dtype.element_ty if DIRECT else part_ptr.dtype.element_ty)
        if STORE_CVT:  # through shared memory into a layout where a warp writes whole rows, 16 bytes or more a thread
            st_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
            o = gl.convert_layout(o, st_l)
        else:  # from the wgmma layout: 8 (float32) or 4 (16-bit) bytes a thread, 4 threads a row
            st_l: gl.constexpr = o_l
        offs_ho = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_l))
        offs_c = col_off + gl.arange(0, DO, layout=gl.SliceLayout(0, st_l))
        h_mask = (offs_ho < H)[:, None]
        if DIRECT:
            gl.store(
                out_ptr + pid_b.to(gl.int64) * stride_ob + offs_ho[:, None] * stride_oh + offs_c[None, :],
                o,
                mask=h_mask,
            )
        else:
            gl.store(
                part_ptr
                + pid_b.to(gl.int64) * stride_pb
                + pid_s * stride_ps
                + offs_ho[:, None] * stride_ph
                + offs_c[None, :],
                o,
                mask=h_mask,
            )
            offs_hs = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_l))
            lse = gl.where(l_i > 0.0, m_i + gl.log2(l_safe), float("-inf"))
            gl.store(
                lse_ptr + pid_b.to(gl.int64) * stride_lb + pid_s * stride_ls + offs_hs,
                lse,
                mask=(offs_hs < H) & (col_off == 0),
            )  # one of the V_SPLIT programs (they computed the same)

    @gluon.jit
    def fp8_rows(idx_base, idx_smem, start, end, t, offs, IDX_TILES: gl.constexpr, LAYOUT: gl.constexpr):
        """Tile ``t``'s row numbers in ``offs``' layout (``LAYOUT``): from the producer's index table (past its last
        tile, the last tile's: such rows are never copied), or from DRAM (-1 past the split's end)."""
        if IDX_TILES > 0:
            rows = idx_smem.index(gl.minimum(t, IDX_TILES - 1)).load(LAYOUT)
        else:
            rows = tile_rows(idx_base, start, end, t, offs)
        return rows

    @gluon.jit
    def issue_fp8_tile(stage, sc_stage, kv_ptr, scale_ptr, rows, rows_s, num_rows, stride_kv, offs_d):
        """Start the ``cp.async`` copies of an fp8 tile's rows into ``stage`` and of their scales into ``sc_stage``
        (zeros for padding rows); the caller commits the group."""
        issue_tile(stage, kv_ptr, rows, num_rows, stride_kv, offs_d)
        valid = (rows_s >= 0) & (rows_s < num_rows)
        async_load(sc_stage, scale_ptr + gl.where(valid, rows_s, 0).to(gl.int64), mask=valid)

    @gluon.jit
    def dequant_tile(stage, sc_stage, dst, dst_sc, BLOCK_T: gl.constexpr, DV: gl.constexpr, GATHER_WARPS: gl.constexpr):
        """Widen a landed fp8 tile to the ring's float16 (exact: e4m3 is a subset, one ``cvt`` for two values), 64
        columns at a time, and hand its rows' scales to the ring slot's scale row (the consumers apply them to the
        scores and the probabilities: no multiply here)."""
        CH: gl.constexpr = 64
        cv_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [GATHER_WARPS, 1], [1, 0])
        sc_l: gl.constexpr = gl.BlockedLayout([1], [32], [GATHER_WARPS], [0])
        dst_sc.store(sc_stage.load(sc_l))
        for c in gl.static_range(DV // CH):
            x = stage.slice(c * CH, CH, dim=1).load(cv_l)
            dst.slice(c * CH, CH, dim=1).store(x.to(dst.dtype))

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.9

        @gluon.jit
        def view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The shared buffer ``buf`` seen as ``dtype`` of ``shape`` in ``layout`` (no more bytes than it has)."""
            return buf.reinterpret(dtype, shape, layout)
    else:  # Triton 3.6 (the GPU image)

        @gluon.jit
        def view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The shared buffer ``buf`` seen as ``dtype`` of ``shape`` in ``layout`` (no more bytes than it has)."""
            return buf._reinterpret(dtype, shape, layout)
