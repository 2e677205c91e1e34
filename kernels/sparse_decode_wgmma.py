"""Sparse MLA decode for Hopper written in Gluon: 64-head tiles on ``wgmma``, gathered rows in a ``cp.async`` ring.

The same computation as :func:`kernels.sparse_decode.sparse_decode` (its docstring has the maths), for the shapes
V4-Flash serves: 64 query heads per request, one shared K=V latent row of ``d_v`` = 512 columns (``d_qk == d_v``),
a 16-bit cache or an fp8 one (below). Issue 20's profile of the ``tl.dot`` kernel showed why it stays far from the floor: every loop
iteration waited for all its asynchronous copies, so each tile's gather (a DRAM round trip) ran in series with its
two products. Triton's pipeliner does not overlap an indirect gather, and Triton 3.6 does not warp-specialise the
loop on Hopper. Gluon states the schedule instead of asking a pass for it:

- one program per (request, split of the selected rows), all 64 heads, 8 warps (two warpgroups);
- ``q`` [64, 512] sits in shared memory for the whole program;
- the selected rows of each ``BLOCK_T`` tile are copied with ``cp.async`` (16 bytes a thread, zero-filled where a
  row is padding) into a ring of ``STAGES`` shared-memory slots; the copies of tile ``t + STAGES - 1`` are issued
  before tile ``t``'s products, so the gather runs while the tensor cores work;
- S = q K^T is one ``wgmma`` chain per warpgroup (each warpgroup half the tile's rows), the online softmax runs
  on S in registers, and O += P V is one ``wgmma`` chain per warpgroup for its half of the program's columns of V
  (all 512, or a half, quarter or eighth with ``V_SPLIT``), reading the same shared tile as K (V is the first ``d_v``
  columns of K): each row leaves DRAM once;
- one barrier per tile: after it every warp has finished the previous tile, so its slot is free to refill.

With ``SEESAW=1`` (FlashMLA's schedule: on top of WS, one program a split, all 512 columns) each compute warpgroup
holds half of O's columns and owns alternate tiles: for its own tile it computes the whole scores' product (once for
both, where SPLIT_WG's two column programs each compute it), the online softmax against the max the other published
for the tile before, and publishes P and (alpha, max, row sum) in shared memory; both add every tile's P V for their
columns in order, so both end with the same (m, l) and each writes its own columns. Correct, but slower on the H200
(2026-12-01, ``sparse_decode_wgmma_locality_h200_600ccd2.md``, side by side): 30.1 against the SPLIT_WG default's
26.2 µs at batch 64 (two splits a request), 17.9 against 16.4 at batch 16 (0.87x / 0.92x); without the gathers
(``no_copies``) it still takes 27.1 µs, and its split kernel alone ran 26.1 µs under Nsight Compute
(``data/ncu_details_sparse_decode_wgmma_seesaw_b64_s2_h200_e46ff2e.csv``). Its first build (7619863) converted P to
a register operand for the owner's own product, and ptxas serialised every wgmma for lack of registers (C7512; 33.6
µs, ``sparse_decode_wgmma_h200_7619863.md``): the owner now reads P from shared memory, and a CPU test reads the
ptxas log. A tunable switch, off by default.

Split-K partials and the merge are the ``tl.dot`` kernel's (same layout, same merge kernel, launched with
programmatic dependent launch), so the two kernels are interchangeable behind :func:`sparse_decode_wgmma`. Where
the merge fits the SMs the split kernel leaves idle (:func:`merge_starts_early`) the split kernel lets it start at
once (``griddepcontrol.launch_dependents``): batch 1 at 8.7 against 9.3 µs with the merge started as the split
kernel exits (H200, 2026-12-01, ``kernels_sparse_decode_wgmma_h200_2b6e86b.md``). A wider merge grid (512 programs
of 64 columns at batch 1, against 128 of 256) measured slower with the early start (0.92x at batch 1, 0.84x at 2;
``sparse_decode_wgmma_pdl_h200_9105b94.md``) and is not used (``_merge_programs`` times it). Under Nsight Compute,
which runs each kernel alone with cold caches, batch 1's split kernel took 6.4 µs (749,520 warp instructions over
80 programs of 8 warps, 7.2 cycles an issue, long-scoreboard stalls first) and its merge 6.0 µs (its 1.3 MB of
partials from DRAM, where in a decode step they are still in L2; ``data/ncu_wgmma_b1_summary_5e1901b.txt``).

With ``WS=1`` the schedule is warp-specialised instead: a fourth warpgroup (the producer, 88 registers a thread)
loads q and the indices and issues every gather; each thread's copies arrive on the ring slot's ``ready`` mbarrier
when they land (``cp.async.mbarrier.arrive.noinc``), and the two compute warpgroups (208 registers) wait on it and
release the slot on its ``empty`` mbarrier after their products. No compute warp issues a copy or waits for one.

With ``SPLIT_WG=1`` (on top of WS, two programs a split or more, an even ring) the two compute warpgroups are two
partitions that take alternate whole tiles: each computes a whole tile's scores (64 heads x ``BLOCK_T`` x 512), runs
its own online softmax and O += P V for the program's columns, and releases the slot; nothing crosses between them
per tile (no shared-memory row reductions, no barrier between the two), so one's softmax runs while the other's
products do. At the end the second hands its (acc, m, l) over through q's buffer and the first merges the two like
two splits and writes the result.

Its whole space, timed (H200, 2026-12-02, 3d03109, every one of the 4389 canonical configs a batch checked and timed,
``benchmarks/results/data/tuner_efficiency_h200_wgmma_exhaustive_3d03109.json``, reported in
``benchmarks/results/tuner_efficiency_goal_wgmma_exhaustive.md``): the default config is the fastest of the space at
batch 64 (26.4 µs) and at batch 1 (8.8 µs).
Measured on an H200 (2026-12-01, a9df7f9, ``benchmarks/results/sparse_decode_wgmma_h200_a9df7f9.md``, side by side
with the ``tl.dot`` kernel's shipped and fastest configs, over the space with ``P_SMEM=0``, rings of 2 or 4, no MERGE
and float32 partials): 9.5 / 16.7 / 27.9 µs at batch 1 / 16 / 64 against 9.4 / 19.4 / 36.8 µs, so 1.00x / 1.16x /
1.32x (issue 20's goals, 9 / 12 / 17 µs, are still missed). ``SPLIT_WG`` against the best config without it in the
same run: 1.00x / 1.00x / 1.03x; at batch 64 with 32-row tiles in a ring of four it ran 27.9 against 39.1 µs for the
same config without it, but with 64-row tiles (one ring slot a warpgroup beside q) 35.3 against 28.7. The run
before it (b1b01f3, ``sparse_decode_wgmma_h200_b1b01f3.md``): 9.4 / 16.4 / 28.5 µs. WS against the single-partition
schedule's best in that run: 1.00x / 1.04x / 1.09x; its gain grows with the tiles a program walks (a program of one tile pays for the handshake: 0.975-0.984x),
and at batch 64 it lets one split of 640 rows (no partials, no merge) beat two. ``V_SPLIT`` (2, 4 or 8 programs a
split, each all the scores and its share of V's columns) is 1.20x / 1.08x / 1.05x the fastest one-program config
in the same run. Earlier runs: 9.4 / 17.1 / 30.8 µs before WS (``sparse_decode_wgmma_h200.md`` at 4750e24,
``sparse_decode_wgmma_h200_db89c65.md``). In the decode workload (``attention_impl=wgmma``, V4-Flash twin at live
context 512, the hand-written best otherwise) the kernel is 2-4% of the step: with the tuned configs of the H200
kernel search after WS (``kernels/tuned``), 0.995 / 1.001 / 1.016 the mma kernel's step end to end at c=1 / 16 / 64
(``benchmarks/results/workload_attention_wgmma_h200_d2aed67.md``; 0.997 / 1.002 / 1.005 before WS, 197b672).
What bounds it (Nsight Compute at batch 64, one split, 64-row tiles, 0d565da: the stall samples per SASS line in
``data/ncu_source_sparse_decode_wgmma_ws_b64_s1_h200_0d565da.txt`` and its ``ncu_details_...csv``, beside the
single-partition ``..._b64_s1_h200_0d565da`` pair): WS takes the copies off the compute warps (35.2 against 39.8 µs,
DRAM at 22% of its peak against 20%), and the compute warpgroups' samples then sit on the two products' waits (9-10%
each). Each
warpgroup computes half of a tile's scores (a 64 x 32 x 512 product with q as the shared-memory operand), so q
leaves shared memory twice a tile, and the softmax's row reductions cross the two warpgroups through shared memory
and a barrier. ``SPLIT_WG`` removes both (each warpgroup reads q once for a whole tile and reduces its own rows);
what it cannot fix is the ring: q's 64 KiB stay resident, so only 128 KiB of gathered rows fit, two 64-row slots or
four 32-row ones, and each warpgroup has at most two tiles in flight (sparse decode is 2-4% of the workload's step,
``benchmarks/results/workload_attention_share_h200.md``).
Measured again at the SPLIT_WG default (H200, 2026-12-01, ``sparse_decode_wgmma_locality_h200_48454a2.md``): DRAM
is not what bounds it (every request reading the same rows, so a 64th of the bytes leave DRAM, runs 1.04x); without
the rows' copies (``_probe="no_copies"``) it still takes 22.6 of 26.2 µs, without the products 16.8 µs, and its
products alone at the tensor cores' measured rates take 11.9 µs (``benchmarks/wgmma_rates.py``,
``wgmma_rates_h200_b68f14f.md``): the compute warpgroups' per-tile chain (wait, scores, softmax, PV, release) keeps
the tensor cores about half busy; at 64 to 640 selected rows the same config takes 9.4 µs fixed plus 0.86 µs a
32-row tile. The scores' product with q in shared memory runs 566-628 TFLOP/s at 32-row tiles against 805-853 with
q in registers (which does not fit beside a 256-column accumulator) and 824-856 at 64-row tiles. The index table
(``index_tiles``, SPLIT_WG: the split's row numbers in shared memory for the producer's gathers and the consumers'
padding masks) is 1.07x at the batch-64 default, side by side. Tried and removed: each warpgroup issuing its next
tile's scores before this tile's softmax (0.84x at c63889b; the build spilled 104 bytes a thread). Tried and removed:
each tile's O += P V left in flight behind the next tile's scores' product, both waited for together and the slot
released then (WS and SPLIT_WG, the first tile peeled off so that ptxas kept the wgmma asynchronous: a waited-for
product read between two in flight, or a constant accumulator on the loop's zero-trip path, made it serialise them,
C7514 / C7515): 0.91x at the batch-64 default, 0.97x at batch 16, median 0.97x over nine warp-specialised configs
(55b8397, ``sparse_decode_wgmma_async_pv_h200_55b8397.md``). Likely, not profiled: a slot released a product
later shortens the ring's prefetch, and each warpgroup's serial chain was already hidden by the other's.
``P_SMEM`` (P through shared memory instead of a register layout conversion) measured within 1.5% either way.
``MERGE`` (the split-K merge folded in: the last program of a request's splits to finish merges them, no second
launch) measured slower than the separate merge kernel with programmatic dependent launch: median 0.88x / 0.92x /
0.975x over the same configs at batch 1 / 16 / 64 (6958938, ``sparse_decode_wgmma_h200_6958938.md``). The likely
reason, not profiled: one program reads every split's partial from L2, where the merge kernel spreads that over
many programs and its launch overlaps the split kernel's tail. It stays a tunable switch, off by default. Tried
and removed (3057f3e): a spread merge, ``MERGE=2``, that takes both the second launch and the one merging program
away. The launch was cooperative (every program resident), and each program of a request's splits added its
arrival (a release add after its partial), waited for the others (acquire loads), then merged its share of the heads
and left (the last to leave reset the counters). It was correct in its GPU tests, but slower than the merge kernel
at every config timed both ways: median 0.949x over 64 pairs at batch 16 (its best 16.7 against 16.6 µs), 0.900x
over 69 at batch 1 (H200, 2026-12-02, ``sparse_decode_wgmma_merge2_b16_h200_3057f3e.md``, ``..._b1_...``). Not
profiled: the wait for a request's slowest split and the merge's reads stay on the critical path either way, and
what the launch costs is hidden by programmatic dependent launch.

Where a program's time goes, read off its own clock (``_probe="timeline"``: each partition stores the SM's cycle
counter at each phase, ``TIMELINE_STAMPS``; ``benchmarks/sparse_decode_wgmma_timeline.py``, H200, 2026-12-02,
``sparse_decode_wgmma_timeline_h200_a572e83.md``, medians over 128 programs and 10 launches): at the batch-64 default
(26.5 µs timed) the first tile lands 4.1 µs after a program starts (q's 64 KiB of copies take the producer about a
microsecond to issue, then the index table's round trip, then the gathers, while every program fetches q and its
first tiles at once), the 20 tiles take 15.9 µs (1.6 µs a tile for each warpgroup), and the result is written 3.8
µs after the first warpgroup's last products (1.4 µs waiting for the second, whose last tile comes later, 1.1 µs its
hand-over through shared memory, the merge and the stores); the programs' starts spread over 0.1 µs, and the timed
kernel is 1.8 µs longer than its programs (launch and drain). At 64 selected rows the same config takes 11.1 µs
timed, 4.1 + 1.3 + 3.6 µs inside. At batch 16 (WS) the first tile lands at 3.4 µs, 2.5 tiles of 64 rows take 6.2 µs,
the partials are written 1.6 µs later, and the merge kernel and the launches take the remaining 4.7 of 16.5 µs.
Tried after it: the producer asking for the row numbers before issuing q's copies (the first tile landed at 3.4
instead of 4.1 µs, in another run) timed 1.001x / 0.999x its previous order side by side at batch 64 / 16 (88b8d14,
``sparse_decode_wgmma_timeline_h200_88b8d14.md``) and was not kept: the start is the whole grid's fetch of q and its
first tiles, not one program's chain.

An fp8 e4m3 cache with a float32 scale per row (``kv_scale``, as :func:`kernels.sparse_decode.sparse_decode`
takes it) runs on the warp-specialised schedules: the producer copies each tile's fp8 rows and scales by ``cp.async``
into a staging ring of up to four slots (``FP8_STAGES``, what shared memory holds beside the 16-bit ring), widens a
landed tile to float16 (exact: one ``cvt`` for two values) into the ring slot the consumers released, hands its row
scales over beside it and arrives on its ``ready`` barrier (:func:`_ws_gather_fp8`); q is widened to float16 in
place, and the consumers, the 16-bit ones, multiply the scores and the probabilities by the scales. Measured on an
H200 (2026-12-01, 4ac0e78, ``sparse_decode_wgmma_fp8_h200_4ac0e78.md``): 1.30x / 1.50x the ``tl.dot`` kernel's tuned
fp8 configs at batch 16 / 64, 0.94x at batch 1, and 0.75-0.81x the same rows as a bf16 cache: the staging slots cut
the 16-bit ring (``fit_dtype``: 32-row tiles, fewer slots; the bf16 kernel at the fp8 best's config is within 7-17%
of it), and the widening and scales cost the rest. Widening through float32 times the scale in the producer (9a692a1)
measured the same within 0.8 µs and erred 0.0043 against 0.0017.

Needs an sm_90 GPU and a Triton with Gluon's Hopper API (3.6 on the GPU image; the compile test also runs on 3.9).
Its sm_90 build is checked on CPU and its numerics on the GPU (``tests/kernels/test_sparse_decode_wgmma.py``).
"""

