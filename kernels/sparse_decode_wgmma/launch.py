"""The wgmma kernel's launcher and its tunable-kernel description (the kernel search's and tuned files' view)."""

from __future__ import annotations

import math

import torch
import triton

from ..base import device_limits, dtype_of, gpu_target
from ..configs import tuned_config
from ..sparse_decode_common import (
    FP8,
    LOG2E,
    PDL,
    SparseDecodeBase,
    check_args,
    combine_grid,
    launch_combine,
    one_wave,
    shape_of,
    split_rows,
)
from .gluon_kernels import HAVE_GLUON
from .rules import (
    GATHER_REGS,
    GATHER_WARPS,
    WG_REGS,
    WGMMA_HEADS,
    WGMMA_WARPS,
    WS_MAXNREG,
    default_config,
    fp8_stages,
    index_tiles,
    merge_starts_early,
    smem_bytes,
    smem_limit,
    splits_within,
)

if HAVE_GLUON:
    from .gluon_kernels import sparse_decode_wgmma_kernel, sparse_decode_wgmma_ws_kernel

__all__ = ["SparseDecodeWgmmaKernel", "sparse_decode_wgmma"]


def sparse_decode_wgmma(
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
    """Sparse MLA decode on Hopper tensor cores (Gluon); ``q [B, H <= 64, 512]``, ``kv [num_rows, 512]`` in q's
    dtype (bf16/fp16) or in float8 e4m3 with ``kv_scale`` (float32 ``[num_rows]``, row r holds
    ``kv[r] * kv_scale[r]``, as :func:`kernels.sparse_decode.sparse_decode` takes it: half the bytes of a 16-bit
    cache; the producer warpgroup widens each gathered tile and q to float16 and the products run in float16, so an
    fp8 cache needs WS or SPLIT_WG, and :meth:`SparseDecodeWgmmaKernel.fit_dtype` makes a config fit; q's
    values must fit float16, within 65504), ``indices [B, topk]`` int32 (negative
    or >= num_rows: padding); returns ``[B, H, 512]``.

    ``config``: None = the tuned config for this GPU and shape (``kernels/configs``), else :func:`default_config`;
    a dict's keys are each optional, the rest from :func:`default_config`: ``S`` (at most this many splits of the
    selected rows, see :func:`kernels.sparse_decode.split_rows`), ``BLOCK_T`` (rows a tile: 32 or 64), ``STAGES``
    (ring slots, 2 to 4), ``V_SPLIT`` (2, 4 or 8: that many programs a split, each computes the scores and its share
    of V's columns, so a batch needs fewer splits, and fewer float32 partials, for the same number of programs; their
    gathers share the rows through L2), ``STORE_CVT`` (1: the output or partials go through shared memory into a
    layout of 16-byte stores, whole rows a warp; 0: straight from the wgmma layout, 4 threads a row, 8 bytes a
    thread in float32 and 4 in 16 bits), ``WS`` (1: warp-specialised, a fourth warpgroup issues the index loads and
    gathers and the two compute warpgroups only wait on mbarriers; 0: every warp does both, with one block-wide
    barrier a tile), ``SPLIT_WG`` (1: the two compute warpgroups take alternate whole tiles, each its own softmax,
    merged at the end; always warp-specialised, needs V_SPLIT >= 2 and an even STAGES); a launch is always 8 compute
    warps (12 warps in all with WS or SPLIT_WG) and 64 heads. ``pdl``: launch the merge
    kernel with programmatic dependent launch (the merge waits in-kernel for the split kernel's stores), the split
    kernel letting it start as soon as every program of its own has started (``griddepcontrol.launch_dependents``)
    where :func:`merge_starts_early` says so; None = where the GPU has it."""
    if not HAVE_GLUON:
        raise RuntimeError(
            f"sparse_decode_wgmma: this Triton ({triton.__version__}) has no Gluon Hopper API; "
            "use kernels.sparse_decode.sparse_decode"
        )
    B, H, d_qk, d_v = check_args(q, kv, indices, d_v, out, kv_scale)
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
    shape = shape_of(q, kv, indices, d_v)
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
    v_split = config["V_SPLIT"]
    if direct:
        part, lse = out, out  # unused
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((B, n_splits, H, d_v), device=q.device, dtype=torch.float32)
        lse = torch.empty((B, n_splits, H), device=q.device, dtype=torch.float32)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    args = (
        q,
        kv,
        indices,
        part,
        lse,
        out,
        H,
        kv.shape[0],
        topk,
        rows_per_split,
        sm_scale * LOG2E,
        n_splits,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        indices.stride(0),
        *part_strides,
        *lse_strides,
        out.stride(0),
        out.stride(1),
    )
    meta = dict(
        DV=d_v,
        BLOCK_H=WGMMA_HEADS,
        BLOCK_T=config["BLOCK_T"],
        STAGES=config["STAGES"],
        DIRECT=direct,
        V_SPLIT=v_split,
        STORE_CVT=bool(config["STORE_CVT"]),
        num_warps=WGMMA_WARPS,
    )
    grid = (n_splits * v_split, B)
    if not direct:
        target = gpu_target(q.device)
        pdl = (PDL and target is not None and target >= (9, 0)) if pdl is None else bool(pdl)
        # the split kernel starts the merge early where that pays
        meta["PDL"] = pdl and merge_starts_early(
            grid[0] * grid[1], math.prod(combine_grid(B, n_splits, H, d_v)), one_wave(q.device)
        )
    if config.get("WS") or config.get("SPLIT_WG"):
        meta["IDX_TILES"] = index_tiles(config, shape)
    if fp8:
        meta["FP8_STAGES"] = fp8_stages(config, shape)
    scale = kv_scale if fp8 else kv  # unused without an fp8 cache (warp_specialize takes no None)
    if config.get("SPLIT_WG"):  # the producer's 4 warps are the default partition, two 4-warp consumers: 12 warps
        meta["num_warps"] = 4
        sparse_decode_wgmma_ws_kernel[grid](
            *args,
            **meta,
            GATHER_WARPS=GATHER_WARPS,
            GATHER_REGS=GATHER_REGS,
            SPLIT_WG=True,
            WG_REGS=WG_REGS,
            maxnreg=WS_MAXNREG,
            scale_ptr=scale,
        )
    elif config.get("WS"):
        sparse_decode_wgmma_ws_kernel[grid](
            *args, **meta, GATHER_WARPS=GATHER_WARPS, GATHER_REGS=GATHER_REGS, maxnreg=WS_MAXNREG, scale_ptr=scale
        )
    else:
        sparse_decode_wgmma_kernel[grid](*args, **meta)
    if not direct:
        launch_combine(part, lse, out, pdl)
    return out


class SparseDecodeWgmmaKernel(SparseDecodeBase):
    """The Gluon Hopper kernel, ``sparse_decode_wgmma``, as the kernel search and the tuned-config files see it: 64
    heads of 512 at most, a 16-bit cache or an fp8 one with row scales, an sm_90 GPU (Gluon does not run in the Triton interpreter)."""

    name = "sparse_decode_wgmma"
    dtypes = ("bfloat16", "float16", "float8_e4m3fn")
    switches = ("STORE_CVT", "WS", "SPLIT_WG")
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
        if dtype_of(dtype) != FP8:
            return config
        out = dict(config)
        if not (out.get("WS") or out.get("SPLIT_WG")):
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
        batch-16 config of 4 splits of two programs would launch 192 programs at batch 24). Where even one split does
        not fit (``V_SPLIT * batch`` over one wave: the GPU's SMs, :func:`one_wave`), this batch's default config."""
        if shape["batch"] == tuned_shape["batch"]:
            return config
        if config["V_SPLIT"] * shape["batch"] > one_wave():
            return self.default_config(shape)
        return {**config, "S": splits_within(shape["batch"], shape["topk"], config["V_SPLIT"], config["BLOCK_T"])}

    def config_space(self, shape):
        return {
            "S": [1, 2, 3, 4, 5, 8, 10, 16, 20],
            "BLOCK_T": [32, 64],
            "STAGES": [2, 3, 4],
            "V_SPLIT": [1, 2, 4, 8],
            "STORE_CVT": [0, 1],
            "WS": [0, 1],
            "SPLIT_WG": [0, 1],
        }

    def canonical_config(self, config, shape):
        """The smallest S of the space that splits the rows the same way at this tile size (S = 16 and 10 both make
        ten 64-row splits of 640 rows), and WS with SPLIT_WG (which is a warp-specialised schedule either way)."""
        if "S" not in config or "BLOCK_T" not in config:
            return config
        split = split_rows(shape["topk"], config["S"], config["BLOCK_T"])
        s = min(
            (v for v in self.config_space(shape)["S"] if split_rows(shape["topk"], v, config["BLOCK_T"]) == split),
            default=config["S"],
        )
        out = {**config, "S": s}
        if out.get("SPLIT_WG"):  # always the warp-specialised schedule
            out["WS"] = 1
        return out

    def smem_bytes(self, config, shape):
        """q, the ring, the index table and the build's scratch: :func:`.rules.smem_bytes`."""
        return smem_bytes(config, shape)

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
            return (
                f"split_wg: SPLIT_WG=1 needs V_SPLIT >= 2 (one warpgroup holds the program's columns: 256 at "
                f"most) and an even ring (each slot read by one warpgroup); got V_SPLIT={config['V_SPLIT']}, "
                f"STAGES={config['STAGES']}"
            )
        smem, limit = self.smem_bytes(config, shape), device_limits(device)["shared_memory"]
        if smem > limit:
            return f"shared_memory: {smem // 1024} KiB > {limit // 1024} KiB"
        if dtype is not None and dtype_of(dtype) == FP8:
            if not (config.get("WS") or config.get("SPLIT_WG")):
                return (
                    "fp8_cache: an fp8 cache needs the producer warpgroup that widens its rows (WS=1 or "
                    "SPLIT_WG=1); got WS=0"
                )
            if fp8_stages(config, shape) < 2:
                per = config["BLOCK_T"] * (shape["d_qk"] + 4)
                return (
                    f"shared_memory: an fp8 cache needs two staging slots of {per // 1024} KiB beside "
                    f"{smem // 1024} KiB (at most {smem_limit() // 1024} KiB); lower STAGES or BLOCK_T"
                )
        return None

    def shapes(self, preset="v4flash"):
        if preset == "test":  # the widths it runs, few heads and rows: the GPU tests' quick shape
            return [{"batch": 3, "heads": 16, "d_qk": 512, "d_v": 512, "topk": 40, "num_rows": 97, "ragged": 1}]
        if preset != "v4flash":
            raise ValueError(
                f"unknown preset {preset!r} for {self.name}; use 'v4flash' or 'test' (64 heads of 512 at most)"
            )
        return super().shapes(preset)

    def run(self, inputs, config=None, out=None):
        return sparse_decode_wgmma(
            inputs["q"],
            inputs["kv"],
            inputs["indices"],
            inputs["sm_scale"],
            config,
            d_v=inputs["d_v"],
            out=out,
            kv_scale=inputs.get("kv_scale"),
        )


SparseDecodeWgmmaKernel.instance = SparseDecodeWgmmaKernel()
