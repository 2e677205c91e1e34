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
    return {k[len(prefix) :]: v for k, v in knobs.items() if k.startswith(prefix)}


def triton_attention(impl: str, knobs: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """``fn(q [B,H,d], kv_pool [N,d], rows [B,T] (-1 masked), scale, kv_scale [N] | None) -> [B,H,d]`` on a Triton
    kernel; an fp8 pool comes with its per-row scales (the SIMT kernel takes a 16-bit pool only)."""
    from kernels import sparse_decode as sd

    if impl == "wgmma":
        from kernels.sparse_decode_wgmma import sparse_decode_wgmma

        overrides = kernel_overrides(knobs, "sparse_decode_wgmma") or None  # unset: one program per SM, by batch
        return lambda q, pool, rows, scale, kv_scale=None: sparse_decode_wgmma(
            q, pool, rows.to(torch.int32), scale, overrides, kv_scale=kv_scale
        )
    if impl == "mma":
        launch, kernel, name = sd.sparse_decode, sd.SparseDecodeKernel.instance, "sparse_decode"
    elif impl == "simt":
        launch, kernel, name = sd.sparse_decode_simt, sd.SparseDecodeSimtKernel.instance, "sparse_decode_simt"
    else:
        raise ValueError(f"attention_impl {impl!r} has no Triton kernel; use torch, simt, mma or wgmma")
    overrides = kernel_overrides(knobs, name)
    configs: dict[tuple, dict | None] = {}

    def fn(
        q: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None
    ) -> torch.Tensor:
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
        return indexer_scores(
            qi.to(keys.dtype).contiguous(),
            keys,
            w.float().contiguous(),
            k_scale,
            lengths,
            keys.shape[1],
            overrides,
            skip_dead=skip_dead,
        )

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
            shape = {
                "tokens": ids.shape[0],
                "hidden": x.shape[1],
                "width": w2.shape[1],
                "experts": w13.shape[0],
                "topk": ids.shape[1],
            }
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


def fused_glue() -> Callable:
    """The residual's add + RMSNorm as ``kernels.glue``'s one pass, casts included."""
    from kernels import glue

    def add_rms_norm(x, residual, weight):
        return glue.fused_add_rmsnorm(x.contiguous(), residual.contiguous(), weight)

    return add_rms_norm


def fused_norm_rope(eps: float) -> Callable:
    """``fn(x [B, H, d], st) -> [B, H, d]``: each head RMS-normed (no weight) and roped in one launch, the twin's Triton
    kernel on SGLang's layout (``kernels.sglang_q_norm_rope``), from the state's ``freqs_real`` and ``positions``."""
    from kernels.sglang_q_norm_rope import q_norm_rope

    def fn(x, st):
        x = x.contiguous()
        out = torch.empty_like(x)
        q_norm_rope(x, out, eps, st["freqs_real"], st["positions"])
        return out

    return fn


def sglang_q_norm_rope(eps: float) -> Callable:
    """``fn(q [B, H, 512], st) -> [B, H, 512]``: SGLang 0.5.23's JIT CUDA ``fused_q_norm_rope`` (from the installed
    sglang package, built by its JIT on first use), called as ``deepseek_v4.py`` calls it."""
    from sglang.kernels.ops.attention.dsv4.norm_rope import fused_q_norm_rope

    def fn(q, st):
        q = q.contiguous()
        out = torch.empty_like(q)
        fused_q_norm_rope(q, out, eps, st["freqs_cis"], st["positions"])
        return out

    return fn


def sglang_k_norm_rope_store(
    kv: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    st: dict[str, torch.Tensor],
    cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """SGLang 0.5.23's JIT CUDA ``fused_k_norm_rope_flashmla``: the new KV rows ``kv`` [B, 512] RMS-normed with
    ``weight``, roped and written into V4's fp8 ``cache`` (:func:`quantize_v4`'s pages) at token ``slots``, in one
    launch, with the arguments SGLang's pool passes (``set_swa_key_buffer_radix_fused_norm_rope``: the raw
    ``[pages, page bytes]`` buffer, int32 locations, page size 64, layout V4)."""
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.kernels.ops.attention.dsv4.norm_rope import fused_k_norm_rope_flashmla

    pages, page = cache.shape[0], cache.shape[1]
    raw = torch.as_strided(cache, (pages, v4_page_bytes(page)), (cache.stride(0), 1))
    fused_k_norm_rope_flashmla(
        kv.contiguous(),
        weight,
        eps,
        st["freqs_cis"],
        st["positions"],
        slots.to(torch.int32),
        raw,
        page,
        KVLayout.V4,
    )


def fused_store_kv() -> Callable[..., None]:
    """``fn(rows [n,d], pool [N,d] e4m3, pool_scale [N], slots [n])``: the new KV rows quantised and written into the
    fp8 cache and its scales in one launch (``kernels.glue.store_kv_rows``)."""
    from kernels import glue

    return lambda rows, pool, pool_scale, slots: glue.store_kv_rows(rows.contiguous(), pool, pool_scale, slots)


V4_NOPE, V4_ROPE, V4_TILE, V4_PAGE = 448, 64, 64, 64
V4_BYTES = V4_NOPE + 2 * V4_ROPE + V4_NOPE // V4_TILE + 1  # 584: 448 e4m3, 64 bf16, 7 ue8m0 scales and one pad byte
"""DeepSeek-V4's fp8 KV cache as SGLang 0.5.23 stores it for FlashMLA (``KVLayout.V4`` in
``sglang/kernels/ops/attention/dsv4/kv_layout.py``): per page, every token's 576 data bytes, then its 8 scale
bytes; the page padded to a multiple of 576."""


def v4_page_bytes(page: int = V4_PAGE) -> int:
    return -(-page * V4_BYTES // 576) * 576


def v4_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` [n, 512] as V4 bytes: data [n, 576] (each 64-value tile of the 448 nope values in e4m3 under a
    power-of-two ue8m0 scale, then the 64 rope values in bf16) and scales [n, 8] (7 ue8m0 bytes and a pad)."""
    n, d = rows.shape
    assert d == V4_NOPE + V4_ROPE, f"V4's cache holds 512 values a token, got {d}"
    x = rows.float()
    nope = x[:, :V4_NOPE].reshape(n, V4_NOPE // V4_TILE, V4_TILE)
    exp = torch.ceil(torch.log2(nope.abs().amax(-1).clamp(min=1e-30) / 448.0)).clamp(-127, 127)
    q = (nope / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, V4_NOPE)
    rope = x[:, V4_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, 2 * V4_ROPE)
    scales = torch.zeros(n, 8, dtype=torch.uint8, device=rows.device)
    scales[:, : V4_NOPE // V4_TILE] = (exp + 127).to(torch.uint8)
    return torch.cat([q, rope], dim=-1), scales


def quantize_v4(rows: torch.Tensor, page: int = V4_PAGE) -> torch.Tensor:
    """``rows`` [N, 512] (float) as V4 pages: uint8 ``[ceil(N/page), page, 1, 584]``, a view over padded pages, as
    SGLang's ``deepseek_v4_backend`` hands FlashMLA its cache (write more rows with :func:`store_v4`)."""
    pages = -(-rows.shape[0] // page)
    buf = torch.zeros(pages, v4_page_bytes(page), dtype=torch.uint8, device=rows.device)
    cache = buf[:, : page * V4_BYTES].view(pages, page, 1, V4_BYTES)
    store_v4(cache, rows, torch.arange(rows.shape[0], device=rows.device))
    return cache


def store_v4(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Write ``rows`` [n, 512] at token ``slots`` [n] of the V4 ``cache`` (quantised as SGLang's store does)."""
    pages, page = cache.shape[0], cache.shape[1]
    flat = torch.as_strided(cache, (pages * cache.stride(0),), (1,))
    data, scales = v4_rows(rows)
    slots = slots.long()
    base = (slots // page) * cache.stride(0) + (slots % page) * 576
    sbase = (slots // page) * cache.stride(0) + page * 576 + (slots % page) * 8
    flat[(base[:, None] + torch.arange(576, device=rows.device)).reshape(-1)] = data.reshape(-1)
    flat[(sbase[:, None] + torch.arange(8, device=rows.device)).reshape(-1)] = scales.reshape(-1)


def dequantize_v4(cache: torch.Tensor, n: int) -> torch.Tensor:
    """The float32 rows [n, 512] a V4 cache holds (the reference FlashMLA's output is checked against)."""
    pages, page = cache.shape[0], cache.shape[1]
    raw = torch.as_strided(cache, (pages, v4_page_bytes(page)), (cache.stride(0), 1))
    data = raw[:, : page * 576].reshape(pages * page, 576)
    scales = raw[:, page * 576 : page * 576 + page * 8].reshape(pages * page, 8)[:, : V4_NOPE // V4_TILE]
    nope = data[:, :V4_NOPE].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, V4_NOPE // V4_TILE, V4_TILE)
    nope = nope * torch.exp2(scales.float() - 127)[..., None]
    rope = data[:, V4_NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.reshape(-1, V4_NOPE), rope], dim=-1)[:n]


def _topk_indices(rows: torch.Tensor, multiple: int = 64) -> torch.Tensor:
    """``rows`` [B, T] as FlashMLA's indices [B, 1, T'] (int32), padded with -1 (masked) to a multiple of
    ``multiple`` (64: the decode kernel's top-k tile; SGLang pads its page indices likewise)."""
    pad = -rows.shape[1] % multiple
    idx = rows.to(torch.int32)
    if pad:
        idx = torch.nn.functional.pad(idx, (0, pad), value=-1)
    return idx.unsqueeze(1).contiguous()


def flashmla_attention(impl: str) -> Callable[..., torch.Tensor]:
    """``fn(q [B,H,512], pool, rows [B,T] (-1 masked), scale, kv_scale) -> [B,H,512]`` on FlashMLA (the
    sgl-flash-mla wheel), as SGLang 0.5.23 calls it. ``flashmla_kv``: ``flash_mla_with_kvcache(..., use_legacy=True,
    kv_format="V4")``, the SM90 sparse decode SGLang's DeepSeek-V4 backend runs, on the V4 fp8 cache (``pool`` is
    then the uint8 V4 pages of :func:`quantize_v4`, ``kv_scale`` None). ``flashmla_sparse``:
    ``flash_mla_sparse_fwd(..., use_legacy=True)`` on a bf16 pool [N, 512]."""
    import flash_mla

    if impl == "flashmla_sparse":

        def sparse(q, pool, rows, scale, kv_scale=None):
            if kv_scale is not None or pool.dtype != torch.bfloat16:
                raise ValueError("attention_impl=flashmla_sparse reads a bf16 cache; set kv_cache_dtype=bf16")
            # its sparse kernel takes the top-k in pairs of 64-row tiles (FlashMLA asserts topk % 128 == 0 on sm_90)
            idx = _topk_indices(rows, 128)  # [B, 1, T], -1 = masked
            out = flash_mla.flash_mla_sparse_fwd(
                q.contiguous(), pool.unsqueeze(1), idx, scale, q.shape[-1], use_legacy=True, return_log2_lse=False
            )[0]
            return out.to(q.dtype)

        return sparse
    if impl != "flashmla_kv":
        raise ValueError(f"attention_impl {impl!r} is not a FlashMLA value; use flashmla_kv or flashmla_sparse")
    metas: dict[tuple, Any] = {}

    def decode(q, cache, rows, scale, kv_scale=None, extra=None, extra_rows=None):
        """``cache``/``rows``: the window (SGLang's SWA cache); ``extra``/``extra_rows``: the compressed rows."""
        idx = _topk_indices(rows)  # [B, 1, T]: token = page * page_size + slot, -1 = masked
        eidx = None if extra_rows is None else _topk_indices(extra_rows)
        key = (tuple(q.shape), tuple(idx.shape), None if eidx is None else tuple(eidx.shape))
        if key not in metas:  # one schedule per shape, as SGLang keeps one per CUDA graph
            metas[key] = flash_mla.get_mla_metadata()[0]
        out, _ = flash_mla.flash_mla_with_kvcache(
            q.unsqueeze(1).contiguous(),
            cache,
            None,
            None,
            q.shape[-1],
            metas[key],
            softmax_scale=scale,
            is_fp8_kvcache=True,
            indices=idx,
            extra_k_cache=extra,
            extra_indices_in_kvcache=eidx,
            use_legacy=True,
            kv_format="V4",
        )
        return out.squeeze(1).to(q.dtype)

    return decode