from __future__ import annotations

import math

import torch
import triton

from .base import cdiv, device_limits, dtype_of, gpu_target
from .configs import tuned_config
from .sparse_decode import (
    _FP8,
    _PDL,
    LOG2E,
    _check_args,
    _shape_of,
    _SparseDecodeBase,
    combine_grid,
    launch_combine,
    one_wave,
    split_rows,
)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon: sparse_decode_wgmma raises, the tl.dot kernel stays available
    HAVE_GLUON = False

__all__ = ["DEFAULT_CONFIG", "HAVE_GLUON", "WGMMA_HEADS", "WGMMA_WARPS", "SparseDecodeWgmmaKernel", "default_config", "index_tiles",
           "merge_starts_early", "one_wave", "sparse_decode_wgmma", "splits_within"]

WGMMA_HEADS = 64  # one wgmma M: every head of a V4-Flash request in one program
WGMMA_WARPS = 8  # two warpgroups: each holds a [64, 256 / V_SPLIT] float32 accumulator (128 / V_SPLIT registers a thread)
DEFAULT_CONFIG = {"S": 8, "BLOCK_T": 64, "STAGES": 2, "P_SMEM": 0, "V_SPLIT": 1, "PART16": 0, "STORE_CVT": 0, "WS": 0,
                  "MERGE": 0, "SPLIT_WG": 0, "SEESAW": 0}  # S, V_SPLIT: see default_config
PROGRAMS = 128  # about one program per SM of an H200 (132)
ONE_WAVE = 132  # an H100 SXM's or H200's SMs: one resident program each (a program's shared memory fills an SM)
# WS=1: a producer warpgroup beside the two consumer ones. Registers are granted per warpgroup: the launch caps all
# 384 threads at WS_MAXNREG (65536 / 384, rounded down to 8), and the producer hands all but GATHER_REGS of its
# share to the consumers (setmaxnreg), which then hold 168 + (168 - GATHER_REGS) / 2.
GATHER_WARPS = 4
GATHER_REGS = 88
WS_MAXNREG = 168
WG_REGS = 208  # SPLIT_WG: each consumer warpgroup's registers (the producer, the default partition, keeps the rest: 88)
IDX_TABLE_MAX = 8192  # bytes: SPLIT_WG's producer keeps its split's row numbers in shared memory up to this
SM90_SMEM = 227 * 1024  # an sm_90 block's shared memory (opt-in maximum)
EARLY_MERGE_PER_IDLE_SM = 8
"""The split kernel starts its PDL-launched merge at once (:func:`merge_starts_early`) while the merge has at most
this many programs for each SM the split kernel leaves idle."""


def merge_starts_early(programs: int, merge_programs: int, sms: int) -> bool:
    """Whether the split kernel (``programs``, one a resident block) should let its merge kernel (``merge_programs``)
    start at once rather than as its own programs exit. Started early, the merge's programs land on the SMs the split
    kernel leaves idle and wait there: its launch overlaps the split kernel, but a merge of many programs crowds those
    few SMs while the rest of it starts late. Each batch's default timed both ways on an H200 (2026-12-01,
    ``sparse_decode_wgmma_pdl_h200_a387428.md``; at exit / early, above 1: early pays), by the merge's programs for
    each idle SM: 2.5 (batch 1) 1.11x, 4.9 (batch 2) 1.03x, 9.8 (batches 4 and 8) 0.94x and 1.01x, 32-512 (batches 3,
    6, 12, 16, 32) 0.85-1.00x; with no SM idle (batch 24, 144 programs) 1.02x, left at exit."""
    idle = sms - programs
    return idle > 0 and merge_programs <= EARLY_MERGE_PER_IDLE_SM * idle


def index_tiles(config: dict, shape: dict) -> int:
    """Rows of the producer's index table (``IDX_TILES``, a power of two of ``BLOCK_T``-row tiles): with SPLIT_WG the
    producer loads its split's row numbers once, at the start, into shared memory, and issues each tile's gathers
    from there, and each compute warpgroup reads its tile's padding mask there (not a global load a tile, which its
    scores' product waited for). Measured side by side against the previous producer and consumers
    (``_probe="indices_ahead"``, ``sparse_decode_wgmma_locality_h200_8fe2a9d.md``): 1.07x at the batch-64 default
    (26.0 against 27.8 µs); the WS schedule's consumers already carried their mask a tile ahead, and there a table
    for the producer alone measured 0.97-1.00x (b68f14f, c63889b, b4f8724), so WS keeps loading indices a tile ahead.
    SEESAW's consumers read their masks there too. 0 (no table) without SPLIT_WG or SEESAW, and where the table would
    pass ``IDX_TABLE_MAX`` or the block's shared memory."""
    if not (config.get("SPLIT_WG") or config.get("SEESAW")):
        return 0
    rows_per_split, _ = split_rows(max(shape["topk"], 1), config["S"], config["BLOCK_T"])
    tiles = triton.next_power_of_2(cdiv(rows_per_split, config["BLOCK_T"]))
    nbytes = tiles * config["BLOCK_T"] * 4
    fits = nbytes <= IDX_TABLE_MAX and SparseDecodeWgmmaKernel.smem_bytes_without_table(config, shape) + nbytes <= SM90_SMEM
    return tiles if fits else 0


def splits_within(batch: int, topk: int, v_split: int, block_t: int, sms: int | None = None) -> int:
    """The most splits of ``topk`` rows (whole ``block_t`` tiles, :func:`kernels.sparse_decode.split_rows`) that keep
    ``batch * v_split * splits`` within one wave (``sms``, default ``kernels.sparse_decode.one_wave``: one program an
    SM); 1 where even
    one split does not. Measured
    on an H200 (2026-12-01, ``sparse_decode_wgmma_batches_h200_470243f.md``): a second wave costs 1.3-1.5x (batch 24:
    27.0 µs at 144 programs, 20.4 at 96), while 130 programs, within the 132 SMs, ran 15.2 µs against 15.9 at 104
    (batch 13)."""
    tiles = cdiv(max(topk, 1), block_t)
    return next((n for n in (split_rows(max(topk, 1), s, block_t)[1] for s in range(tiles, 0, -1))
                 if batch * v_split * n <= (sms or one_wave())), 1)


FP8_STAGES_MAX = 4
"""An fp8 cache: at most this many staging slots of gathered fp8 rows in the producer (three tiles in flight)."""


