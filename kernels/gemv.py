"""Split-K GEMV ``y = x @ W.T`` for one row of x (decode at batch 1), without tensor cores.

At M = 1 a GEMM reads W once and does two FLOPs per element read: the time is the read. ``kernels/gemm.py`` pads the
row to a 16-row MMA tile and stages every W tile through shared memory; this kernel loads each ``[BLOCK_N, BLOCK_K]``
tile of W straight into registers (16-byte loads along K, each row a contiguous run), multiplies it by the broadcast
chunk of x and sums each row, so a program keeps little state and many programs fit an SM. ``SPLIT_K > 1`` splits K
over programs: each writes a float32 partial of its ``BLOCK_N`` outputs, and the last split of a column block to
finish (a per-block counter, reset by that program: CUDA-graph safe) sums them in the same launch.

Measured on an H200 beside the library and ``kernels/gemm.py`` in one run (``benchmarks/kernels.py --only gemm,gemv``,
``benchmarks/results/kernels/h200/2026-11-30_393971c_gemv.md``): faster than both at every V4-Flash decode shape at M = 1, bf16 and fp8.

Modes and inputs as ``kernels.gemm`` (fp32/tf32 run in float32 arithmetic, fp8 e4m3 with float32 scales per tensor
or per row). The tuned choice of ``kernels.linear.linear(impl="auto")`` may name it (``"gemv"``) for one-row keys.
Tunables: BLOCK_N, BLOCK_K, SPLIT_K, num_warps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .base import cdiv, zeroed_counters
from .gemm import GemmKernel, _check, _mode, config_for, sum_splits_if_last

__all__ = ["GemvKernel", "gemv"]


@triton.jit(do_not_specialize=["k_per_split", "n_splits"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    xs_ptr,
    ws_ptr,
    p_ptr,
    lock_ptr,
    N,
    K,
    k_per_split,
    n_splits,
    stride_wn,
    stride_ws,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)  # wrap: W loads need no row mask
    k_start = tl.multiple_of(pid_k * k_per_split, BLOCK_K)  # a multiple of BLOCK_K (the launcher rounds it up)
    w_ptrs = w_ptr + offs_wn[:, None] * stride_wn + (k_start + tl.arange(0, BLOCK_K))[None, :]
    x_ptrs = x_ptr + k_start + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = (k0 + tl.arange(0, BLOCK_K)) < K
            x = tl.load(x_ptrs, mask=k_ok, other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:  # x's one scale, and W's per tensor (stride 0) or per row (stride 1)
        acc = acc * (tl.load(xs_ptr) * tl.load(ws_ptr + offs_wn * stride_ws))
    if SPLIT:
        tl.store(p_ptr + pid_k * N + offs_n, acc, mask=n_ok)
        sum_splits_if_last(lock_ptr + pid_n, n_splits, p_ptr + offs_n, N, y_ptr + offs_n, n_ok)
    else:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


_COUNTERS: dict[str, torch.Tensor] = {}


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    dtype: str | None = None,
    config: dict | None = None,
    *,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ w.T`` for ``x`` of one row ``[1, K]``, in mode ``dtype`` (None: from x.dtype); see the module doc."""
    mode = ("fp32" if x.dtype == torch.float32 else _mode(x.dtype)) if dtype is None else _mode(dtype)
    M, N, K, out_dt = _check(x, w, mode, x_scale, w_scale, out)
    if M != 1:
        raise ValueError(f"gemv: x must have one row (M=1), got M={M}; use kernels.gemm.gemm (or linear) for M > 1")
    if mode == "fp8" and x_scale.numel() != 1:
        raise ValueError(f"gemv: dtype='fp8' takes one x_scale for its one row, got {x_scale.numel()}")
    config = config_for(GemvKernel.instance, {"M": 1, "N": N, "K": K}, mode, x.device, config)
    if out is None:
        out = torch.empty((1, N), device=x.device, dtype=out_dt)
    if N == 0:
        return out
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"gemv: x and w must be contiguous along K, got strides {x.stride()} and {w.stride()}")
    BN, BK, SK = config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    k_per_split = cdiv(K, SK * BK) * BK
    SK = cdiv(K, k_per_split)  # splits that hold at least one K tile
    n_blocks = cdiv(N, BN)
    partial = out if SK == 1 else torch.empty((SK, N), device=x.device, dtype=torch.float32)
    locks = zeroed_counters(_COUNTERS, x.device, n_blocks) if SK > 1 else x
    scale_a = x_scale.reshape(-1).contiguous() if x_scale is not None else x
    scale_b = w_scale.reshape(-1).contiguous() if w_scale is not None else w
    ws_stride = 1 if w_scale is not None and w_scale.numel() > 1 else 0
    _gemv_kernel[(n_blocks, SK)](
        x,
        w,
        out,
        scale_a,
        scale_b,
        partial,
        locks,
        N,
        K,
        k_per_split,
        SK,
        w.stride(0),
        ws_stride,
        BLOCK_N=BN,
        BLOCK_K=BK,
        EVEN_K=(k_per_split * SK == K),
        HAS_SCALE=(mode == "fp8"),
        SPLIT=SK > 1,
        num_warps=config["num_warps"],
        num_stages=1,
    )
    return out


