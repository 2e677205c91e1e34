"""``y = x @ W.T`` as a model calls it: through the library, the Triton GEMM or the one-row GEMV.

``impl``: ``"torch"`` (the library: cuBLAS through torch, ``torch._scaled_mm`` for fp8), ``"triton"``
(``kernels/gemm.py``), ``"gemv"`` (``kernels/gemv.py``, one row of x only) or ``"auto"``: the implementation the tuned
GEMM file recorded as fastest for the nearest shape key (``"impl"`` of the entry, written by ``benchmarks/kernels.py``
and the kernel search from side-by-side timings), the library where no entry names one. So a tuned configuration never
ships a Triton kernel at a shape where the library measured faster. At one row, a GEMV entry of the kernel search
also counts (see :func:`resolve_impl`).
"""

from __future__ import annotations

import torch

from .configs import tuned_entry, tuned_impl
from .gemm import GemmKernel, _check, _mode, gemm, torch_linear
from .gemv import GemvKernel, gemv

__all__ = ["IMPLS", "linear", "resolve_impl"]


IMPLS = ("auto", "torch", "triton", "gemv")


def resolve_impl(impl: str, M: int, N: int, K: int, mode: str, device) -> str:
    """``"torch"``, ``"triton"`` or ``"gemv"`` for ``impl``; ``"auto"`` reads the tuned GEMM file's choice for the
    nearest key (``benchmarks/kernels.py`` names the GEMV there where it timed all three side by side). For one row,
    a GEMV entry of the kernel search (tuned file ``gemv``, its ``impl`` "triton": it beat the library beside it) wins
    where its speed-up over the library, measured beside it, exceeds the GEMM file's choice's. The GEMV only ever
    runs one row: a choice recorded at M = 1 that a nearest-key lookup lends to M > 1 falls back to the library."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} must be one of {IMPLS}")
    if impl != "auto":
        return impl
    shape = {"M": M, "N": N, "K": K}
    found = tuned_impl(GemmKernel.instance, shape, mode, device)
    if found == "gemv" and M != 1:
        return "torch"
    found = found if found in ("torch", "triton", "gemv") else "torch"
    if M == 1 and found != "gemv":
        gv = tuned_entry(GemvKernel.instance, shape, mode, device)
        if gv is not None and gv.get("impl") == "triton":  # a GEMV file holds one-row keys only
            gemv_gain = _gain(gv)
            gemm_gain = _gain(tuned_entry(GemmKernel.instance, shape, mode, device)) if found == "triton" else 1.0
            if gemv_gain is not None and gemv_gain > (gemm_gain or 1.0):
                return "gemv"
    return found


def _gain(entry: dict | None) -> float | None:
    """An entry's speed-up over the library, both measured side by side when it was tuned; None when unrecorded."""
    if not entry:
        return None
    lib, own = entry.get("library_time_us"), entry.get("impl_triton_time_us") or entry.get("time_us")
    return lib / own if lib and own else None


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    dtype: str | None = None,
    impl: str = "auto",
    config: dict | None = None,
    *,
    x_scale: torch.Tensor | None = None,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ w.T`` through the library, the Triton GEMM or the one-row GEMV (``impl``: auto, torch, triton, gemv;
    see the module doc). ``config`` applies to the Triton kernel that runs (a GEMM or a GEMV config)."""
    mode = ("tf32" if x.dtype == torch.float32 else _mode(x.dtype)) if dtype is None else _mode(dtype)
    M, N, K, _ = _check(x, w, mode, x_scale, w_scale, None)
    chosen = resolve_impl(impl, M, N, K, mode, x.device)
    if chosen == "torch":
        return torch_linear(x, w, mode, x_scale=x_scale, w_scale=w_scale)
    if chosen == "gemv":
        return gemv(x, w, mode, config, x_scale=x_scale, w_scale=w_scale)
    return gemm(x, w, mode, config, x_scale=x_scale, w_scale=w_scale)