def fp8_stages(config: dict, shape: dict) -> int:
    """The producer's fp8 staging slots for ``config`` (:func:`_ws_gather_fp8`): as many as the block's shared
    memory holds beside the 16-bit ring (and its slots' row scales), q and the rest, up to ``FP8_STAGES_MAX``; below 2
    the config cannot take an fp8 cache."""
    per = config["BLOCK_T"] * (shape["d_qk"] + 4)  # a tile's fp8 rows and their float32 scales
    ring_scales = config["STAGES"] * config["BLOCK_T"] * 4  # each 16-bit ring slot's row scales, for the consumers
    free = SM90_SMEM - SparseDecodeWgmmaKernel.instance.smem_bytes(config, shape) - ring_scales
    return max(0, min(FP8_STAGES_MAX, free // per))


def default_config(batch: int, topk: int) -> dict:
    """About one program per SM, 64-row tiles. Programs a split (``V_SPLIT``): the most of 8, 4, 2 that keeps one
    program a tile within 128 programs (batch * tiles * V_SPLIT <= 128: 8 at batch 1 with V4-Flash's 10 tiles), else
    2 while two programs a request fit in 128 (batch <= 64), else 1: for the same number of programs, fewer splits
    store and merge fewer float32 partials. ``S``: the most splits of whole 64-row tiles that keep
    ``batch * V_SPLIT * S`` within one wave of 132 programs (:func:`splits_within`; before 2026-12-01
    ``S = ceil(128 / (batch * V_SPLIT))``, which launched a second wave at 108 of the batches up to 132, e.g. 144
    programs at batch 24: 27.0 against 20.4 µs now).
    ``WS`` (the producer warpgroup) where a program walks three tiles or more: its gain grew with the tiles a program
    walks (medians over batch 1 / 16 / 64: 0.975-0.984x at one tile, 0.99-1.00x at two, 1.01-1.03x at three,
    1.04-1.06x at four or more; the WS table of ``sparse_decode_wgmma_h200_b1b01f3.md``). ``STORE_CVT`` where
    there is one split: the bf16 output from the wgmma layout is written in 4-byte stores (half sectors).
    On the H200 this names the fastest float32-partial config of the newest sweep at each batch (b1b01f3,
    ``benchmarks/results/sparse_decode_wgmma_h200_b1b01f3.md``: 9.4 / 16.4 / 28.5 µs): 10 splits of 64 rows, eight
    programs each, single-partition; 4 splits of 160 rows, two each, WS; one split of 640, two programs a request,
    WS, converted stores (batches between these were not measured). Float32 partials (``PART16=0``): 16-bit partials
    through the converted stores were no faster at batch 1 (9.5 against 9.4 µs) and bring the rounding error of a
    bf16 output against the float32 reference from 0.0020 to 0.0024.
    ``SPLIT_WG`` (each compute warpgroup whole tiles, alternately) where one split walks four 64-row tiles or more
    (batch 64 at V4-Flash): with 32-row tiles in a ring of four, so each warpgroup has two slots in flight (with
    64-row tiles only two slots fit beside q, one each, and SPLIT_WG was 0.81x). The a9df7f9 sweep
    (``sparse_decode_wgmma_h200_a9df7f9.md``): 27.9 against 28.7 µs for the previous default at batch 64; at
    batch 16 (three tiles a program) the two-warpgroup tiles stayed faster (16.7 against 17.6 µs)."""
    tiles = cdiv(topk, 64)
    batch = max(batch, 1)
    v_split = next((v for v in (8, 4, 2) if batch * tiles * v <= PROGRAMS), 2 if 2 * batch <= PROGRAMS else 1)
    s = splits_within(batch, topk, v_split, 64)
    rows_per_split, n_splits = split_rows(max(topk, 1), s, 64)
    if n_splits == 1 and v_split > 1 and rows_per_split >= 4 * 64:  # SPLIT_WG: each warpgroup two 32-row slots
        return {**DEFAULT_CONFIG, "BLOCK_T": 32, "STAGES": 4, "S": 1, "V_SPLIT": v_split, "WS": 1, "SPLIT_WG": 1,
                "STORE_CVT": 1}
    return {**DEFAULT_CONFIG, "BLOCK_T": 64, "S": s, "V_SPLIT": v_split, "WS": int(cdiv(rows_per_split, 64) >= 3),
            "STORE_CVT": int(n_splits == 1)}


if HAVE_GLUON:
    # renamed between Triton 3.6 (the GPU image) and 3.9: the barrier, and the cp.async copy (the old name raises)
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

    @gluon.jit
    def _launch_merge_early(PDL: gl.constexpr):
        """Programmatic dependent launch: the merge kernel (launched with ``launch_pdl``) may start now. It waits
        in-kernel (``gdc_wait``) for this whole grid to complete and its stores to land before it reads a partial, so
        only its launch and prologue overlap this kernel. Without it the merge starts as this grid's programs exit."""
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def _stamp(stamp_ptr, k: gl.constexpr, PROBE: gl.constexpr, WHAT: gl.constexpr = 0):
        """The timeline probe (``PROBE == 5``, see ``TIMELINE_STAMPS``): this program's stamp ``k``, the SM's cycle
        counter (``WHAT=0``), the GPU's nanosecond timer (1) or the SM's number (2), into its row of ``stamp_ptr``
        (int64, ``STAMPS`` a program). Every thread of the calling partition stores the same value. No code in any
        other build."""
        if PROBE == 5:
            if WHAT == 1:
                asm: gl.constexpr = "mov.u64 $0, %globaltimer;"
            elif WHAT == 2:
                asm: gl.constexpr = "cvt.u64.u32 $0, %smid;"
            else:
                asm: gl.constexpr = "mov.u64 $0, %clock64;"
            v = gl.inline_asm_elementwise(asm, "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            pid = gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)
            gl.store(stamp_ptr + pid.to(gl.int64) * 16 + k, v)  # 16: STAMPS

    @gluon.jit
    def _tile_rows(idx_base, start, end, t, offs_t):
        """Tile ``t``'s row numbers (-1 past the split's end), in ``offs_t``'s layout."""
        ot = start + t * offs_t.shape[0] + offs_t
        return gl.load(idx_base + ot, mask=ot < end, other=-1)

    @gluon.jit
    def _issue_tile(slot, kv_ptr, rows, num_rows, stride_kv, offs_d):
        """Start the ``cp.async`` copies of the rows ``rows`` into ``slot`` (zeros for padding rows); the caller
        commits the group."""
        valid = (rows >= 0) & (rows < num_rows)
        safe = gl.where(valid, rows, 0).to(gl.int64)
        _async_load(slot, kv_ptr + safe[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None])

    @gluon.jit
    def _program_split(rows_per_split, topk, BLOCK_T: gl.constexpr, V_SPLIT: gl.constexpr, DO: gl.constexpr):
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
    def _sparse_decode_wgmma_kernel(
        q_ptr, kv_ptr, idx_ptr, part_ptr, lse_ptr, out_ptr, sem_ptr,
        H, num_rows, topk, rows_per_split, qk_scale, n_splits,
        stride_qb, stride_qh, stride_kv, stride_ib,
        stride_pb, stride_ps, stride_ph,
        stride_lb, stride_ls,
        stride_ob, stride_oh,
        DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
        DIRECT: gl.constexpr, P_SMEM: gl.constexpr, V_SPLIT: gl.constexpr, STORE_CVT: gl.constexpr,
        MERGE: gl.constexpr, S_PAD: gl.constexpr, PDL: gl.constexpr = False,
    ):
        gl.static_assert(BLOCK_H == 64, "one wgmma M of heads per program")
        _launch_merge_early(PDL)
        gl.static_assert(DV == 512, "two warpgroups of 256 columns of V")
        gl.static_assert(STAGES >= 2, "a ring of at least two slots")
        gl.static_assert(V_SPLIT == 1 or V_SPLIT == 2 or V_SPLIT == 4 or V_SPLIT == 8, "all of V's columns, or 1/2, 1/4, 1/8")
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        DO: gl.constexpr = DV // V_SPLIT  # the output columns this program computes
        pid_s, pid_b, col_off, start, end, n_tiles = _program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)

        # layouts: a coalesced 16-byte-a-thread blocked layout for the copies, wgmma's for the two products (4 warps
        # along the heads, the two warpgroups side by side along the columns), 128-byte swizzled shared tiles
        copy_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_T // 2, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DO // 2, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        p_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_T * 2 if BLOCK_T < 64 else 128, element_bitwidth=16,
                                                  rank=2)
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
        _async_load(q_smem, q_ptr + pid_b.to(gl.int64) * stride_qb + offs_hq[:, None] * stride_qh + offs_d[None, :],
                    mask=(offs_hq < H)[:, None])
        async_copy.commit_group()
        kv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_T, DV], tile_sl)
        for i in gl.static_range(STAGES - 1):  # the first tiles' gathers
            if i < n_tiles:
                _issue_tile(kv_smem.index(i), kv_ptr, _tile_rows(idx_base, start, end, i, offs_t), num_rows, stride_kv,
                            offs_d)
            async_copy.commit_group()
        # indices run one tile ahead of their use (loop-carried), so no gather waits for its indices' DRAM round trip
        rows_c = _tile_rows(idx_base, start, end, STAGES - 1, offs_t)  # the next tile to gather
        rows_v = _tile_rows(idx_base, start, end, 0, offs_ts)  # the tile to compute, for its padding mask
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_T], p_sl)  # each warpgroup's half of P, for both

        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        for t in range(n_tiles):
            async_copy.wait_group(STAGES - 2)  # this thread's copies of tile t (and of q, before tile 0) have landed
            fence_async_shared()  # ... and are visible to the tensor cores' (async proxy) reads
            _thread_barrier()  # every thread's copies of tile t, and every warp is done with tile t - 1's slot
            tile = kv_smem.index(t % STAGES)
            v_tile = tile if V_SPLIT == 1 else tile.slice(0, DO, dim=1)
            s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            nxt = t + STAGES - 1  # its gather is issued while the tensor cores compute this tile's scores
            if nxt < n_tiles:
                _issue_tile(kv_smem.index(nxt % STAGES), kv_ptr, rows_c, num_rows, stride_kv, offs_d)
            async_copy.commit_group()
            rows_c = _tile_rows(idx_base, start, end, nxt + 1, offs_t)
            valid = (rows_v >= 0) & (rows_v < num_rows)
            rows_v = _tile_rows(idx_base, start, end, t + 1, offs_ts)
            s = warpgroup_mma_wait(0, deps=[s_tok])
            acc, m_i, l_i = _softmax_pv(s, valid, qk_scale, m_i, l_i, acc, p_smem, v_tile, P_SMEM, o_l, p_l)
        async_copy.wait_group(0)  # no copy outlives the program (the ring's last slots: padding rows, zeros)

        _write_result(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, sem_ptr, pid_b, pid_s, col_off, H, n_splits,
                      stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                      BLOCK_H, DO, V_SPLIT, DIRECT, STORE_CVT, MERGE, S_PAD, s_l, o_l, 8)

    @gluon.jit
    def _online_softmax(s, valid, qk_scale, m_i, scl=None, KV_SCALED: gl.constexpr = False):
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
    def _softmax_pv(s, valid, qk_scale, m_i, l_i, acc, p_smem, v_tile, P_SMEM: gl.constexpr, o_l: gl.constexpr,
                    p_l: gl.constexpr, scl=None, KV_SCALED: gl.constexpr = False):
        """One tile's online softmax on its raw scores ``s`` (padding rows masked to -inf) and O += P V: the new
        (acc, m_i, l_i). ``KV_SCALED``: the rows' scales ``scl`` multiply the scores and, for the product with the
        unscaled V, the probabilities (not their row sum)."""
        p, alpha, m_new = _online_softmax(s, valid, qk_scale, m_i, scl, KV_SCALED)
        l_i = l_i * alpha + gl.sum(p, 1)
        if KV_SCALED:
            p = p * scl[None, :]
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_l))
        if P_SMEM:  # P as wgmma's A from shared memory: each warpgroup writes its half of the columns, one barrier
            p_smem.store(p.to(p_smem.dtype))
            fence_async_shared()
            _thread_barrier()
            acc = warpgroup_mma(p_smem, v_tile, acc * alpha_o[:, None])
        else:  # P as wgmma's A from registers: both warpgroups need every column, a layout conversion
            acc = warpgroup_mma(gl.convert_layout(p.to(v_tile.dtype), p_l), v_tile, acc * alpha_o[:, None])
        return acc, m_new, l_i

    @gluon.jit
    def _write_result(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, sem_ptr, pid_b, pid_s, col_off, H, n_splits,
                      stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                      BLOCK_H: gl.constexpr, DO: gl.constexpr, V_SPLIT: gl.constexpr, DIRECT: gl.constexpr,
                      STORE_CVT: gl.constexpr, MERGE: gl.constexpr, S_PAD: gl.constexpr,
                      s_l: gl.constexpr, o_l: gl.constexpr, NW: gl.constexpr):
        """The program's normalised output: straight into ``out`` with one split, else its split-K partial and the
        log-sum-exp (base 2) of its heads (from the program with the split's first columns; with MERGE from every
        program, at its own column slice). With MERGE the last program of a request's splits (at these columns)
        to finish merges them into ``out``: no second launch."""
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_l))[:, None]
        o = o.to(out_ptr.dtype.element_ty if DIRECT else part_ptr.dtype.element_ty)  # partials: float32 or PART16's
        if STORE_CVT:  # through shared memory into a layout where a warp writes whole rows, 16 bytes or more a thread
            st_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
            o = gl.convert_layout(o, st_l)
        else:  # from the wgmma layout: 8 (float32) or 4 (16-bit) bytes a thread, 4 threads a row
            st_l: gl.constexpr = o_l
        offs_ho = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_l))
        offs_c = col_off + gl.arange(0, DO, layout=gl.SliceLayout(0, st_l))
        h_mask = (offs_ho < H)[:, None]
        vslice = col_off // DO
        if DIRECT:
            gl.store(out_ptr + pid_b.to(gl.int64) * stride_ob + offs_ho[:, None] * stride_oh + offs_c[None, :], o,
                     mask=h_mask)
        else:
            gl.store(part_ptr + pid_b.to(gl.int64) * stride_pb + pid_s * stride_ps + offs_ho[:, None] * stride_ph
                     + offs_c[None, :], o, mask=h_mask)
            offs_hs = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_l))
            lse = gl.where(l_i > 0.0, m_i + gl.log2(l_safe), float("-inf"))
            if MERGE:  # each program its own slot [split, column slice]: the merger of a slice reads its own
                gl.store(lse_ptr + pid_b.to(gl.int64) * stride_lb + (pid_s * V_SPLIT + vslice) * stride_ls + offs_hs,
                         lse, mask=offs_hs < H)
                _thread_barrier()  # every thread's stores issued before the release below
                cnt = sem_ptr + pid_b * V_SPLIT + vslice
                arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")  # releases ours, acquires the others'
                if arrived == n_splits - 1:  # the last to finish: every other split's partial is visible
                    gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # back to 0 for the next launch
                    _merge_splits(part_ptr, lse_ptr, out_ptr, pid_b, col_off, vslice, H, n_splits,
                                  stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                                  BLOCK_H, DO, V_SPLIT, S_PAD, NW)
            else:
                gl.store(lse_ptr + pid_b.to(gl.int64) * stride_lb + pid_s * stride_ls + offs_hs, lse,
                         mask=(offs_hs < H) & (col_off == 0))  # one of the V_SPLIT programs (they computed the same)

    @gluon.jit
    def _merge_splits(part_ptr, lse_ptr, out_ptr, pid_b, col_off, vslice, H, n_splits,
                      stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                      BLOCK_H: gl.constexpr, DO: gl.constexpr, V_SPLIT: gl.constexpr, S_PAD: gl.constexpr,
                      NW: gl.constexpr):
        """``launch_combine``'s merge for one request's heads at this program's DO columns, in column chunks of
        [S_PAD, 64, CW] (every split's partial in flight at once, 64 float32 a thread), the next chunk's loads issued
        before this chunk is summed, by the ``NW`` compute warps of the program. Reads bypass L1 (``.cg``): the partials
        were written by other SMs."""
        CW: gl.constexpr = (64 * 32 * NW) // (S_PAD * BLOCK_H) if (64 * 32 * NW) // (S_PAD * BLOCK_H) < DO else DO
        TC: gl.constexpr = CW // 4 if CW // 4 < 32 else 32
        ml: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32 // TC, TC], [1, NW, 1], [2, 1, 0])  # [split, head, col]
        sh_l: gl.constexpr = gl.SliceLayout(2, ml)  # [split, head]
        hc_l: gl.constexpr = gl.SliceLayout(0, ml)  # [head, col]
        offs_s = gl.arange(0, S_PAD, layout=gl.SliceLayout(1, sh_l))
        offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, sh_l))
        lse = gl.load(lse_ptr + pid_b.to(gl.int64) * stride_lb + (offs_s[:, None] * V_SPLIT + vslice) * stride_ls
                      + offs_h[None, :], mask=(offs_s < n_splits)[:, None] & (offs_h < H)[None, :],
                      other=float("-inf"), cache_modifier=".cg")
        m = gl.max(lse, 0)
        w = gl.exp2(lse - gl.where(m == float("-inf"), 0.0, m)[None, :])  # 0 for empty and absent splits
        wsum = gl.sum(w, 0)
        inv = gl.convert_layout(1.0 / gl.where(wsum > 0.0, wsum, 1.0), gl.SliceLayout(1, hc_l))
        w3 = w[:, :, None]
        offs_c = gl.arange(0, CW, layout=gl.SliceLayout(0, gl.SliceLayout(1, ml)))
        base = (part_ptr + pid_b.to(gl.int64) * stride_pb + offs_s[:, None, None] * stride_ps
                + offs_h[None, :, None] * stride_ph + col_off + offs_c[None, None, :])
        mask3 = (offs_s < n_splits)[:, None, None] & (offs_h < H)[None, :, None]
        offs_ho = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, hc_l))
        offs_co = gl.arange(0, CW, layout=gl.SliceLayout(0, hc_l))
        out_base = out_ptr + pid_b.to(gl.int64) * stride_ob + offs_ho[:, None] * stride_oh + col_off + offs_co[None, :]
        nxt = gl.load(base, mask=mask3, other=0.0, cache_modifier=".cg")
        for c in gl.static_range(DO // CW):
            cur = nxt
            if c + 1 < DO // CW:
                nxt = gl.load(base + (c + 1) * CW, mask=mask3, other=0.0, cache_modifier=".cg")
            o = gl.sum(w3 * cur.to(gl.float32), 0) * inv[:, None]
            gl.store(out_base + c * CW, o.to(out_ptr.dtype.element_ty), mask=(offs_ho < H)[:, None])

    @gluon.jit
    def _fp8_rows(idx_base, idx_smem, start, end, t, offs, IDX_TILES: gl.constexpr, LAYOUT: gl.constexpr):
        """Tile ``t``'s row numbers in ``offs``' layout (``LAYOUT``): from the producer's index table (past its last
        tile, the last tile's: such rows are never copied), or from DRAM (-1 past the split's end)."""
        if IDX_TILES > 0:
            rows = idx_smem.index(gl.minimum(t, IDX_TILES - 1)).load(LAYOUT)
        else:
            rows = _tile_rows(idx_base, start, end, t, offs)
        return rows

    @gluon.jit
    def _issue_fp8_tile(stage, sc_stage, kv_ptr, scale_ptr, rows, rows_s, num_rows, stride_kv, offs_d):
        """Start the ``cp.async`` copies of an fp8 tile's rows into ``stage`` and of their scales into ``sc_stage``
        (zeros for padding rows); the caller commits the group."""
        _issue_tile(stage, kv_ptr, rows, num_rows, stride_kv, offs_d)
        valid = (rows_s >= 0) & (rows_s < num_rows)
        _async_load(sc_stage, scale_ptr + gl.where(valid, rows_s, 0).to(gl.int64), mask=valid)

    @gluon.jit
    def _dequant_tile(stage, sc_stage, dst, dst_sc, BLOCK_T: gl.constexpr, DV: gl.constexpr,
                      GATHER_WARPS: gl.constexpr):
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

    @gluon.jit
    def _ws_gather_fp8(kv_ptr, scale_ptr, idx_base, q_smem, q_bar, kv_smem, stage_smem, sc_smem, sc_ring, ready,
                       empty, idx_smem, start, end, n_tiles, num_rows, stride_kv, col_off, DV: gl.constexpr,
                       BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr, V_SPLIT: gl.constexpr,
                       GATHER_WARPS: gl.constexpr, IDX_TILES: gl.constexpr, FP8_STAGES: gl.constexpr,
                       PROBE: gl.constexpr = 0):
        """The producer's loop for an fp8 cache: each tile's rows (512 bytes each) and their float32 scales are copied
        by ``cp.async`` into a staging ring of ``FP8_STAGES`` slots, ``FP8_STAGES - 1`` tiles ahead; once a tile has
        landed the producer widens it (:func:`_dequant_tile`) into the float16 ring slot the consumers released, with
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
                _issue_fp8_tile(stage_smem.index(i), sc_smem.index(i), kv_ptr, scale_ptr,
                                _fp8_rows(idx_base, idx_smem, start, end, i, offs_t, IDX_TILES, rl),
                                _fp8_rows(idx_base, idx_smem, start, end, i, offs_s, IDX_TILES, sc_l),
                                num_rows, stride_kv, offs_d)
            async_copy.commit_group()
        # q (its bf16 copies, the first group) to float16 in place, while the first tiles' copies are in flight
        async_copy.wait_group(FP8_STAGES - 1)
        _thread_barrier()  # every producer thread's copies of q
        qv_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [GATHER_WARPS, 1], [1, 0])
        q16 = _view(q_smem, gl.float16, [BLOCK_H, DV], gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                                           element_bitwidth=16, rank=2))
        for c in gl.static_range(DV // 64):
            q16.slice(c * 64, 64, dim=1).store(q_smem.slice(c * 64, 64, dim=1).load(qv_l).to(gl.float16))
        fence_async_shared()  # q (generic proxy writes) before the tensor cores' reads
        _thread_barrier()
        mbarrier.arrive(q_bar)
        rows_c = _fp8_rows(idx_base, idx_smem, start, end, FP8_STAGES - 1, offs_t, IDX_TILES, rl)
        rows_cs = _fp8_rows(idx_base, idx_smem, start, end, FP8_STAGES - 1, offs_s, IDX_TILES, sc_l)
        for t in range(n_tiles):
            nxt = t + FP8_STAGES - 1  # its staging slot was widened at t - 1, before that iteration's barrier
            if nxt < n_tiles and PROBE != 4:
                _issue_fp8_tile(stage_smem.index(nxt % FP8_STAGES), sc_smem.index(nxt % FP8_STAGES), kv_ptr,
                                scale_ptr, rows_c, rows_cs, num_rows, stride_kv, offs_d)
            async_copy.commit_group()
            rows_c = _fp8_rows(idx_base, idx_smem, start, end, nxt + 1, offs_t, IDX_TILES, rl)
            rows_cs = _fp8_rows(idx_base, idx_smem, start, end, nxt + 1, offs_s, IDX_TILES, sc_l)
            async_copy.wait_group(FP8_STAGES - 1)  # this thread's copies of tile t have landed
            _thread_barrier()  # ... and every producer thread's
            slot = t % STAGES
            mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
            if PROBE != 3:
                _dequant_tile(stage_smem.index(t % FP8_STAGES), sc_smem.index(t % FP8_STAGES), kv_smem.index(slot),
                              sc_ring.index(slot), BLOCK_T, DV, GATHER_WARPS)
            fence_async_shared()  # the widened tile (generic proxy writes) before the tensor cores' reads
            _thread_barrier()  # every producer thread's part of the tile is written
            mbarrier.arrive(ready.index(slot))
        async_copy.wait_group(0)  # no copy outlives the program

    @gluon.jit
    def _ws_gather(q_ptr, kv_ptr, idx_ptr, sem_ptr, q_smem, kv_smem, q_bar, ready, empty,
                   H, num_rows, topk, rows_per_split, stride_qb, stride_qh, stride_kv, stride_ib,
                   DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
                   V_SPLIT: gl.constexpr, GATHER_WARPS: gl.constexpr, PROBE: gl.constexpr,
                   idx_smem, idx_bar, IDX_TILES: gl.constexpr,
                   scale_ptr, stage_smem, sc_smem, sc_ring, FP8_STAGES: gl.constexpr):
        """WS's producer warpgroup: q, then each tile's selected rows into the ring by ``cp.async``. A slot is
        refilled once the consumers have released it (``empty``); each thread's copies arrive on the slot's
        ``ready`` barrier when they land (``cp.async.mbarrier.arrive.noinc``), so no warp waits for a copy here.
        ``PROBE=1`` (a timing probe, see ``_PROBES``): the ring's handshakes without the rows' copies.
        ``IDX_TILES`` (see :func:`index_tiles`): the split's row numbers are loaded once into ``idx_smem``
        [IDX_TILES, BLOCK_T] (-1 past the split's end) and each tile's read from there (the consumers read their
        padding masks there too, once ``idx_bar`` says the table is written); 0: loaded a tile ahead."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = _program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        copy_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [GATHER_WARPS, 1], [1, 0])
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_t = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, copy_l))
        offs_d = gl.arange(0, DV, layout=gl.SliceLayout(0, copy_l))
        if V_SPLIT > 1:  # rotated as in the single-partition kernel
            offs_d = (offs_d + col_off) % DV
        offs_hq = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, copy_l))
        _async_load(q_smem, q_ptr + pid_b.to(gl.int64) * stride_qb + offs_hq[:, None] * stride_qh + offs_d[None, :],
                    mask=(offs_hq < H)[:, None])
        if FP8_STAGES > 0:  # q is widened to float16 in place once it has landed (_ws_gather_fp8)
            async_copy.commit_group()
        else:
            async_copy.mbarrier_arrive(q_bar, increment_count=False)
        _stamp(sem_ptr, 2, PROBE)  # the timeline probe: q's copies issued
        if IDX_TILES > 0:  # every row number of the split in one round trip, then each tile's from shared memory
            il: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [GATHER_WARPS, 1], [1, 0])
            it = gl.arange(0, IDX_TILES, layout=gl.SliceLayout(1, il))
            ij = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, il))
            pos = start + it[:, None] * BLOCK_T + ij[None, :]
            _view(idx_smem, gl.int32, [IDX_TILES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(
                gl.load(idx_base + pos, mask=pos < end, other=-1))
            _thread_barrier()  # the producer's warps: every row number is in the table
            mbarrier.arrive(idx_bar)  # ... and the consumers may read it (release; their wait acquires)
        _stamp(sem_ptr, 3, PROBE)  # the index table written (without one: as the first tile's indices are asked for)
        if FP8_STAGES > 0:
            _ws_gather_fp8(kv_ptr, scale_ptr, idx_base, q_smem, q_bar, kv_smem, stage_smem, sc_smem, sc_ring, ready,
                           empty, idx_smem, start, end, n_tiles, num_rows, stride_kv, col_off, DV, BLOCK_H, BLOCK_T,
                           STAGES, V_SPLIT, GATHER_WARPS, IDX_TILES, FP8_STAGES, PROBE)
        elif IDX_TILES > 0:
            for t in range(n_tiles):
                slot = t % STAGES
                rows = idx_smem.index(t).load(gl.SliceLayout(1, copy_l))
                mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                if PROBE != 1:
                    _issue_tile(kv_smem.index(slot), kv_ptr, rows, num_rows, stride_kv, offs_d)
                async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        else:
            rows = _tile_rows(idx_base, start, end, 0, offs_t)
            for t in range(n_tiles):
                slot = t % STAGES
                rows_next = _tile_rows(idx_base, start, end, t + 1, offs_t)  # the next indices' round trip overlaps
                mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                if PROBE != 1:
                    _issue_tile(kv_smem.index(slot), kv_ptr, rows, num_rows, stride_kv, offs_d)
                async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
                rows = rows_next
        _stamp(sem_ptr, 4, PROBE)  # the last tile's copies issued

    @gluon.jit
    def _ws_compute(q_smem, kv_smem, p_smem, q_bar, ready, empty, idx_ptr, part_ptr, lse_ptr, out_ptr, sem_ptr,
                    H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                    stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                    DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
                    DIRECT: gl.constexpr, P_SMEM: gl.constexpr, V_SPLIT: gl.constexpr, STORE_CVT: gl.constexpr,
                    MERGE: gl.constexpr, S_PAD: gl.constexpr, PROBE: gl.constexpr = 0, sc_ring=None,
                    KV_SCALED: gl.constexpr = False):
        """WS's two consumer warpgroups: the single-partition kernel's loop without its copies and its block-wide
        barrier; they release a slot (one arrival: Gluon arrives once a partition, after the partition's barrier)
        once both warpgroups' products have read it."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = _program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_T // 2, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DO // 2, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))
        rows_v = _tile_rows(idx_base, start, end, 0, offs_ts)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        mbarrier.wait(q_bar, 0)
        _stamp(sem_ptr, 5, PROBE)  # the timeline probe: q has landed
        for t in range(n_tiles):
            slot = t % STAGES
            mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
            if PROBE == 5:
                if t == 0:
                    _stamp(sem_ptr, 6, PROBE)  # the first tile has landed
            fence_async_shared()  # the copies (generic proxy) before the tensor cores' reads (async proxy)
            if PROBE != 2:
                tile = kv_smem.index(slot)
                v_tile = tile if V_SPLIT == 1 else tile.slice(0, DO, dim=1)
                s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                valid = (rows_v >= 0) & (rows_v < num_rows)
                rows_v = _tile_rows(idx_base, start, end, t + 1, offs_ts)
                if KV_SCALED:
                    scl = sc_ring.index(slot).load(gl.SliceLayout(0, s_l))
                else:
                    scl = None
                s = warpgroup_mma_wait(0, deps=[s_tok])
                acc, m_i, l_i = _softmax_pv(s, valid, qk_scale, m_i, l_i, acc, p_smem, v_tile, P_SMEM, o_l, p_l, scl,
                                            KV_SCALED)
            mbarrier.arrive(empty.index(slot))  # both warpgroups' products are done with the slot
        _stamp(sem_ptr, 7, PROBE)  # the last tile's products done
        _write_result(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, sem_ptr, pid_b, pid_s, col_off, H, n_splits,
                      stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                      BLOCK_H, DO, V_SPLIT, DIRECT, STORE_CVT, MERGE, S_PAD, s_l, o_l, 8)
        _stamp(sem_ptr, 8, PROBE)  # the result written
        _stamp(sem_ptr, 13, PROBE, 1)

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.9
        @gluon.jit
        def _view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The shared buffer ``buf`` seen as ``dtype`` of ``shape`` in ``layout`` (no more bytes than it has)."""
            return buf.reinterpret(dtype, shape, layout)
    else:  # Triton 3.6 (the GPU image)
        @gluon.jit
        def _view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
            """The shared buffer ``buf`` seen as ``dtype`` of ``shape`` in ``layout`` (no more bytes than it has)."""
            return buf._reinterpret(dtype, shape, layout)

    @gluon.jit
    def _ws_compute_wg(q_smem, kv_smem, p_smem, q_bar, ready, empty, done, hand_ml, idx_ptr, part_ptr, lse_ptr,
                       out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                       stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                       DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
                       DIRECT: gl.constexpr, P_SMEM: gl.constexpr, V_SPLIT: gl.constexpr, STORE_CVT: gl.constexpr,
                       MERGE: gl.constexpr, S_PAD: gl.constexpr, WG: gl.constexpr, PROBE: gl.constexpr, idx_smem,
                       idx_bar, IDX_TILES: gl.constexpr, sc_ring=None, KV_SCALED: gl.constexpr = False):
        """SPLIT_WG's consumer warpgroup ``WG`` (0 or 1, each a worker partition): the split's tiles ``WG``,
        ``WG + 2``, ... whole (a 64 x BLOCK_T x 512 score product, its own online softmax, O += P V for the program's
        DO <= 256 columns), with no exchange with the other warpgroup until the end: then warpgroup 1 hands its
        (acc, m, l) over through shared memory (q's buffer, free once both are done) and warpgroup 0 merges the two
        as two splits and writes the result. ``done[0]``: warpgroup 0 has finished its tiles (its products no
        longer read q); ``done[1]``: warpgroup 1's state is in shared memory. A slot is always consumed by one warpgroup, in
        order (STAGES even: a slot's tiles all have one parity), so no wait runs ahead of its barrier's phase.
        Registers: with 64-row tiles at two programs a split the build spills (the sm_90 build by Triton 3.6: 392
        bytes a thread, 3.9: 216; at four programs a split 16 under 3.6): a [64, 256] float32 accumulator, a [64, 64]
        score tile and its probabilities in 208 registers. Those configs ran 0.81x their SPLIT_WG=0 twins on the
        H200 (a9df7f9); 32-row tiles do not spill under either Triton."""
        DO: gl.constexpr = DV // V_SPLIT
        pid_s, pid_b, col_off, start, end, n_tiles = _program_split(rows_per_split, topk, BLOCK_T, V_SPLIT, DO)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DO, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        p_own = p_smem.index(WG)
        mbarrier.wait(q_bar, 0)
        if IDX_TILES > 0:
            mbarrier.wait(idx_bar, 0)
        _stamp(sem_ptr, 5 + 4 * WG, PROBE)  # the timeline probe: q (and the index table) have landed
        for t in range(WG, n_tiles, 2):
            slot = t % STAGES
            mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
            if PROBE == 5:
                if t == WG:
                    _stamp(sem_ptr, 6 + 4 * WG, PROBE)  # this warpgroup's first tile has landed
            fence_async_shared()
            if PROBE != 2:
                tile = kv_smem.index(slot)
                s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                # the tile's indices (for the padding mask) load while the scores' product runs: not carried over
                # from the previous tile, as in the two-warpgroup schedule, because a warpgroup holding whole 64-row
                # tiles would keep 16 row numbers and their 64-bit addresses live across the loop (ptxas spilled them)
                if IDX_TILES > 0:  # the padding mask from the producer's table
                    rows_v = idx_smem.index(t).load(gl.SliceLayout(0, s_l))
                else:
                    rows_v = _tile_rows(idx_base, start, end, t, offs_ts)
                valid = (rows_v >= 0) & (rows_v < num_rows)
                if KV_SCALED:
                    scl = sc_ring.index(slot).load(gl.SliceLayout(0, s_l))
                else:
                    scl = None
                s = warpgroup_mma_wait(0, deps=[s_tok])
                acc, m_i, l_i = _softmax_pv(s, valid, qk_scale, m_i, l_i, acc, p_own, tile.slice(0, DO, dim=1),
                                            P_SMEM, o_l, p_l, scl, KV_SCALED)
            mbarrier.arrive(empty.index(slot))
        _stamp(sem_ptr, 7 + 4 * WG, PROBE)  # this warpgroup's last tile's products done
        hand_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        hand = _view(q_smem, gl.float32, [BLOCK_H, DO], hand_sl)  # 64 x DO float32: no more than q's 64 x 512 16-bit
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
            _write_result(acc, m_new, l_i, part_ptr, lse_ptr, out_ptr, sem_ptr, pid_b, pid_s, col_off, H, n_splits,
                          stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                          BLOCK_H, DO, V_SPLIT, DIRECT, STORE_CVT, MERGE, S_PAD, s_l, o_l, 4)
            _stamp(sem_ptr, 8, PROBE)  # the merged result written
            _stamp(sem_ptr, 13, PROBE, 1)
        else:
            mbarrier.wait(done.index(0), 0)  # warpgroup 0's products are done with q
            hand.store(acc)
            hand_ml.index(0).store(m_i)
            hand_ml.index(1).store(l_i)
            mbarrier.arrive(done.index(1))
            _stamp(sem_ptr, 12, PROBE)  # the hand-over written

    @gluon.jit
    def _seesaw_stats(m_i, l_i, t, st_smem, ready, pready, STAGES: gl.constexpr, ml_l: gl.constexpr,
                      mo_l: gl.constexpr):
        """SEESAW: the other warpgroup's tile ``t``, once it has published its P and statistics (``pready``): this
        warpgroup's running (m, l) after it, and the factor (alpha) its accumulator takes before that tile's P V."""
        slot = t % STAGES
        mbarrier.wait(pready.index(slot), (t // STAGES) & 1)
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)  # passed already (the owner waited); this thread's view
        fence_async_shared()
        l_i = l_i * st_smem.index(3 * slot).load(ml_l) + st_smem.index(3 * slot + 2).load(ml_l)
        return st_smem.index(3 * slot + 1).load(ml_l), l_i, st_smem.index(3 * slot).load(mo_l)

    @gluon.jit
    def _ws_compute_seesaw(q_smem, kv_smem, p_smem, st_smem, q_bar, ready, empty, pready, idx_ptr, part_ptr, lse_ptr,
                           out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                           stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                           DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
                           DIRECT: gl.constexpr, S_PAD: gl.constexpr, WG: gl.constexpr, idx_smem, idx_bar,
                           IDX_TILES: gl.constexpr, sc_ring=None, KV_SCALED: gl.constexpr = False):
        """SEESAW's consumer warpgroup ``WG`` (0 or 1): it owns the split's tiles ``WG``, ``WG + 2``, ... and holds
        columns ``[WG * 256, WG * 256 + 256)`` of O. For its own tile it computes the whole scores' product (64 x
        BLOCK_T x 512, once for both), the online softmax against the running max after the previous tile (which
        the other warpgroup published), publishes P and (alpha, max, row sum) in shared memory (``pready``), and
        adds P V for its columns; for the other's tile it waits for that publication and adds P V for its columns.
        Both apply every tile's statistics in order, so both end with the same (m, l) and each writes its own
        columns: no hand-over. The other's softmax runs while this one's products do. A slot is released
        (``empty``, two arrivals) once both warpgroups' products have read it."""
        DO: gl.constexpr = DV // 2
        dtype: gl.constexpr = q_smem.dtype
        pid_s, pid_b, col_off, start, end, n_tiles = _program_split(rows_per_split, topk, BLOCK_T, 1, DV)
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DO, 16])
        ml_l: gl.constexpr = gl.SliceLayout(1, s_l)
        mo_l: gl.constexpr = gl.SliceLayout(1, o_l)
        idx_base = idx_ptr + pid_b.to(gl.int64) * stride_ib
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_l))
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ml_l)
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=ml_l)
        # the accumulator is carried as wgmma's asynchronous accumulator (a product may be in flight across the
        # loop's and the branches' edges); warpgroup_mma_wait gives the tensor back
        acc_a = warpgroup_mma_init(gl.zeros([BLOCK_H, DO], gl.float32, layout=o_l))
        s_zero = gl.zeros([BLOCK_H, BLOCK_T], gl.float32, layout=s_l)
        mbarrier.wait(q_bar, 0)
        if IDX_TILES > 0:
            mbarrier.wait(idx_bar, 0)
        for t in range(WG, n_tiles, 2):
            slot = t % STAGES
            acc = warpgroup_mma_wait(0, deps=[acc_a])  # this warpgroup's product of its previous tile (t - 2)
            if t >= 2:
                mbarrier.arrive(empty.index((t - 2) % STAGES))
            mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
            fence_async_shared()
            tile = kv_smem.index(slot)
            s_tok = warpgroup_mma(q_smem, tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if IDX_TILES > 0:
                rows_v = idx_smem.index(t).load(gl.SliceLayout(0, s_l))
            else:
                rows_v = _tile_rows(idx_base, start, end, t, offs_ts)
            valid = (rows_v >= 0) & (rows_v < num_rows)
            if t >= 1:  # the other's tile t - 1: its statistics bring m_i to the max before this tile
                m_i, l_i, alpha_prev = _seesaw_stats(m_i, l_i, t - 1, st_smem, ready, pready, STAGES, ml_l, mo_l)
            else:
                alpha_prev = gl.full([BLOCK_H], 1.0, gl.float32, layout=mo_l)
            if KV_SCALED:
                scl = sc_ring.index(slot).load(gl.SliceLayout(0, s_l))
            else:
                scl = None
            s = warpgroup_mma_wait(0, deps=[s_tok])
            # this tile's softmax and its publication first: the other warpgroup's next softmax waits for them (the
            # chain from tile to tile), and nothing else stands between its wait and this publication
            p, alpha, m_i = _online_softmax(s, valid, qk_scale, m_i, scl, KV_SCALED)
            rs = gl.sum(p, 1)
            if KV_SCALED:  # both warpgroups multiply this P by the unscaled V rows
                p = p * scl[None, :]
            p_smem.index(slot).store(p.to(dtype))
            st_smem.index(3 * slot).store(alpha)
            st_smem.index(3 * slot + 1).store(m_i)
            st_smem.index(3 * slot + 2).store(rs)
            fence_async_shared()  # P (generic proxy writes) before the tensor cores' reads (the other's and ours)
            mbarrier.arrive(pready.index(slot))  # after the partition's barrier: every warp's P is written
            l_i = l_i * alpha + rs
            if t >= 1:  # then O += P V of the other's tile t - 1, and of this one (P from shared memory, where the
                # other reads it: a register layout conversion made Triton 3.6 serialise every wgmma, ptxas C7512)
                po = (t - 1) % STAGES
                acc = warpgroup_mma(p_smem.index(po), kv_smem.index(po).slice(WG * DO, DO, dim=1),
                                    acc * alpha_prev[:, None])
                mbarrier.arrive(empty.index(po))
            acc_a = warpgroup_mma(p_smem.index(slot), tile.slice(WG * DO, DO, dim=1),
                                  acc * gl.convert_layout(alpha, mo_l)[:, None], is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_a])
        if n_tiles > 0:
            if (n_tiles - 1) % 2 != WG:  # the last tile is the other's
                m_i, l_i, alpha_prev = _seesaw_stats(m_i, l_i, n_tiles - 1, st_smem, ready, pready, STAGES, ml_l, mo_l)
                po = (n_tiles - 1) % STAGES
                acc = warpgroup_mma(p_smem.index(po), kv_smem.index(po).slice(WG * DO, DO, dim=1),
                                    acc * alpha_prev[:, None])
        _write_result(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, sem_ptr, pid_b, pid_s, WG * DO, H, n_splits,
                      stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                      BLOCK_H, DO, 2, DIRECT, False, False, S_PAD, s_l, o_l, 4)

    @gluon.jit
    def _sparse_decode_wgmma_ws_kernel(
        q_ptr, kv_ptr, idx_ptr, part_ptr, lse_ptr, out_ptr, sem_ptr,
        H, num_rows, topk, rows_per_split, qk_scale, n_splits,
        stride_qb, stride_qh, stride_kv, stride_ib,
        stride_pb, stride_ps, stride_ph,
        stride_lb, stride_ls,
        stride_ob, stride_oh,
        DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_T: gl.constexpr, STAGES: gl.constexpr,
        DIRECT: gl.constexpr, P_SMEM: gl.constexpr, V_SPLIT: gl.constexpr, STORE_CVT: gl.constexpr,
        MERGE: gl.constexpr, S_PAD: gl.constexpr, GATHER_WARPS: gl.constexpr, GATHER_REGS: gl.constexpr,
        SPLIT_WG: gl.constexpr = False, WG_REGS: gl.constexpr = 0, PROBE: gl.constexpr = 0,
        IDX_TILES: gl.constexpr = 0, SEESAW: gl.constexpr = False, PDL: gl.constexpr = False,
        scale_ptr=None, FP8_STAGES: gl.constexpr = 0,
    ):
        """The warp-specialised schedule (``WS=1``): a producer warpgroup gathers, two consumer warpgroups compute;
        they meet on mbarriers, one ``ready`` and one ``empty`` per ring slot."""
        gl.static_assert(BLOCK_H == 64, "one wgmma M of heads per program")
        _stamp(sem_ptr, 0, PROBE, 1)  # the timeline probe: the program's start, its SM
        _stamp(sem_ptr, 1, PROBE)
        _stamp(sem_ptr, 14, PROBE, 2)
        _launch_merge_early(PDL)
        gl.static_assert(DV == 512, "two warpgroups of 256 columns of V")
        gl.static_assert(STAGES >= 2, "a ring of at least two slots")
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        tile_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_T * 2 if BLOCK_T < 64 else 128, element_bitwidth=16,
                                                  rank=2)
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DV], tile_sl)
        if FP8_STAGES > 0:  # an fp8 cache: the products run in float16 (e4m3 widens exactly; q is widened in place)
            mma_dtype: gl.constexpr = gl.float16
            q_mma = _view(q_smem, gl.float16, [BLOCK_H, DV], tile_sl)
        else:
            mma_dtype: gl.constexpr = dtype
            q_mma = q_smem
        kv_smem = gl.allocate_shared_memory(mma_dtype, [STAGES, BLOCK_T, DV], tile_sl)
        if SEESAW:
            p_smem = gl.allocate_shared_memory(mma_dtype, [STAGES, BLOCK_H, BLOCK_T], p_sl)  # each ring slot's P
        elif SPLIT_WG:
            p_smem = gl.allocate_shared_memory(mma_dtype, [2, BLOCK_H, BLOCK_T], p_sl)  # each warpgroup its own P
        else:
            p_smem = gl.allocate_shared_memory(mma_dtype, [BLOCK_H, BLOCK_T], p_sl)
        if IDX_TILES > 0:  # the producer's table of the split's row numbers
            idx_smem = gl.allocate_shared_memory(gl.int32, [IDX_TILES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            idx_smem = q_smem  # unused (warp_specialize takes no None)
        if FP8_STAGES > 0:  # an fp8 cache: the producer's staging ring of fp8 rows and their float32 scales
            stage_smem = gl.allocate_shared_memory(kv_ptr.dtype.element_ty, [FP8_STAGES, BLOCK_T, DV],
                                                   gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8,
                                                                        rank=2))
            sc_smem = gl.allocate_shared_memory(gl.float32, [FP8_STAGES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0]))
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
            # one arrival a consumer partition (Gluon arrives once a partition, after its barrier); SEESAW's two
            # consumers both read every slot
            mbarrier.init(empty.index(i), count=2 if SEESAW else 1)
        if SEESAW:
            gl.static_assert(V_SPLIT == 1, "each warpgroup half of all 512 columns")
            pready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            # each slot's (alpha, max, row sum) of its tile's softmax, from the owner to the other warpgroup
            st_smem = gl.allocate_shared_memory(gl.float32, [3 * STAGES, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            for i in gl.static_range(STAGES):
                mbarrier.init(pready.index(i), count=1)
            fence_async_shared()
            gl.warp_specialize([
                (_ws_gather, (q_ptr, kv_ptr, idx_ptr, sem_ptr, q_smem, kv_smem, q_bar, ready, empty,
                              H, num_rows, topk, rows_per_split, stride_qb, stride_qh, stride_kv, stride_ib,
                              DV, BLOCK_H, BLOCK_T, STAGES, V_SPLIT, GATHER_WARPS, PROBE, idx_smem, idx_bar,
                              IDX_TILES, scale_ptr, stage_smem, sc_smem, sc_ring, FP8_STAGES)),
                (_ws_compute_seesaw, (q_mma, kv_smem, p_smem, st_smem, q_bar, ready, empty, pready, idx_ptr, part_ptr,
                                      lse_ptr, out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits,
                                      stride_ib, stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob,
                                      stride_oh, DV, BLOCK_H, BLOCK_T, STAGES, DIRECT, S_PAD, 0, idx_smem, idx_bar,
                                      IDX_TILES, sc_ring, FP8_STAGES > 0)),
                (_ws_compute_seesaw, (q_mma, kv_smem, p_smem, st_smem, q_bar, ready, empty, pready, idx_ptr, part_ptr,
                                      lse_ptr, out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits,
                                      stride_ib, stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob,
                                      stride_oh, DV, BLOCK_H, BLOCK_T, STAGES, DIRECT, S_PAD, 1, idx_smem, idx_bar,
                                      IDX_TILES, sc_ring, FP8_STAGES > 0)),
            ], [4, 4], [WG_REGS, WG_REGS])
        elif SPLIT_WG:
            gl.static_assert(V_SPLIT > 1, "one warpgroup's accumulator: at most 256 columns of V")
            gl.static_assert(STAGES % 2 == 0, "each ring slot consumed by one warpgroup")
            done = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            hand_ml = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            mbarrier.init(done.index(0), count=1)
            mbarrier.init(done.index(1), count=1)
            fence_async_shared()
            # the producer is the default partition (its registers: what the two consumers leave, 88), so both
            # consumers are workers with the same register budget
            gl.warp_specialize([
                (_ws_gather, (q_ptr, kv_ptr, idx_ptr, sem_ptr, q_smem, kv_smem, q_bar, ready, empty,
                              H, num_rows, topk, rows_per_split, stride_qb, stride_qh, stride_kv, stride_ib,
                              DV, BLOCK_H, BLOCK_T, STAGES, V_SPLIT, GATHER_WARPS, PROBE, idx_smem, idx_bar,
                              IDX_TILES, scale_ptr, stage_smem, sc_smem, sc_ring, FP8_STAGES)),
                (_ws_compute_wg, (q_mma, kv_smem, p_smem, q_bar, ready, empty, done, hand_ml, idx_ptr, part_ptr, lse_ptr,
                                  out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                                  stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                                  DV, BLOCK_H, BLOCK_T, STAGES, DIRECT, P_SMEM, V_SPLIT, STORE_CVT, MERGE, S_PAD, 0,
                                  PROBE, idx_smem, idx_bar, IDX_TILES, sc_ring, FP8_STAGES > 0)),
                (_ws_compute_wg, (q_mma, kv_smem, p_smem, q_bar, ready, empty, done, hand_ml, idx_ptr, part_ptr, lse_ptr,
                                  out_ptr, sem_ptr, H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                                  stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                                  DV, BLOCK_H, BLOCK_T, STAGES, DIRECT, P_SMEM, V_SPLIT, STORE_CVT, MERGE, S_PAD, 1,
                                  PROBE, idx_smem, idx_bar, IDX_TILES, sc_ring, FP8_STAGES > 0)),
            ], [4, 4], [WG_REGS, WG_REGS])
        else:
            fence_async_shared()
            gl.warp_specialize([
                (_ws_compute, (q_mma, kv_smem, p_smem, q_bar, ready, empty, idx_ptr, part_ptr, lse_ptr, out_ptr, sem_ptr,
                               H, num_rows, topk, rows_per_split, qk_scale, n_splits, stride_ib,
                               stride_pb, stride_ps, stride_ph, stride_lb, stride_ls, stride_ob, stride_oh,
                               DV, BLOCK_H, BLOCK_T, STAGES, DIRECT, P_SMEM, V_SPLIT, STORE_CVT, MERGE, S_PAD,
                               PROBE, sc_ring, FP8_STAGES > 0)),
                (_ws_gather, (q_ptr, kv_ptr, idx_ptr, sem_ptr, q_smem, kv_smem, q_bar, ready, empty,
                              H, num_rows, topk, rows_per_split, stride_qb, stride_qh, stride_kv, stride_ib,
                              DV, BLOCK_H, BLOCK_T, STAGES, V_SPLIT, GATHER_WARPS, PROBE, idx_smem, idx_bar,
                              IDX_TILES, scale_ptr, stage_smem, sc_smem, sc_ring, FP8_STAGES)),
            ], [GATHER_WARPS], [GATHER_REGS])

# timing probes of the warp-specialised schedule: its handshakes and products without the rows' copies (what is left
# when the gathers cost nothing), its gathers and handshakes without the products (both: garbage output), and the
# previous producer, which loads each tile's indices a tile ahead instead of from its index table (a correct output)
_PROBES = {"no_copies": 1, "no_products": 2, "indices_ahead": 0,  # indices_ahead: no index table (a correct result)
           "fp8_no_widen": 3, "fp8_no_copies": 4,  # an fp8 cache: the producer's copies without widening, or neither
           "timeline": 5}  # a correct result, and each program's clock at each phase (TIMELINE_STAMPS) in _stamps
STAMPS = 16
"""The timeline probe's int64 stamps a program (a row of ``_stamps``)."""
TIMELINE_STAMPS = {
    0: "start (ns, %globaltimer)", 1: "start (clock)", 14: "SM (%smid)",
    2: "producer: q's copies issued", 3: "producer: index table written (or none)", 4: "producer: last copies issued",
    5: "consumer 0: q landed", 6: "consumer 0: first tile landed", 7: "consumer 0: last products done",
    8: "consumer 0: result written", 13: "consumer 0: end (ns, %globaltimer)",
    9: "consumer 1: q landed", 10: "consumer 1: first tile landed", 11: "consumer 1: last products done",
    12: "consumer 1: hand-over written"}
"""What each of a program's stamps is (``_probe="timeline"``): the SM's cycle counter unless named otherwise; WS has
one consumer partition (stamps 5-8), SPLIT_WG two (5-8 and 9-12); a stamp not reached stays 0."""
_FP8_PROBES = ("no_products", "fp8_no_widen", "fp8_no_copies")
_COUNTERS: dict[str, torch.Tensor] = {}


def _counters(device, n: int) -> torch.Tensor:
    """MERGE's arrival counters, one per (request, column slice): int32 zeros, kept per device and grown on demand.
    The last program of a request's splits resets its counter, so a launch leaves them at zero for the next one (and
    a CUDA graph replays without a reset). One stream at a time: two launches in flight on different streams would
    share the counters."""
    key = str(torch.device(device))
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), device=device, dtype=torch.int32)
    return buf


