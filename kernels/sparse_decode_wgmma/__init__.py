"""Sparse MLA decode for Hopper written in Gluon: 64-head tiles on ``wgmma``, gathered rows in a ``cp.async`` ring.

The computation of :func:`kernels.sparse_decode.sparse_decode` (its docstring has the maths) for the shapes
V4-Flash serves: 64 query heads a request, one shared K=V latent row of 512 columns, a 16-bit cache or an fp8 one
with a float32 scale a row. The ``tl.dot`` kernel waits for each tile's gather before its products (Triton's
pipeliner does not overlap an indirect gather); Gluon states the schedule instead. What ships
(:func:`default_config`, the H200's tuned configs in ``kernels/tuned``), at V4-Flash's batches on an H200:

- one program per (request, split of the selected rows, ``V_SPLIT`` share of V's columns), all 64 heads; q
  [64, 512] in shared memory for the whole program; the selected rows of each ``BLOCK_T`` tile copied by
  ``cp.async`` into a ring of ``STAGES`` slots, the copies of later tiles in flight during this tile's products;
  S = q K^T and O += P V on ``wgmma`` reading the same shared tile (V is the first 512 columns of K), so each row
  leaves DRAM once;
- batch 1 (10 tiles a request): ten 64-row splits, eight programs a split, every warp both gathers and computes;
- batch 16: four splits of 160 rows, two programs a split, warp-specialised (``WS``: a producer warpgroup issues
  every gather and two consumer warpgroups wait on mbarriers), since a program walks three tiles or more;
- batch 64: one split, two programs a request, ``SPLIT_WG`` (the two consumer warpgroups take alternate whole
  32-row tiles from a ring of four, each its own softmax, merged at the end), converted 16-byte stores;
- more than one split: float32 partials merged by :func:`kernels.sparse_decode_common.launch_combine`, launched with
  programmatic dependent launch, started early where it fits the SMs the split kernel leaves idle;
- an fp8 cache: the producer copies fp8 rows and scales into a staging ring, widens each landed tile to float16
  (exact) into the 16-bit ring, and the consumers apply the scales to the scores and probabilities
  (:meth:`SparseDecodeWgmmaKernel.fit_dtype`).

Modules: :mod:`.rules` (default config, split counts, shared memory), :mod:`.gluon_parts` and
:mod:`.gluon_kernels` (device code), :mod:`.launch` (the launcher and the tunable kernel). The measurements behind
each choice, and the variants tried and removed, are in ``benchmarks/results/sparse_decode_history.md``.
Needs an sm_90 GPU and a Triton with Gluon's Hopper API (3.6 on the GPU image; the compile tests also run on 3.9).
"""

from __future__ import annotations

from ..sparse_decode_common import one_wave
from .gluon_parts import HAVE_GLUON
from .launch import SparseDecodeWgmmaKernel, sparse_decode_wgmma
from .rules import (
    DEFAULT_CONFIG,
    EARLY_MERGE_PER_IDLE_SM,
    WGMMA_HEADS,
    WGMMA_WARPS,
    default_config,
    fp8_stages,
    index_tiles,
    merge_starts_early,
    programs,
    smem_limit,
    splits_within,
)

__all__ = [
    "DEFAULT_CONFIG",
    "EARLY_MERGE_PER_IDLE_SM",
    "HAVE_GLUON",
    "WGMMA_HEADS",
    "WGMMA_WARPS",
    "SparseDecodeWgmmaKernel",
    "default_config",
    "fp8_stages",
    "index_tiles",
    "merge_starts_early",
    "one_wave",
    "programs",
    "smem_limit",
    "sparse_decode_wgmma",
    "splits_within",
]
