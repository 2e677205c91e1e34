"""The GPU implementations behind the workload's knobs, from ``kernels/`` (Triton).

Each returns a callable with the same signature as its torch counterpart in ``tuner.targets.workload.ops``, so the
model's step reads the same whatever the knobs. Kernel knobs arrive as ``"sparse_decode.S"``-style keys; a
kernel field left unset takes the tuned config file's value (``TUNER_KERNEL_CONFIG_DIR``) or the default.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

_logger = logging.getLogger(__name__)


def kernel_overrides(knobs: dict[str, Any], kernel: str) -> dict[str, Any]:
    prefix = kernel + "."
    return {k[len(prefix):]: v for k, v in knobs.items() if k.startswith(prefix)}


def triton_attention(impl: str, knobs: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """``fn(q [B,H,d], kv_pool [N,d], rows [B,T] (-1 masked), scale, kv_scale [N] | None) -> [B,H,d]`` on a Triton
    kernel; an fp8 pool comes with its per-row scales (the SIMT kernel takes a 16-bit pool only)."""
    from kernels import sparse_decode as sd

    if impl == "wgmma":
        from kernels.sparse_decode_wgmma import sparse_decode_wgmma

        overrides = kernel_overrides(knobs, "sparse_decode_wgmma") or None  # unset: one program per SM, by batch
        return lambda q, pool, rows, scale, kv_scale=None: sparse_decode_wgmma(q, pool, rows.to(torch.int32), scale,
                                                                             overrides, kv_scale=kv_scale)
    if impl == "mma":
        launch, kernel, name = sd.sparse_decode, sd.SparseDecodeKernel.instance, "sparse_decode"
    elif impl == "simt":
        launch, kernel, name = sd.sparse_decode_simt, sd.SparseDecodeSimtKernel.instance, "sparse_decode_simt"
    else:
        raise ValueError(f"attention_impl {impl!r} has no Triton kernel; use torch, simt, mma or wgmma")
    overrides = kernel_overrides(knobs, name)
    configs: dict[tuple, dict | None] = {}

    def fn(q: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor, scale: float,
           kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        idx = rows.to(torch.int32)
        key = (tuple(q.shape), tuple(idx.shape), pool.dtype)
        if key not in configs:
            if overrides:
                shape = sd.shape_of(q, pool, idx, q.shape[-1])
                configs[key] = {**kernel.fit_dtype(kernel.default_config(shape), shape, pool.dtype), **overrides}
            else:
                configs[key] = None  # tuned config file or default, looked up by the kernel per shape
        if kv_scale is None:
            return launch(q, pool, idx, scale, configs[key])
        return launch(q, pool, idx, scale, configs[key], kv_scale=kv_scale)

    return fn


def triton_indexer(knobs: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """``fn(qi [B,Hi,Di], w [B,Hi], keys [B,W,Di], lengths [B], k_scale|None) -> scores [B,W]`` fused in Triton:
    the [B, rows, heads] logits never reach memory. Tiles past the live length are computed on masked loads
    (``indexer_dead_tiles=compute``, a server's capacity-sized grid) or skipped (``skip``)."""
    from kernels.indexer import indexer_scores

    overrides = kernel_overrides(knobs, "indexer") or None
    skip_dead = knobs.get("indexer_dead_tiles", "compute") == "skip"

    def fn(qi, w, keys, lengths, k_scale=None):
        return indexer_scores(qi.to(keys.dtype).contiguous(), keys, w.float().contiguous(), k_scale, lengths,
                              keys.shape[1], overrides, skip_dead=skip_dead)

    return fn


def triton_moe(knobs: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """``fn(x [T,hidden], w13 [E,hidden,2W], w2 [E,W,hidden], ids [T,k], weights [T,k]) -> [T,hidden]``: the
    fused Triton MoE (``kernels.moe``), reading each routed expert's weights in place."""
    from kernels.moe import MoEKernel, fused_moe

    overrides = kernel_overrides(knobs, "moe")
    configs: dict[tuple, dict | None] = {}

    def fn(x, w13, w2, ids, weights):
        key = tuple(ids.shape)
        if key not in configs:
            shape = {"tokens": ids.shape[0], "hidden": x.shape[1], "width": w2.shape[1], "experts": w13.shape[0],
                     "topk": ids.shape[1]}
            configs[key] = {**MoEKernel.instance.default_config(shape), **overrides} if overrides else None
        return fused_moe(x, w13, w2, ids, weights, configs[key])

    return fn


def kernel_linear(lin: Any, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)`` (a :class:`tuner.targets.workload.ops.Linear`) through ``kernels.linear.linear`` with ``lin.impl``
    (``triton``: the Triton skinny GEMM at its tuned config; ``auto``: per shape, whichever the tuned-config file
    recorded as faster, the library where none is recorded). The same dtypes as the torch path: fp8 quantises ``x``
    per row against the weight's per-channel scales, as the torch path does, and returns bf16 cast to ``x``'s dtype."""
    from kernels.linear import linear

    out_dtype = x.dtype
    x2 = x.reshape(-1, x.shape[-1])
    mode = lin.dtype_name
    if mode == "fp8":
        xs = x2.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0  # [tokens]
        xq = (x2.float() / xs[:, None]).to(torch.float8_e4m3fn)
        y = linear(xq, lin.weight, "fp8", lin.impl, x_scale=xs.float(), w_scale=lin.scale.reshape(-1).float())
    else:
        xin = x2.float() if mode in ("fp32", "tf32") else x2.to(lin.weight.dtype)
        y = linear(xin.contiguous(), lin.weight, mode, lin.impl)
    return y.to(out_dtype).reshape(*x.shape[:-1], y.shape[-1])


def fused_glue() -> tuple[Callable, Callable]:
    """(add_rms_norm, rope) from ``kernels.glue``: one pass each, casts included."""
    from kernels import glue

    def add_rms_norm(x, residual, weight):
        return glue.fused_add_rmsnorm(x.contiguous(), residual.contiguous(), weight)

    def rope(x, positions, cos_sin, rope_dim):
        squeeze = x.dim() == 2
        x3 = x.unsqueeze(1) if squeeze else x
        y = glue.rope(x3.contiguous(), positions, cos_sin, rope_dim)
        return y.squeeze(1) if squeeze else y

    return add_rms_norm, rope


def fused_store_kv() -> Callable[..., None]:
    """``fn(rows [n,d], pool [N,d] e4m3, pool_scale [N], slots [n])``: the new KV rows quantised and written into the
    fp8 cache and its scales in one launch (``kernels.glue.store_kv_rows``)."""
    from kernels import glue

    return lambda rows, pool, pool_scale, slots: glue.store_kv_rows(rows.contiguous(), pool, pool_scale, slots)
