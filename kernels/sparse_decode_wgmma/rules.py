"""The wgmma kernel's host-side rules: its default config (the schedule that ships, by batch), the split count that
keeps one wave of programs, the producer's index table and fp8 staging slots, the shared memory a config takes,
and when the split kernel starts its merge early. Measurements cited are H200 runs (``benchmarks/results/``)."""

from __future__ import annotations

import functools

import torch
import triton

from ..base import cdiv, device_limits
from ..sparse_decode_common import one_wave, split_rows

__all__ = ["DEFAULT_CONFIG", "EARLY_MERGE_PER_IDLE_SM", "FP8_STAGES_MAX", "WGMMA_HEADS", "WGMMA_WARPS", "default_config",
           "fp8_stages", "index_tiles", "merge_starts_early", "smem_bytes", "smem_bytes_without_table", "smem_limit",
           "splits_within"]


@functools.lru_cache(maxsize=1)
def smem_limit() -> int:
    """A block's opt-in shared memory on this process's GPU (227 KiB on an sm_90 GPU; that, without a GPU)."""
    return device_limits("cuda" if torch.cuda.is_available() else None)["shared_memory"]


WGMMA_HEADS = 64  # one wgmma M: every head of a V4-Flash request in one program
WGMMA_WARPS = 8  # two warpgroups: each holds a [64, 256 / V_SPLIT] float32 accumulator (128 / V_SPLIT registers a thread)
DEFAULT_CONFIG = {"S": 8, "BLOCK_T": 64, "STAGES": 2, "P_SMEM": 0, "V_SPLIT": 1, "PART16": 0, "STORE_CVT": 0, "WS": 0,
                  "MERGE": 0, "SPLIT_WG": 0, "SEESAW": 0}  # S, V_SPLIT: see default_config
PROGRAMS = 128  # default_config's budget of programs for V_SPLIT (the H200 sweeps' choice, under its 132 SMs)
# WS=1: a producer warpgroup beside the two consumer ones. Registers are granted per warpgroup: the launch caps all
# 384 threads at WS_MAXNREG (65536 / 384, rounded down to 8), and the producer hands all but GATHER_REGS of its
# share to the consumers (setmaxnreg), which then hold 168 + (168 - GATHER_REGS) / 2.
GATHER_WARPS = 4
GATHER_REGS = 88
WS_MAXNREG = 168
WG_REGS = 208  # SPLIT_WG: each consumer warpgroup's registers (the producer, the default partition, keeps the rest: 88)
IDX_TABLE_MAX = 8192  # bytes: SPLIT_WG's producer keeps its split's row numbers in shared memory up to this
EARLY_MERGE_PER_IDLE_SM = 8
"""The split kernel starts its PDL-launched merge at once (:func:`merge_starts_early`) while the merge has at most
this many programs for each SM the split kernel leaves idle."""


def merge_starts_early(programs: int, merge_programs: int, sms: int) -> bool:
    """Whether the split kernel (``programs``, one a resident block) should let its merge kernel (``merge_programs``)
    start at once rather than as its own programs exit. Started early, the merge's programs land on the SMs the split
    kernel leaves idle and wait there: its launch overlaps the split kernel, but a merge of many programs crowds those
    few SMs while the rest of it starts late. Each batch's default timed both ways on an H200 (2026-12-01,
    ``benchmarks/results/sparse_decode_wgmma_pdl/h200/2026-12-01_a387428.md``; at exit / early, above 1: early
    pays), by the merge's programs for
    each idle SM: 2.5 (batch 1) 1.11x, 4.9 (batch 2) 1.03x, 9.8 (batches 4 and 8) 0.94x and 1.01x, 32-512 (batches 3,
    6, 12, 16, 32) 0.85-1.00x; with no SM idle (batch 24, 144 programs) 1.02x, left at exit."""
    idle = sms - programs
    return idle > 0 and merge_programs <= EARLY_MERGE_PER_IDLE_SM * idle


def index_tiles(config: dict, shape: dict) -> int:
    """Rows of the producer's index table (``IDX_TILES``, a power of two of ``BLOCK_T``-row tiles): with SPLIT_WG the
    producer loads its split's row numbers once, at the start, into shared memory, and issues each tile's gathers
    from there, and each compute warpgroup reads its tile's padding mask there (not a global load a tile, which its
    scores' product waited for). Measured side by side against the previous producer and consumers
    (``benchmarks/results/sparse_decode_wgmma_locality/h200/2026-12-01_8fe2a9d.md``): 1.07x at the batch-64 default
    (26.0 against 27.8 µs); the WS schedule's consumers already carried their mask a tile ahead, and there a table
    for the producer alone measured 0.97-1.00x (b68f14f, c63889b, b4f8724), so WS keeps loading indices a tile ahead.
    SEESAW's consumers read their masks there too. 0 (no table) without SPLIT_WG or SEESAW, and where the table would
    pass ``IDX_TABLE_MAX`` or the block's shared memory."""
    if not (config.get("SPLIT_WG") or config.get("SEESAW")):
        return 0
    rows_per_split, _ = split_rows(max(shape["topk"], 1), config["S"], config["BLOCK_T"])
    tiles = triton.next_power_of_2(cdiv(rows_per_split, config["BLOCK_T"]))
    nbytes = tiles * config["BLOCK_T"] * 4
    fits = nbytes <= IDX_TABLE_MAX and smem_bytes_without_table(config, shape) + nbytes <= smem_limit()
    return tiles if fits else 0