class GemvKernel(GemmKernel):
    """The one-row GEMV; inputs, reference, library path, tolerance and cost are the GEMM's."""

    name = "gemv"
    instance: GemvKernel

    def default_config(self, shape):
        """4 rows of W per program, K tiles of up to 1024, 4 warps, K split only until the grid has 256 programs:
        the best of the H200 sweep at all four bf16 decode shapes
        (``benchmarks/results/kernels/h200/2026-11-30_393971c_gemv.md``)."""
        N, K = shape["N"], shape["K"]
        bk = min(1024, max(128, triton.next_power_of_2(K)))
        blocks = cdiv(N, 4)
        split = 1
        while split < 16 and blocks * split < 256 and 2 * split * bk <= K:
            split *= 2
        return {"BLOCK_N": 4, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4}

    def seed_configs(self, shape, device=None, dtype=None):
        """The default on 8 warps (the fp8 best at two shapes), 8-row blocks on 8 warps (the fp8 best at the other
        two), 16-row blocks with 256-long K tiles split 8 ways (the prototype's best at N x K = 2048 x 4096,
        ``benchmarks/results/gemm_floor/h200/2026-11-30_1300f20.md``), and the default with twice the splits."""
        d = self.default_config(shape)
        out = []
        for c in (
            dict(d, num_warps=8),
            dict(d, BLOCK_N=8, num_warps=8),
            {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 8, "num_warps": 8},
            dict(d, SPLIT_K=min(16, 2 * d["SPLIT_K"])),
        ):
            if c != d and c not in out and not self.check_config(c, shape, device, dtype):
                out.append(c)
        return out

    def config_space(self, shape):
        return {
            "BLOCK_N": [4, 8, 16, 32],
            "BLOCK_K": [128, 256, 512, 1024],
            "SPLIT_K": [1, 2, 4, 8, 16],
            "num_warps": [2, 4, 8],
        }

    def check_config(self, config, shape, device=None, dtype=None):
        why = super(GemmKernel, self).check_config(config, shape, device)
        if why:
            return why
        if shape["M"] != 1:
            return f"one_row: the GEMV takes M=1, got M={shape['M']}"
        for key in ("BLOCK_N", "BLOCK_K"):
            if config[key] & (config[key] - 1):
                return f"tile_size: {key}={config[key]} must be a power of two"
        if (config["SPLIT_K"] - 1) * config["BLOCK_K"] >= shape["K"]:
            return (
                f"split_k: SPLIT_K={config['SPLIT_K']} splits of BLOCK_K={config['BLOCK_K']} leave splits empty "
                f"for K={shape['K']}"
            )
        per_thread = config["BLOCK_N"] * config["BLOCK_K"] // (32 * config["num_warps"])
        if per_thread > 128:
            return f"register_pressure: BLOCK_N*BLOCK_K/threads = {per_thread} W elements per thread > 128"
        return None

    def run(self, inputs, config=None, out=None):
        return gemv(
            inputs["x"],
            inputs["w"],
            inputs["mode"],
            config,
            x_scale=inputs["x_scale"],
            w_scale=inputs["w_scale"],
            out=out,
        )

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":
            return [s for s in super().shapes("v4flash") if s["M"] == 1]
        if preset == "test":
            return [{"M": 1, "N": 40, "K": 96}, {"M": 1, "N": 64, "K": 200}]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash' or 'test'")


GemvKernel.instance = GemvKernel()
