"""The wgmma kernel's host-side rules: its default config (the schedule that ships, by batch), the split count that
keeps one wave of programs, the producer's index table and fp8 staging slots, the shared memory a config takes,
and when the split kernel starts its merge early. Measurements cited are H200 runs (``benchmarks/results/``)."""

from __future__ import annotations

import functools

import torch
import triton

from ..base import cdiv, device_limits
from ..sparse_decode_common import one_wave, split_rows

__all__ = [
    "DEFAULT_CONFIG",
    "EARLY_MERGE_PER_IDLE_SM",
    "FP8_STAGES_MAX",
    "WGMMA_HEADS",
    "WGMMA_WARPS",
    "default_config",
    "fp8_stages",
    "index_tiles",
    "merge_starts_early",
    "programs",
    "smem_bytes",
    "smem_bytes_without_table",
    "smem_limit",
    "splits_within",
]


@functools.lru_cache(maxsize=1)
def smem_limit() -> int:
    """A block's opt-in shared memory on this process's GPU (227 KiB on an sm_90 GPU; that, without a GPU)."""
    return device_limits("cuda" if torch.cuda.is_available() else None)["shared_memory"]


WGMMA_HEADS = 64  # one wgmma M: every head of a V4-Flash request in one program
WGMMA_WARPS = (
    8  # two warpgroups: each holds a [64, 256 / V_SPLIT] float32 accumulator (128 / V_SPLIT registers a thread)
)
DEFAULT_CONFIG = {
    "S": 8,
    "BLOCK_T": 64,
    "STAGES": 2,
    "V_SPLIT": 1,
    "STORE_CVT": 0,
    "WS": 0,
    "SPLIT_WG": 0,
}  # S, V_SPLIT: see default_config


def programs(sms: int | None = None) -> int:
    """:func:`default_config`'s budget of programs for ``V_SPLIT``: the GPU's SMs (``sms``, default
    :func:`one_wave`: this process's GPU, an H200's 132 without one) rounded down to a multiple of 8, the largest
    ``V_SPLIT``, so every program count it picks is whole splits: 128 on a 132-SM GPU."""
    sms = sms or one_wave()
    return max(8, sms - sms % 8)


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
    few SMs while the rest of it starts late. Early while the merge has at most ``EARLY_MERGE_PER_IDLE_SM`` programs
    for each idle SM; never with no SM idle (the measurements:
    ``benchmarks/results/sparse_decode_wgmma_pdl/``)."""
    idle = sms - programs
    return idle > 0 and merge_programs <= EARLY_MERGE_PER_IDLE_SM * idle


def index_tiles(config: dict, shape: dict) -> int:
    """Rows of the producer's index table (``IDX_TILES``, a power of two of ``BLOCK_T``-row tiles): with SPLIT_WG the
    producer loads its split's row numbers once, at the start, into shared memory, and issues each tile's gathers
    from there, and each compute warpgroup reads its tile's padding mask there. The WS schedule's consumers carry
    their masks a tile ahead instead. 0 (no table) without SPLIT_WG, and where the table would pass
    ``IDX_TABLE_MAX`` or the block's shared memory (``benchmarks/results/sparse_decode_wgmma_locality/``)."""
    if not config.get("SPLIT_WG"):
        return 0
    rows_per_split, _ = split_rows(max(shape["topk"], 1), config["S"], config["BLOCK_T"])
    tiles = triton.next_power_of_2(cdiv(rows_per_split, config["BLOCK_T"]))
    nbytes = tiles * config["BLOCK_T"] * 4
    fits = nbytes <= IDX_TABLE_MAX and smem_bytes_without_table(config, shape) + nbytes <= smem_limit()
    return tiles if fits else 0


def splits_within(batch: int, topk: int, v_split: int, block_t: int, sms: int | None = None) -> int:
    """The most splits of ``topk`` rows (whole ``block_t`` tiles, :func:`kernels.sparse_decode.split_rows`) that keep
    ``batch * v_split * splits`` within one wave (``sms``, default :func:`one_wave`: one program an SM); 1 where
    even one split does not. A second wave costs more than the splits it adds
    (``benchmarks/results/sparse_decode_wgmma_batches/``)."""
    tiles = cdiv(max(topk, 1), block_t)
    return next(
        (
            n
            for n in (split_rows(max(topk, 1), s, block_t)[1] for s in range(tiles, 0, -1))
            if batch * v_split * n <= (sms or one_wave())
        ),
        1,
    )


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