def splits_within(batch: int, topk: int, v_split: int, block_t: int, sms: int | None = None) -> int:
    """The most splits of ``topk`` rows (whole ``block_t`` tiles, :func:`kernels.sparse_decode.split_rows`) that keep
    ``batch * v_split * splits`` within one wave (``sms``, default ``kernels.sparse_decode.one_wave``: one program an
    SM); 1 where even
    one split does not. Measured
    on an H200 (2026-12-01, ``benchmarks/results/sparse_decode_wgmma_batches/h200/2026-12-01_470243f.md``): a
    second wave costs 1.3-1.5x (batch 24:
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
    free = smem_limit() - smem_bytes(config, shape) - ring_scales
    return max(0, min(FP8_STAGES_MAX, free // per))


def default_config(batch: int, topk: int) -> dict:
    """About one program per SM, 64-row tiles. Programs a split (``V_SPLIT``): the most of 8, 4, 2 that keeps one
    program a tile within 128 programs (batch * tiles * V_SPLIT <= 128: 8 at batch 1 with V4-Flash's 10 tiles), else
    2 while two programs a request fit in 128 (batch <= 64), else 1: for the same number of programs, fewer splits
    store and merge fewer float32 partials. ``S``: the most splits of whole 64-row tiles that keep
    ``batch * V_SPLIT * S`` within one wave (one program an SM) (:func:`splits_within`; before 2026-12-01
    ``S = ceil(128 / (batch * V_SPLIT))``, which launched a second wave at 108 of the batches up to 132, e.g. 144
    programs at batch 24: 27.0 against 20.4 µs now).
    ``WS`` (the producer warpgroup) where a program walks three tiles or more: its gain grew with the tiles a program
    walks (medians over batch 1 / 16 / 64: 0.975-0.984x at one tile, 0.99-1.00x at two, 1.01-1.03x at three,
    1.04-1.06x at four or more; the WS table of
    ``benchmarks/results/sparse_decode_wgmma/h200/2026-12-01_b1b01f3.md``). ``STORE_CVT`` where
    there is one split: the bf16 output from the wgmma layout is written in 4-byte stores (half sectors).
    On the H200 this names the fastest float32-partial config of the newest sweep at each batch (b1b01f3,
    ``benchmarks/results/sparse_decode_wgmma/h200/2026-12-01_b1b01f3.md``: 9.4 / 16.4 / 28.5 µs): 10 splits of 64
    rows, eight
    programs each, single-partition; 4 splits of 160 rows, two each, WS; one split of 640, two programs a request,
    WS, converted stores (batches between these were not measured). Float32 partials (``PART16=0``): 16-bit partials
    through the converted stores were no faster at batch 1 (9.5 against 9.4 µs) and bring the rounding error of a
    bf16 output against the float32 reference from 0.0020 to 0.0024.
    ``SPLIT_WG`` (each compute warpgroup whole tiles, alternately) where one split walks four 64-row tiles or more
    (batch 64 at V4-Flash): with 32-row tiles in a ring of four, so each warpgroup has two slots in flight (with
    64-row tiles only two slots fit beside q, one each, and SPLIT_WG was 0.81x). The a9df7f9 sweep
    (``benchmarks/results/sparse_decode_wgmma/h200/2026-12-01_a9df7f9.md``): 27.9 against 28.7 µs for the previous
    default at batch 64; at
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


def smem_bytes(config: dict, shape: dict) -> int:
    """:meth:`smem_bytes_without_table` and the producer's index table where it is used (:func:`index_tiles`)."""
    return smem_bytes_without_table(config, shape) + 4 * index_tiles(config, shape) * config["BLOCK_T"]


def smem_bytes_without_table(config: dict, shape: dict) -> int:
    """q, the ring of gathered tiles and P's tile with P_SMEM (one a warpgroup with SPLIT_WG), 16-bit each, and
    the sm_90 build's scratch: 4 KiB of layout conversions and the mbarriers, and with WS the converted stores'
    (STORE_CVT) staging of the program's [64, DO] result, which the warp-specialised build does not overlay on
    the ring: 64 x DO bytes (less the 4 KiB it shares with the rest with WS, all of it with SPLIT_WG). Read off
    the Triton 3.6 builds (the sm_90 compile tests of ``tests/kernels``): this is at most 4 KiB over them (the test
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