def sparse_decode_wgmma(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float | None = None,
                        config: dict | None = None, *, d_v: int | None = None, out: torch.Tensor | None = None,
                        kv_scale: torch.Tensor | None = None, pdl: bool | None = None, _probe: str = "",
                        _pdl_trigger: bool | None = None, _merge_programs: int = 0,
                        _stamps: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse MLA decode on Hopper tensor cores (Gluon); ``q [B, H <= 64, 512]``, ``kv [num_rows, 512]`` in q's
    dtype (bf16/fp16) or in float8 e4m3 with ``kv_scale`` (float32 ``[num_rows]``, row r holds
    ``kv[r] * kv_scale[r]``, as :func:`kernels.sparse_decode.sparse_decode` takes it: half the bytes of a 16-bit
    cache; the producer warpgroup widens each gathered tile and q to float16 and the products run in float16, so an
    fp8 cache needs WS, SPLIT_WG or SEESAW, and :meth:`SparseDecodeWgmmaKernel.fit_dtype` makes a config fit; q's
    values must fit float16, within 65504), ``indices [B, topk]`` int32 (negative
    or >= num_rows: padding); returns ``[B, H, 512]``.

    ``config``: None = the tuned config for this GPU and shape (``kernels/configs``), else :func:`default_config`;
    a dict's keys are each optional, the rest from :func:`default_config`: ``S`` (at most this many splits of the
    selected rows, see
    :func:`kernels.sparse_decode.split_rows`), ``BLOCK_T`` (rows a tile: 32 or 64), ``STAGES`` (ring slots, 2 to 4),
    ``P_SMEM`` (1: the probabilities reach the PV product through shared memory, 0: from registers), ``V_SPLIT``
    (2, 4 or 8: that many programs a split, each computes the scores and its share of V's columns, so a batch needs
    fewer splits, and fewer float32 partials, for the same number of programs; their gathers share the rows
    through L2),
    ``PART16`` (1: the split-K partials are stored in q's 16-bit dtype instead of float32, half the bytes written and
    merged, at the cost of one more rounding of each partial; the log-sum-exps stay float32), ``STORE_CVT`` (1: the
    output or partials go through shared memory into a layout of 16-byte stores, whole rows a warp; 0: straight from
    the wgmma layout, 4 threads a row, 8 bytes a thread in float32 and 4 in 16 bits), ``MERGE`` (1: no merge
    kernel; the last program of each request's splits merges them, through an arrival counter per request and
    column slice; one stream at a time, see ``_counters``), ``WS`` (1: warp-specialised,
    a fourth warpgroup issues the index loads and gathers and the two compute warpgroups only wait on mbarriers;
    0: every warp does both, with one block-wide barrier a tile), ``SPLIT_WG`` (1: the two compute warpgroups take
    alternate whole tiles, each its own softmax, merged at the end; always warp-specialised, needs V_SPLIT >= 2 and
    an even STAGES), ``SEESAW`` (1: the two compute warpgroups each hold half of all 512 columns and own alternate
    tiles' scores and softmax, publishing P to the other; warp-specialised, V_SPLIT=1, no MERGE or STORE_CVT);
    a launch is always 8 compute warps (12 warps in all with WS, SPLIT_WG or SEESAW) and 64 heads. ``pdl``: launch the merge
    kernel with programmatic dependent launch (the merge waits in-kernel for the split kernel's stores), the split
    kernel letting it start as soon as every program of its own has started (``griddepcontrol.launch_dependents``)
    where :func:`merge_starts_early` says so; None = where the GPU has it. ``_pdl_trigger`` (timing only, a correct
    result either way): True / False overrides that rule (False: the merge starts as the split kernel's programs
    exit, as before 2026-12-01). ``_merge_programs`` (timing only): the merge kernel's grid widened to at least this
    many programs (``kernels.sparse_decode.combine_grid``). ``_probe`` (timing only, the result is
    garbage but for ``indices_ahead`` and ``timeline``): a name of ``_PROBES``, for a warp-specialised config (WS,
    SPLIT_WG or SEESAW; ``no_products`` is not built for SEESAW, ``timeline`` neither, nor for MERGE); ``timeline``
    writes each program's stamps (``TIMELINE_STAMPS``) into ``_stamps`` (int64, a row of ``STAMPS`` a program,
    row ``request * programs a request + program``)."""
    if not HAVE_GLUON:
        raise RuntimeError(f"sparse_decode_wgmma: this Triton ({triton.__version__}) has no Gluon Hopper API; "
                           "use kernels.sparse_decode.sparse_decode")
    B, H, d_qk, d_v = _check_args(q, kv, indices, d_v, out, kv_scale)
    fp8 = kv.dtype != q.dtype  # _check_args: an fp8 cache with its row scales
    problems = []
    if H > WGMMA_HEADS:
        problems.append(f"heads={H} (at most {WGMMA_HEADS})")
    if d_qk != 512 or d_v != 512:
        problems.append(f"d_qk={d_qk}, d_v={d_v} (both 512)")
    if q.dtype not in (torch.bfloat16, torch.float16):
        problems.append(f"dtype {q.dtype} (bfloat16 or float16)")
    if problems:
        raise ValueError(f"sparse_decode_wgmma: {'; '.join(problems)}: use kernels.sparse_decode.sparse_decode")
    kernel = SparseDecodeWgmmaKernel.instance
    shape = _shape_of(q, kv, indices, d_v)
    if config is None:
        config = tuned_config(kernel, shape, kv.dtype, q.device)
    else:
        config = {**kernel.fit_dtype(kernel.default_config(shape), shape, kv.dtype), **config}
        kernel.require_config(config, shape, q.device, kv.dtype)
    topk = indices.shape[1]
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    rows_per_split, n_splits = split_rows(topk, config["S"], config["BLOCK_T"])
    if out is None:
        out = torch.empty((B, H, d_v), device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    direct = n_splits == 1
    merge = bool(config.get("MERGE")) and not direct
    v_split = config["V_SPLIT"]
    # the kernels' sem_ptr: MERGE's counters, the timeline probe's stamps (checked below), else unused
    sem = _counters(q.device, B * v_split) if merge else _stamps if _probe == "timeline" and _stamps is not None else out
    if direct:
        part, lse = out, out  # unused
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((B, n_splits, H, d_v), device=q.device, dtype=q.dtype if config["PART16"] else torch.float32)
        # with MERGE each program stores its heads' log-sum-exp in its own slot: [request, split * V_SPLIT + slice]
        lse = torch.empty((B, n_splits * (v_split if merge else 1), H), device=q.device, dtype=torch.float32)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    args = (q, kv, indices, part, lse, out, sem,
            H, kv.shape[0], topk, rows_per_split, sm_scale * LOG2E, n_splits,
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
            *part_strides, *lse_strides,
            out.stride(0), out.stride(1))
    meta = dict(DV=d_v, BLOCK_H=WGMMA_HEADS, BLOCK_T=config["BLOCK_T"], STAGES=config["STAGES"], DIRECT=direct,
                P_SMEM=bool(config["P_SMEM"]), V_SPLIT=v_split, STORE_CVT=bool(config["STORE_CVT"]),
                MERGE=merge, S_PAD=max(2, triton.next_power_of_2(n_splits)), num_warps=WGMMA_WARPS)
    grid = (n_splits * v_split, B)
    if not direct and not merge:
        target = gpu_target(q.device)
        pdl = (_PDL and target is not None and target >= (9, 0)) if pdl is None else bool(pdl)
        if pdl and _pdl_trigger is None:
            _pdl_trigger = merge_starts_early(grid[0] * grid[1],
                                              math.prod(combine_grid(B, n_splits, H, d_v, _merge_programs)),
                                              one_wave(q.device))
        meta["PDL"] = pdl and bool(_pdl_trigger)  # the split kernel starts the merge early
    if config.get("WS") or config.get("SPLIT_WG") or config.get("SEESAW"):
        meta["IDX_TILES"] = index_tiles(config, shape)
    if fp8:
        meta["FP8_STAGES"] = fp8_stages(config, shape)
    if _probe:
        if fp8 != (_probe in _FP8_PROBES[1:]) and _probe not in ("no_products", "timeline"):
            raise ValueError(f"sparse_decode_wgmma: _probe={_probe!r} is not built for "
                             f"{'an fp8' if fp8 else 'a 16-bit'} cache; use one of "
                             f"{list(_FP8_PROBES) if fp8 else [p for p in _PROBES if p not in _FP8_PROBES[1:]]}")
        if _probe not in _PROBES or not (config.get("WS") or config.get("SPLIT_WG") or config.get("SEESAW")):
            names = sorted(p for p in _PROBES if p not in _FP8_PROBES[1:])
            raise ValueError(f"sparse_decode_wgmma: _probe={_probe!r}: one of {names}, with WS=1, "
                             "SPLIT_WG=1 or SEESAW=1")
        if _probe == "no_products" and config.get("SEESAW"):
            raise ValueError("sparse_decode_wgmma: _probe='no_products' is not built for SEESAW=1 (its consumers "
                             "wait on each other's softmax); use no_copies or indices_ahead")
        meta["PROBE"] = _PROBES[_probe]
        if _probe == "indices_ahead":
            meta["IDX_TILES"] = 0
        if _probe == "timeline":
            programs = grid[0] * grid[1]
            if merge or config.get("SEESAW"):
                raise ValueError("sparse_decode_wgmma: _probe='timeline' is not built for MERGE=1 or SEESAW=1; use "
                                 "MERGE=0 with WS=1 or SPLIT_WG=1")
            if (_stamps is None or _stamps.dtype != torch.int64 or _stamps.device != q.device
                    or _stamps.numel() < programs * STAMPS):
                raise ValueError(f"sparse_decode_wgmma: _probe='timeline' needs _stamps, an int64 tensor on {q.device} "
                                 f"of at least {programs} x {STAMPS} values (one row a program)")
    scale = kv_scale if fp8 else kv  # unused without an fp8 cache (warp_specialize takes no None)
    if config.get("SPLIT_WG") or config.get("SEESAW"):  # the producer's 4 warps are the default partition, two
        meta["num_warps"] = 4  # 4-warp consumers: 12 warps
        _sparse_decode_wgmma_ws_kernel[grid](*args, **meta, GATHER_WARPS=GATHER_WARPS, GATHER_REGS=GATHER_REGS,
                                             SPLIT_WG=not config.get("SEESAW"), SEESAW=bool(config.get("SEESAW")),
                                             WG_REGS=WG_REGS, maxnreg=WS_MAXNREG, scale_ptr=scale)
    elif config.get("WS"):
        _sparse_decode_wgmma_ws_kernel[grid](*args, **meta, GATHER_WARPS=GATHER_WARPS, GATHER_REGS=GATHER_REGS,
                                             maxnreg=WS_MAXNREG, scale_ptr=scale)
    else:
        _sparse_decode_wgmma_kernel[grid](*args, **meta)
    if not direct and not merge:
        launch_combine(part, lse, out, pdl, _merge_programs)
    return out


class SparseDecodeWgmmaKernel(_SparseDecodeBase):
    """The Gluon Hopper kernel, ``sparse_decode_wgmma``, as the kernel search and the tuned-config files see it: 64
    heads of 512 at most, a 16-bit cache or an fp8 one with row scales, an sm_90 GPU (Gluon does not run in the Triton interpreter)."""

    name = "sparse_decode_wgmma"
    dtypes = ("bfloat16", "float16", "float8_e4m3fn")
    switches = ("P_SMEM", "PART16", "STORE_CVT", "WS", "MERGE", "SPLIT_WG", "SEESAW")
    instance: SparseDecodeWgmmaKernel

    def unavailable(self):
        if not HAVE_GLUON:
            return f"this Triton ({triton.__version__}) has no Gluon Hopper API"
        if not torch.cuda.is_available():
            return "it needs an sm_90 CUDA GPU (Gluon kernels do not run in the Triton interpreter)"
        cc = torch.cuda.get_device_capability()
        if cc != (9, 0):
            return f"it needs compute capability 9.0 (wgmma); this GPU is {cc[0]}.{cc[1]}"
        return None

    def default_config(self, shape):
        return default_config(shape["batch"], shape["topk"])

    def fit_dtype(self, config, shape, dtype):
        """An fp8 cache: the warp-specialised producer widens its rows (``WS=1`` where the config has no producer
        warpgroup), and the 16-bit ring gives up slots (two at least, an even count with SPLIT_WG) until two fp8
        staging slots fit beside it (:func:`fp8_stages`); where even two slots of 64-row tiles leave no room (q's 64
        KiB, the ring's 128 and two 32 KiB staging slots are over the block's 227), 32-row tiles (the same splits)."""
        if dtype_of(dtype) != _FP8:
            return config
        out = dict(config)
        if not (out.get("WS") or out.get("SPLIT_WG") or out.get("SEESAW")):
            out["WS"] = 1
        for block_t in dict.fromkeys((out["BLOCK_T"], 32)):
            fit = {**out, "BLOCK_T": block_t}
            while fp8_stages(fit, shape) < 2 and fit["STAGES"] > 2:
                fit["STAGES"] -= 2 if fit.get("SPLIT_WG") else 1
            if fp8_stages(fit, shape) >= 2:
                return fit
        return out

    def adapt_config(self, config, tuned_shape, shape):
        """A config tuned at another batch keeps its tiles, ring and switches, but its split count is set for this
        batch: the most splits (``splits_within``) that keep ``batch * V_SPLIT * S`` within one wave of programs (a
        batch-16 config of 4 splits of two programs would launch 192 programs at batch 24, 256 at 32: 27.4 and 28.8
        µs against 20.4 and 21.7 with the splits set, ``sparse_decode_wgmma_batches_h200_470243f.md``). Where even one
        split does not fit (``V_SPLIT * batch`` over one wave: the GPU's SMs, :func:`one_wave`), this batch's default
        config."""
        if shape["batch"] == tuned_shape["batch"]:
            return config
        if config["V_SPLIT"] * shape["batch"] > one_wave():
            return self.default_config(shape)
        return {**config, "S": splits_within(shape["batch"], shape["topk"], config["V_SPLIT"], config["BLOCK_T"])}

    def config_space(self, shape):
        return {"S": [1, 2, 3, 4, 5, 8, 10, 16, 20], "BLOCK_T": [32, 64], "STAGES": [2, 3, 4], "P_SMEM": [0, 1],
                "V_SPLIT": [1, 2, 4, 8], "PART16": [0, 1], "STORE_CVT": [0, 1], "WS": [0, 1],
                "MERGE": [0, 1], "SPLIT_WG": [0, 1], "SEESAW": [0, 1]}

    def canonical_config(self, config, shape):
        """The smallest S of the space that splits the rows the same way at this tile size (S = 16 and 10 both make
        ten 64-row splits of 640 rows), float32 partials and no MERGE where there is one split (no partials), and WS
        with SPLIT_WG (which is a warp-specialised schedule either way)."""
        if "S" not in config or "BLOCK_T" not in config:
            return config
        split = split_rows(shape["topk"], config["S"], config["BLOCK_T"])
        s = min((v for v in self.config_space(shape)["S"] if split_rows(shape["topk"], v, config["BLOCK_T"]) == split),
                default=config["S"])
        out = {**config, "S": s}
        for key in ("PART16", "MERGE"):  # nothing to store or merge with one split
            if split[1] == 1 and key in out:
                out[key] = 0
        if out.get("SPLIT_WG") or out.get("SEESAW"):  # always the warp-specialised schedule
            out["WS"] = 1
        if out.get("SEESAW") and "P_SMEM" in out:  # P always reaches the other warpgroup through shared memory
            out["P_SMEM"] = 0
        return out

    def smem_bytes(self, config, shape):
        """:meth:`smem_bytes_without_table` and the producer's index table where it is used (:func:`index_tiles`)."""
        return self.smem_bytes_without_table(config, shape) + 4 * index_tiles(config, shape) * config["BLOCK_T"]

    @staticmethod
    def smem_bytes_without_table(config, shape):
        """q, the ring of gathered tiles and P's tile with P_SMEM (one a warpgroup with SPLIT_WG), 16-bit each, and
        the sm_90 build's scratch: 4 KiB of layout conversions and the mbarriers, and with WS the converted stores'
        (STORE_CVT) staging of the program's [64, DO] result, which the warp-specialised build does not overlay on
        the ring: 64 x DO bytes (less the 4 KiB it shares with the rest with WS, all of it with SPLIT_WG). Read off
        the Triton 3.6 builds (``tests/kernels/compile_probe.py``): this is at most 4 KiB over them (the test
        ``test_the_wgmma_shared_memory_rule_bounds_the_sm90_build`` checks it); 229420 bytes for a WS config of
        64-row tiles, one program a split and converted stores, 237612 with P_SMEM too (over the H200's 227 KiB:
        it failed to launch before this rule counted the staging)."""
        p_tiles = config["STAGES"] if config.get("SEESAW") else config["P_SMEM"] * (2 if config.get("SPLIT_WG") else 1)
        scratch = 4096 + 128
        if config.get("SEESAW"):  # each slot's (alpha, max, row sum) and its P barrier
            scratch += config["STAGES"] * (3 * WGMMA_HEADS * 4 + 8)
        if config.get("WS") and config.get("STORE_CVT"):
            do = shape["d_v"] // config["V_SPLIT"]
            scratch += 64 * do if config.get("SPLIT_WG") else max(0, 64 * do - 4096)
        return 2 * (WGMMA_HEADS * shape["d_qk"] + config["STAGES"] * config["BLOCK_T"] * shape["d_qk"]
                    + p_tiles * WGMMA_HEADS * config["BLOCK_T"]) + scratch

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        if shape["heads"] > WGMMA_HEADS:
            return f"heads: {shape['heads']} > {WGMMA_HEADS} (one wgmma M of heads a program)"
        if shape["d_qk"] != 512 or shape["d_v"] != 512:
            return f"width: d_qk={shape['d_qk']}, d_v={shape['d_v']} (both 512: two warpgroups of 256 columns)"
        space = self.config_space(shape)
        for key in ("BLOCK_T", "STAGES", "V_SPLIT"):  # the values the kernel compiles for: those of its space
            allowed = tuple(space[key])
            if config[key] not in allowed:
                return f"{key.lower()}: {key}={config[key]} must be one of {allowed}"
        if config.get("SPLIT_WG") and (config["V_SPLIT"] == 1 or config["STAGES"] % 2):
            return (f"split_wg: SPLIT_WG=1 needs V_SPLIT >= 2 (one warpgroup holds the program's columns: 256 at "
                    f"most) and an even ring (each slot read by one warpgroup); got V_SPLIT={config['V_SPLIT']}, "
                    f"STAGES={config['STAGES']}")
        if config.get("SEESAW") and (config.get("SPLIT_WG") or config["V_SPLIT"] != 1 or config.get("MERGE")
                                     or config.get("STORE_CVT")):
            return (f"seesaw: SEESAW=1 needs V_SPLIT=1 (its two warpgroups hold all 512 columns), SPLIT_WG=0, MERGE=0 "
                    f"and STORE_CVT=0; got V_SPLIT={config['V_SPLIT']}, SPLIT_WG={config.get('SPLIT_WG', 0)}, "
                    f"MERGE={config.get('MERGE', 0)}, STORE_CVT={config.get('STORE_CVT', 0)}")
        smem, limit = self.smem_bytes(config, shape), device_limits(device)["shared_memory"]
        if smem > limit:
            return f"shared_memory: {smem // 1024} KiB > {limit // 1024} KiB"
        if dtype is not None and dtype_of(dtype) == _FP8:
            if not (config.get("WS") or config.get("SPLIT_WG") or config.get("SEESAW")):
                return ("fp8_cache: an fp8 cache needs the producer warpgroup that widens its rows (WS=1, SPLIT_WG=1 "
                        "or SEESAW=1); got WS=0")
            if fp8_stages(config, shape) < 2:
                per = config["BLOCK_T"] * (shape["d_qk"] + 4)
                return (f"shared_memory: an fp8 cache needs two staging slots of {per // 1024} KiB beside "
                        f"{smem // 1024} KiB (at most {SM90_SMEM // 1024} KiB); lower STAGES or BLOCK_T")
        return None

    def shapes(self, preset="v4flash"):
        if preset == "test":  # the widths it runs, few heads and rows: the GPU tests' quick shape
            return [{"batch": 3, "heads": 16, "d_qk": 512, "d_v": 512, "topk": 40, "num_rows": 97, "ragged": 1}]
        if preset != "v4flash":
            raise ValueError(f"unknown preset {preset!r} for {self.name}; use 'v4flash' or 'test' (64 heads of 512 "
                             "at most)")
        return super().shapes(preset)

    def run(self, inputs, config=None, out=None):
        return sparse_decode_wgmma(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], config,
                                   d_v=inputs["d_v"], out=out, kv_scale=inputs.get("kv_scale"))


SparseDecodeWgmmaKernel.instance = SparseDecodeWgmmaKernel()
