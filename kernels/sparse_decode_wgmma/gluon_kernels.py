"""The wgmma kernel's two launchable schedules (see the package docstring): the single-partition kernel (``WS=0``),
and the warp-specialised one (``WS=1``), whose producer warpgroup gathers while two consumer warpgroups compute,
each tile both (WS) or alternate whole tiles (``SPLIT_WG``, the batch-64 default)."""

from __future__ import annotations

from .gluon_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_parts import (
        async_load,
        dequant_tile,
        fp8_rows,
        issue_fp8_tile,
        issue_tile,
        launch_merge_early,
        program_split,
        softmax_pv,
        thread_barrier,
        tile_rows,
        view,
        write_result,
    )

if HAVE_GLUON:

    @gluon.jit
    def sparse_decode_wgmma_kernel(
        q_ptr,
        kv_ptr,
        idx_ptr,
        part_ptr,
        lse_ptr,
        out_ptr,
        H,
        num_rows,
        topk,
        rows_per_split,
        qk_scale,
        n_splits,
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
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        DIRECT: gl.constexpr,
        V_SPLIT: gl.constexpr,
        STORE_CVT: gl.constexpr,
        PDL: gl.constexpr = False,
    ):
        gl.static_assert(BLOCK_H == 64, "one wgmma M of heads per program")
        launch_merge_early(PDL)
        gl.static_assert(DV == 512, "two warpgroups of 256 columns of V")
        gl.static_assert(STAGES >= 2, "a ring of at least two slots")
        gl.static_assert(
            V_SPLIT == 1 or V_SPLIT == 2 or V_SPLIT == 4 or V_SPLIT == 8, "all of V's columns, or 1/2, 1/4, 1/8"
        )
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        DO: gl.constexpr = DV // V_SPLIT  # the output columns this program computes
        pid_s, pid_b, col_off, start, end, n_tiles = program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)

        # layouts: a coalesced 16-byte-a-thread blocked layout for the copies, wgmma's for the two products (4 warps
        # along the heads, the two warpgroups side by side along the columns), 128-byte swizzled shared tiles
        copy_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_T // 2, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DO // 2, 16]
        )
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        tile_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_t = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, copy_l))  # a tile's rows, as the copies take them
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))  # ... and as the scores' columns
        offs_d = gl.arange(0, DV, layout=gl.SliceLayout(0, copy_l))
        if V_SPLIT > 1:
            # q and every row are copied rotated by this program's first column: q K^T does not change (the same
            # permutation of both operands' columns), and this program's columns of V are the tile's first DO
            # (col_off is a multiple of DO by construction, so the compiler keeps the copies 16 bytes wide)
            offs_d = (offs_d + col_off) % DV

        # q first, as its own group of copies: its DRAM round trip overlaps the index loads and the first gathers
        offs_hq = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, copy_l))
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DV], tile_sl)
        async_load(
            q_smem,
            q_ptr + pid_b.to(gl.int64) * stride_qb + offs_hq[:, None] * stride_qh + offs_d[None, :],
            mask=(offs_hq < H)[:, None],
        )
        async_copy.commit_group()
        kv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_T, DV], tile_sl)
        for i in gl.static_range(STAGES - 1):  # the first tiles' gathers
            if i < n_tiles:
                issue_tile(
                    kv_smem.index(i), kv_ptr, tile_rows(idx_base, start, end, i, offs_t), num_rows, stride_kv, offs_d
                )
            async_copy.commit_group()
        # indices run one tile ahead of their use (loop-carried), so no gather waits for its indices' DRAM round trip
        rows_c = tile_rows(idx_base, start, end, STAGES - 1, offs_t)  # the next tile to gather
        rows_v = tile_rows(idx_base, start, end, 0, offs_ts)  # the tile to compute, for its padding mask

        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        for t in range(n_tiles):
            async_copy.wait_group(STAGES - 2)  # this thread's copies of tile t (and of q, before tile 0) have landed
            fence_async_shared()  # ... and are visible to the tensor cores' (async proxy) reads
            thread_barrier()  # every thread's copies of tile t, and every warp is done with tile t - 1's slot
            tile = kv_smem.index(t % STAGES)
            v_tile = tile if V_SPLIT == 1 else tile.slice(0, DO, dim=1)
            s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            nxt = t + STAGES - 1  # its gather is issued while the tensor cores compute this tile's scores
            if nxt < n_tiles:
                issue_tile(kv_smem.index(nxt % STAGES), kv_ptr, rows_c, num_rows, stride_kv, offs_d)
            async_copy.commit_group()
            rows_c = tile_rows(idx_base, start, end, nxt + 1, offs_t)
            valid = (rows_v >= 0) & (rows_v < num_rows)
            rows_v = tile_rows(idx_base, start, end, t + 1, offs_ts)
            s = warpgroup_mma_wait(0, deps=[s_tok])
            acc, m_i, l_i = softmax_pv(s, valid, qk_scale, m_i, l_i, acc, v_tile, o_l, p_l)
        async_copy.wait_group(0)  # no copy outlives the program (the ring's last slots: padding rows, zeros)

        write_result(
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
            BLOCK_H,
            DO,
            DIRECT,
            STORE_CVT,
            s_l,
            o_l,
            8,
        )

    @gluon.jit
    def _ws_gather_fp8(
        kv_ptr,
        scale_ptr,
        idx_base,
        q_smem,
        q_bar,
        kv_smem,
        stage_smem,
        sc_smem,
        sc_ring,
        ready,
        empty,
        idx_smem,
        start,
        end,
        n_tiles,
        num_rows,
        stride_kv,
        col_off,
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        V_SPLIT: gl.constexpr,
        GATHER_WARPS: gl.constexpr,
        IDX_TILES: gl.constexpr,
        FP8_STAGES: gl.constexpr,
    ):
        """The producer's loop for an fp8 cache: each tile's rows (512 bytes each) and their float32 scales are copied
        by ``cp.async`` into a staging ring of ``FP8_STAGES`` slots, ``FP8_STAGES - 1`` tiles ahead; once a tile has
        landed the producer widens it (:func:`dequant_tile`) into the float16 ring slot the consumers released, with
        the rows' scales beside it, and arrives on its ``ready`` barrier (one arrival, after the partition's barrier).
        Before the first tile it widens q (its bf16 or fp16 copies, the first group) to float16 in place and arrives
        on ``q_bar``. The consumers see a float16 tile (exact: e4m3 is a subset) and apply the scales: half the bytes
        of a 16-bit cache leave DRAM."""
        c8_l: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [GATHER_WARPS, 1], [1, 0])  # 16 fp8 a thread
        sc_l: gl.constexpr = gl.BlockedLayout([1], [32], [GATHER_WARPS], [0])
        rl: gl.constexpr = gl.SliceLayout(1, c8_l)
        offs_t = gl.arange(0, BLOCK_T, layout=rl)
        offs_s = gl.arange(0, BLOCK_T, layout=sc_l)
        offs_d = gl.arange(0, DV, layout=gl.SliceLayout(0, c8_l))
        if V_SPLIT > 1:  # rotated as the 16-bit copies are
            offs_d = (offs_d + col_off) % DV
        for i in gl.static_range(FP8_STAGES - 1):
            if i < n_tiles:
                issue_fp8_tile(
                    stage_smem.index(i),
                    sc_smem.index(i),
                    kv_ptr,
                    scale_ptr,
                    fp8_rows(idx_base, idx_smem, start, end, i, offs_t, IDX_TILES, rl),
                    fp8_rows(idx_base, idx_smem, start, end, i, offs_s, IDX_TILES, sc_l),
                    num_rows,
                    stride_kv,
                    offs_d,
                )
            async_copy.commit_group()
        # q (its bf16 copies, the first group) to float16 in place, while the first tiles' copies are in flight
        async_copy.wait_group(FP8_STAGES - 1)
        thread_barrier()  # every producer thread's copies of q
        qv_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [GATHER_WARPS, 1], [1, 0])
        q16 = view(
            q_smem, gl.float16, [BLOCK_H, DV], gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        )
        for c in gl.static_range(DV // 64):
            q16.slice(c * 64, 64, dim=1).store(q_smem.slice(c * 64, 64, dim=1).load(qv_l).to(gl.float16))
        fence_async_shared()  # q (generic proxy writes) before the tensor cores' reads
        thread_barrier()
        mbarrier.arrive(q_bar)
        rows_c = fp8_rows(idx_base, idx_smem, start, end, FP8_STAGES - 1, offs_t, IDX_TILES, rl)
        rows_cs = fp8_rows(idx_base, idx_smem, start, end, FP8_STAGES - 1, offs_s, IDX_TILES, sc_l)
        for t in range(n_tiles):
            nxt = t + FP8_STAGES - 1  # its staging slot was widened at t - 1, before that iteration's barrier
            if nxt < n_tiles:
                issue_fp8_tile(
                    stage_smem.index(nxt % FP8_STAGES),
                    sc_smem.index(nxt % FP8_STAGES),
                    kv_ptr,
                    scale_ptr,
                    rows_c,
                    rows_cs,
                    num_rows,
                    stride_kv,
                    offs_d,
                )
            async_copy.commit_group()
            rows_c = fp8_rows(idx_base, idx_smem, start, end, nxt + 1, offs_t, IDX_TILES, rl)
            rows_cs = fp8_rows(idx_base, idx_smem, start, end, nxt + 1, offs_s, IDX_TILES, sc_l)
            async_copy.wait_group(FP8_STAGES - 1)  # this thread's copies of tile t have landed
            thread_barrier()  # ... and every producer thread's
            slot = t % STAGES
            mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
            dequant_tile(
                stage_smem.index(t % FP8_STAGES),
                sc_smem.index(t % FP8_STAGES),
                kv_smem.index(slot),
                sc_ring.index(slot),
                BLOCK_T,
                DV,
                GATHER_WARPS,
            )
            fence_async_shared()  # the widened tile (generic proxy writes) before the tensor cores' reads
            thread_barrier()  # every producer thread's part of the tile is written
            mbarrier.arrive(ready.index(slot))
        async_copy.wait_group(0)  # no copy outlives the program

    @gluon.jit
    def _ws_gather(
        q_ptr,
        kv_ptr,
        idx_ptr,
        q_smem,
        kv_smem,
        q_bar,
        ready,
        empty,
        H,
        num_rows,
        topk,
        rows_per_split,
        stride_qb,
        stride_qh,
        stride_kv,
        stride_ib,
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        V_SPLIT: gl.constexpr,
        GATHER_WARPS: gl.constexpr,
        idx_smem,
        idx_bar,
        IDX_TILES: gl.constexpr,
        scale_ptr,
        stage_smem,
        sc_smem,
        sc_ring,
        FP8_STAGES: gl.constexpr,
    ):
        """WS's producer warpgroup: q, then each tile's selected rows into the ring by ``cp.async``. A slot is
        refilled once the consumers have released it (``empty``); each thread's copies arrive on the slot's
        ``ready`` barrier when they land (``cp.async.mbarrier.arrive.noinc``), so no warp waits for a copy here.
        ``IDX_TILES`` (see :func:`index_tiles`): the split's row numbers are loaded once into ``idx_smem``
        [IDX_TILES, BLOCK_T] (-1 past the split's end) and each tile's read from there (the consumers read their
        padding masks there too, once ``idx_bar`` says the table is written); 0: loaded a tile ahead."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        copy_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [GATHER_WARPS, 1], [1, 0])
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_t = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, copy_l))
        offs_d = gl.arange(0, DV, layout=gl.SliceLayout(0, copy_l))
        if V_SPLIT > 1:  # rotated as in the single-partition kernel
            offs_d = (offs_d + col_off) % DV
        offs_hq = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, copy_l))
        async_load(
            q_smem,
            q_ptr + pid_b.to(gl.int64) * stride_qb + offs_hq[:, None] * stride_qh + offs_d[None, :],
            mask=(offs_hq < H)[:, None],
        )
        if FP8_STAGES > 0:  # q is widened to float16 in place once it has landed (_ws_gather_fp8)
            async_copy.commit_group()
        else:
            async_copy.mbarrier_arrive(q_bar, increment_count=False)
        if IDX_TILES > 0:  # every row number of the split in one round trip, then each tile's from shared memory
            il: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [GATHER_WARPS, 1], [1, 0])
            it = gl.arange(0, IDX_TILES, layout=gl.SliceLayout(1, il))
            ij = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, il))
            pos = start + it[:, None] * BLOCK_T + ij[None, :]
            view(idx_smem, gl.int32, [IDX_TILES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(
                gl.load(idx_base + pos, mask=pos < end, other=-1)
            )
            thread_barrier()  # the producer's warps: every row number is in the table
            mbarrier.arrive(idx_bar)  # ... and the consumers may read it (release; their wait acquires)
        if FP8_STAGES > 0:
            _ws_gather_fp8(
                kv_ptr,
                scale_ptr,
                idx_base,
                q_smem,
                q_bar,
                kv_smem,
                stage_smem,
                sc_smem,
                sc_ring,
                ready,
                empty,
                idx_smem,
                start,
                end,
                n_tiles,
                num_rows,
                stride_kv,
                col_off,
                DV,
                BLOCK_H,
                BLOCK_T,
                STAGES,
                V_SPLIT,
                GATHER_WARPS,
                IDX_TILES,
                FP8_STAGES,
            )
        elif IDX_TILES > 0:
            for t in range(n_tiles):
                slot = t % STAGES
                rows = idx_smem.index(t).load(gl.SliceLayout(1, copy_l))
                mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                issue_tile(kv_smem.index(slot), kv_ptr, rows, num_rows, stride_kv, offs_d)
                async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        else:
            rows = tile_rows(idx_base, start, end, 0, offs_t)
            for t in range(n_tiles):
                slot = t % STAGES
                rows_next = tile_rows(idx_base, start, end, t + 1, offs_t)  # the next indices' round trip overlaps
                mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                issue_tile(kv_smem.index(slot), kv_ptr, rows, num_rows, stride_kv, offs_d)
                async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
                rows = rows_next

    @gluon.jit
    def _ws_compute(
        q_smem,
        kv_smem,
        q_bar,
        ready,
        empty,
        idx_ptr,
        part_ptr,
        lse_ptr,
        out_ptr,
        H,
        num_rows,
        topk,
        rows_per_split,
        qk_scale,
        n_splits,
        stride_ib,
        stride_pb,
        stride_ps,
        stride_ph,
        stride_lb,
        stride_ls,
        stride_ob,
        stride_oh,
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        DIRECT: gl.constexpr,
        V_SPLIT: gl.constexpr,
        STORE_CVT: gl.constexpr,
        sc_ring=None,
        KV_SCALED: gl.constexpr = False,
    ):
        """WS's two consumer warpgroups: the single-partition kernel's loop without its copies and its block-wide
        barrier; they release a slot (one arrival: Gluon arrives once a partition, after the partition's barrier)
        once both warpgroups' products have read it."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_T // 2, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DO // 2, 16]
        )
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))
        rows_v = tile_rows(idx_base, start, end, 0, offs_ts)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        mbarrier.wait(q_bar, 0)
        for t in range(n_tiles):
            slot = t % STAGES
            mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
            fence_async_shared()  # the copies (generic proxy) before the tensor cores' reads (async proxy)
            tile = kv_smem.index(slot)
            v_tile = tile if V_SPLIT == 1 else tile.slice(0, DO, dim=1)
            s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            valid = (rows_v >= 0) & (rows_v < num_rows)
            rows_v = tile_rows(idx_base, start, end, t + 1, offs_ts)
            if KV_SCALED:
                scl = sc_ring.index(slot).load(gl.SliceLayout(0, s_l))
            else:
                scl = None
            s = warpgroup_mma_wait(0, deps=[s_tok])
            acc, m_i, l_i = softmax_pv(s, valid, qk_scale, m_i, l_i, acc, v_tile, o_l, p_l, scl, KV_SCALED)
            mbarrier.arrive(empty.index(slot))  # both warpgroups' products are done with the slot
        write_result(
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
            BLOCK_H,
            DO,
            DIRECT,
            STORE_CVT,
            s_l,
            o_l,
            8,
        )

    @gluon.jit
    def _ws_compute_wg(
        q_smem,
        kv_smem,
        q_bar,
        ready,
        empty,
        done,
        hand_ml,
        idx_ptr,
        part_ptr,
        lse_ptr,
        out_ptr,
        H,
        num_rows,
        topk,
        rows_per_split,
        qk_scale,
        n_splits,
        stride_ib,
        stride_pb,
        stride_ps,
        stride_ph,
        stride_lb,
        stride_ls,
        stride_ob,
        stride_oh,
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        DIRECT: gl.constexpr,
        V_SPLIT: gl.constexpr,
        STORE_CVT: gl.constexpr,
        WG: gl.constexpr,
        idx_smem,
        idx_bar,
        IDX_TILES: gl.constexpr,
        sc_ring=None,
        KV_SCALED: gl.constexpr = False,
    ):
        """SPLIT_WG's consumer warpgroup ``WG`` (0 or 1, each a worker partition): the split's tiles ``WG``,
        ``WG + 2``, ... whole (a 64 x BLOCK_T x 512 score product, its own online softmax, O += P V for the program's
        DO <= 256 columns), with no exchange with the other warpgroup until the end: then warpgroup 1 hands its
        (acc, m, l) over through shared memory (q's buffer, free once both are done) and warpgroup 0 merges the two
        as two splits and writes the result. ``done[0]``: warpgroup 0 has finished its tiles (its products no
        longer read q); ``done[1]``: warpgroup 1's state is in shared memory. A slot is always consumed by one warpgroup, in
        order (STAGES even: a slot's tiles all have one parity), so no wait runs ahead of its barrier's phase.
        Registers: a [64, DO] float32 accumulator, a [64, BLOCK_T] score tile and its probabilities in ``WG_REGS``;
        with 64-row tiles at two programs a split the sm_90 build spills, which is why the schedule ships with 32-row
        tiles (no spill under Triton 3.6 or 3.9)."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DO, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        mbarrier.wait(q_bar, 0)
        if IDX_TILES > 0:
            mbarrier.wait(idx_bar, 0)
        for t in range(WG, n_tiles, 2):
            slot = t % STAGES
            mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
            fence_async_shared()
            tile = kv_smem.index(slot)
            s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            # the tile's indices (for the padding mask) load while the scores' product runs: not carried over
            # from the previous tile, as in the two-warpgroup schedule, because a warpgroup holding whole 64-row
            # tiles would keep 16 row numbers and their 64-bit addresses live across the loop (ptxas spilled them)
            if IDX_TILES > 0:  # the padding mask from the producer's table
                rows_v = idx_smem.index(t).load(gl.SliceLayout(0, s_l))
            else:
                rows_v = tile_rows(idx_base, start, end, t, offs_ts)
            valid = (rows_v >= 0) & (rows_v < num_rows)
            if KV_SCALED:
                scl = sc_ring.index(slot).load(gl.SliceLayout(0, s_l))
            else:
                scl = None
            s = warpgroup_mma_wait(0, deps=[s_tok])
            acc, m_i, l_i = softmax_pv(
                s, valid, qk_scale, m_i, l_i, acc, tile.slice(0, DO, dim=1), o_l, p_l, scl, KV_SCALED
            )
            mbarrier.arrive(empty.index(slot))
        hand_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        hand = view(q_smem, gl.float32, [BLOCK_H, DO], hand_sl)  # 64 x DO float32: no more than q's 64 x 512 16-bit
        ml_l: gl.constexpr = gl.SliceLayout(1, s_l)
        if WG == 0:
            mbarrier.arrive(done.index(0))  # q and the ring are no longer read here
            mbarrier.wait(done.index(1), 0)
            m_o = hand_ml.index(0).load(ml_l)
            l_o = hand_ml.index(1).load(ml_l)
            m_new = gl.maximum(m_i, m_o)
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            a = gl.exp2(m_i - m_safe)
            b = gl.exp2(m_o - m_safe)
            l_i = l_i * a + l_o * b
            a_o = gl.convert_layout(a, gl.SliceLayout(1, o_l))
            b_o = gl.convert_layout(b, gl.SliceLayout(1, o_l))
            acc = acc * a_o[:, None] + hand.load(o_l) * b_o[:, None]
            write_result(
                acc,
                m_new,
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
                BLOCK_H,
                DO,
                DIRECT,
                STORE_CVT,
                s_l,
                o_l,
                4,
            )
        else:
            mbarrier.wait(done.index(0), 0)  # warpgroup 0's products are done with q
            hand.store(acc)
            hand_ml.index(0).store(m_i)
            hand_ml.index(1).store(l_i)
            mbarrier.arrive(done.index(1))

    @gluon.jit
    def sparse_decode_wgmma_ws_kernel(
        q_ptr,
        kv_ptr,
        idx_ptr,
        part_ptr,
        lse_ptr,
        out_ptr,
        H,
        num_rows,
        topk,
        rows_per_split,
        qk_scale,
        n_splits,
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
        DV: gl.constexpr,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        STAGES: gl.constexpr,
        DIRECT: gl.constexpr,
        V_SPLIT: gl.constexpr,
        STORE_CVT: gl.constexpr,
        GATHER_WARPS: gl.constexpr,
        GATHER_REGS: gl.constexpr,
        SPLIT_WG: gl.constexpr = False,
        WG_REGS: gl.constexpr = 0,
        IDX_TILES: gl.constexpr = 0,
        PDL: gl.constexpr = False,
        scale_ptr=None,
        FP8_STAGES: gl.constexpr = 0,
    ):
        """The warp-specialised schedule (``WS=1``): a producer warpgroup gathers, two consumer warpgroups compute;
        they meet on mbarriers, one ``ready`` and one ``empty`` per ring slot."""
        gl.static_assert(BLOCK_H == 64, "one wgmma M of heads per program")
        launch_merge_early(PDL)
        gl.static_assert(DV == 512, "two warpgroups of 256 columns of V")
        gl.static_assert(STAGES >= 2, "a ring of at least two slots")
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        tile_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DV], tile_sl)
        if FP8_STAGES > 0:  # an fp8 cache: the products run in float16 (e4m3 widens exactly; q is widened in place)
            mma_dtype: gl.constexpr = gl.float16
            q_mma = view(q_smem, gl.float16, [BLOCK_H, DV], tile_sl)
        else:
            mma_dtype: gl.constexpr = dtype
            q_mma = q_smem
        kv_smem = gl.allocate_shared_memory(mma_dtype, [STAGES, BLOCK_T, DV], tile_sl)
        if IDX_TILES > 0:  # the producer's table of the split's row numbers
            idx_smem = gl.allocate_shared_memory(gl.int32, [IDX_TILES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            idx_smem = q_smem  # unused (warp_specialize takes no None)
        if FP8_STAGES > 0:  # an fp8 cache: the producer's staging ring of fp8 rows and their float32 scales
            stage_smem = gl.allocate_shared_memory(
                kv_ptr.dtype.element_ty,
                [FP8_STAGES, BLOCK_T, DV],
                gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2),
            )
            sc_smem = gl.allocate_shared_memory(
                gl.float32, [FP8_STAGES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0])
            )
            # each ring slot's row scales, from the producer to the consumers (scores and probabilities)
            sc_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            stage_smem = q_smem  # unused
            sc_smem = q_smem
            sc_ring = q_smem
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        idx_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # one arrival per producer thread, when its copies land; with an fp8 cache one, once q is widened
        mbarrier.init(q_bar, count=1 if FP8_STAGES > 0 else GATHER_WARPS * 32)
        mbarrier.init(idx_bar, count=1)  # the producer's table is written (one arrival: the partition's)
        for i in gl.static_range(STAGES):
            # one arrival per producer thread as its copies land; an fp8 tile: one, once the partition widened it
            mbarrier.init(ready.index(i), count=1 if FP8_STAGES > 0 else GATHER_WARPS * 32)
            # one arrival a consumer partition (Gluon arrives once a partition, after its barrier)
            mbarrier.init(empty.index(i), count=1)
        if SPLIT_WG:
            gl.static_assert(V_SPLIT > 1, "one warpgroup's accumulator: at most 256 columns of V")
            gl.static_assert(STAGES % 2 == 0, "each ring slot consumed by one warpgroup")
            done = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            hand_ml = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            mbarrier.init(done.index(0), count=1)
            mbarrier.init(done.index(1), count=1)
            fence_async_shared()
            # the producer is the default partition (its registers: what the two consumers leave, 88), so both
            # consumers are workers with the same register budget
            gl.warp_specialize(
                [
                    (
                        _ws_gather,
                        (
                            q_ptr,
                            kv_ptr,
                            idx_ptr,
                            q_smem,
                            kv_smem,
                            q_bar,
                            ready,
                            empty,
                            H,
                            num_rows,
                            topk,
                            rows_per_split,
                            stride_qb,
                            stride_qh,
                            stride_kv,
                            stride_ib,
                            DV,
                            BLOCK_H,
                            BLOCK_T,
                            STAGES,
                            V_SPLIT,
                            GATHER_WARPS,
                            idx_smem,
                            idx_bar,
                            IDX_TILES,
                            scale_ptr,
                            stage_smem,
                            sc_smem,
                            sc_ring,
                            FP8_STAGES,
                        ),
                    ),
                    (
                        _ws_compute_wg,
                        (
                            q_mma,
                            kv_smem,
                            q_bar,
                            ready,
                            empty,
                            done,
                            hand_ml,
                            idx_ptr,
                            part_ptr,
                            lse_ptr,
                            out_ptr,
                            H,
                            num_rows,
                            topk,
                            rows_per_split,
                            qk_scale,
                            n_splits,
                            stride_ib,
                            stride_pb,
                            stride_ps,
                            stride_ph,
                            stride_lb,
                            stride_ls,
                            stride_ob,
                            stride_oh,
                            DV,
                            BLOCK_H,
                            BLOCK_T,
                            STAGES,
                            DIRECT,
                            V_SPLIT,
                            STORE_CVT,
                            0,
                            idx_smem,
                            idx_bar,
                            IDX_TILES,
                            sc_ring,
                            FP8_STAGES > 0,
                        ),
                    ),
                    (
                        _ws_compute_wg,
                        (
                            q_mma,
                            kv_smem,
                            q_bar,
                            ready,
                            empty,
                            done,
                            hand_ml,
                            idx_ptr,
                            part_ptr,
                            lse_ptr,
                            out_ptr,
                            H,
                            num_rows,
                            topk,
                            rows_per_split,
                            qk_scale,
                            n_splits,
                            stride_ib,
                            stride_pb,
                            stride_ps,
                            stride_ph,
                            stride_lb,
                            stride_ls,
                            stride_ob,
                            stride_oh,
                            DV,
                            BLOCK_H,
                            BLOCK_T,
                            STAGES,
                            DIRECT,
                            V_SPLIT,
                            STORE_CVT,
                            1,
                            idx_smem,
                            idx_bar,
                            IDX_TILES,
                            sc_ring,
                            FP8_STAGES > 0,
                        ),
                    ),
                ],
                [4, 4],
                [WG_REGS, WG_REGS],
            )
        else:
            fence_async_shared()
            gl.warp_specialize(
                [
                    (
                        _ws_compute,
                        (
                            q_mma,
                            kv_smem,
                            q_bar,
                            ready,
                            empty,
                            idx_ptr,
                            part_ptr,
                            lse_ptr,
                            out_ptr,
                            H,
                            num_rows,
                            topk,
                            rows_per_split,
                            qk_scale,
                            n_splits,
                            stride_ib,
                            stride_pb,
                            stride_ps,
                            stride_ph,
                            stride_lb,
                            stride_ls,
                            stride_ob,
                            stride_oh,
                            DV,
                            BLOCK_H,
                            BLOCK_T,
                            STAGES,
                            DIRECT,
                            V_SPLIT,
                            STORE_CVT,
                            sc_ring,
                            FP8_STAGES > 0,
                        ),
                    ),
                    (
                        _ws_gather,
                        (
                            q_ptr,
                            kv_ptr,
                            idx_ptr,
                            q_smem,
                            kv_smem,
                            q_bar,
                            ready,
                            empty,
                            H,
                            num_rows,
                            topk,
                            rows_per_split,
                            stride_qb,
                            stride_qh,
                            stride_kv,
                            stride_ib,
                            DV,
                            BLOCK_H,
                            BLOCK_T,
                            STAGES,
                            V_SPLIT,
                            GATHER_WARPS,
                            idx_smem,
                            idx_bar,
                            IDX_TILES,
                            scale_ptr,
                            stage_smem,
                            sc_smem,
                            sc_ring,
                            FP8_STAGES,
                        ),
                    ),
                ],
                [GATHER_WARPS],
                [GATHER_REGS],
            )