def default_config(batch: int, topk: int, sms: int | None = None) -> dict:
    """The schedule that ships, by batch, for a GPU of ``sms`` SMs (default :func:`one_wave`: this process's GPU).

    - ``V_SPLIT`` (programs a split): the most of 8, 4, 2 that keeps one program a 64-row tile within
      :func:`programs` (``batch * tiles * V_SPLIT``: 8 at batch 1 with V4-Flash's 10 tiles), else 2 while two
      programs a request fit, else 1: for the same number of programs, fewer splits store and merge fewer float32
      partials.
    - ``S``: the most splits of whole 64-row tiles that keep ``batch * V_SPLIT * S`` within one wave
      (:func:`splits_within`).
    - ``WS`` (the producer warpgroup) where a program walks three tiles or more; ``STORE_CVT`` (16-byte stores of
      the output) where there is one split.
    - ``SPLIT_WG`` (each compute warpgroup whole tiles, alternately) where one split walks four 64-row tiles or more
      (batch 64 at V4-Flash), with 32-row tiles in a ring of four, so each warpgroup has two slots in flight.

    At V4-Flash's batches on an H200: 10 splits of 64 rows, eight programs each, single-partition (batch 1); 4 splits
    of 160 rows, two programs each, WS (batch 16); one split of 640, two programs a request, SPLIT_WG, converted
    stores (batch 64). The sweeps behind each rule are in ``benchmarks/results/sparse_decode_wgmma/``."""
    tiles = cdiv(topk, 64)
    batch = max(batch, 1)
    budget = programs(sms)
    v_split = next((v for v in (8, 4, 2) if batch * tiles * v <= budget), 2 if 2 * batch <= budget else 1)
    s = splits_within(batch, topk, v_split, 64, sms)
    rows_per_split, n_splits = split_rows(max(topk, 1), s, 64)
    if n_splits == 1 and v_split > 1 and rows_per_split >= 4 * 64:  # SPLIT_WG: each warpgroup two 32-row slots
        return {
            **DEFAULT_CONFIG,
            "BLOCK_T": 32,
            "STAGES": 4,
            "S": 1,
            "V_SPLIT": v_split,
            "WS": 1,
            "SPLIT_WG": 1,
            "STORE_CVT": 1,
        }
    return {
        **DEFAULT_CONFIG,
        "BLOCK_T": 64,
        "S": s,
        "V_SPLIT": v_split,
        "WS": int(cdiv(rows_per_split, 64) >= 3),
        "STORE_CVT": int(n_splits == 1),
    }


def smem_bytes(config: dict, shape: dict) -> int:
    """:meth:`smem_bytes_without_table` and the producer's index table where it is used (:func:`index_tiles`)."""
    return smem_bytes_without_table(config, shape) + 4 * index_tiles(config, shape) * config["BLOCK_T"]


def smem_bytes_without_table(config: dict, shape: dict) -> int:
    """q and the ring of gathered tiles, 16-bit each, and the sm_90 build's scratch: 4 KiB of layout conversions and
    the mbarriers, and with WS the converted stores' (STORE_CVT) staging of the program's [64, DO] result, which the
    warp-specialised build does not overlay on the ring: 64 x DO bytes (less the 4 KiB it shares with the rest with
    WS, all of it with SPLIT_WG). Read off the Triton builds of the sm_90 compile tests (``tests/kernels``): at most
    4 KiB over them (``test_the_wgmma_shared_memory_rule_bounds_the_sm90_build``)."""
    scratch = 4096 + 128
    if config.get("WS") and config.get("STORE_CVT"):
        do = shape["d_v"] // config["V_SPLIT"]
        scratch += 64 * do if config.get("SPLIT_WG") else max(0, 64 * do - 4096)
    return 2 * (WGMMA_HEADS * shape["d_qk"] + config["STAGES"] * config["BLOCK_T"] * shape["d_qk"]) + scratch
