"""Fused MoE for decode: ``y[t] = sum_j w[t,j] * (silu(x[t] @ Wg[e]) * (x[t] @ Wu[e])) @ W2[e]``, ``e = ids[t,j]``.

Only the routed experts' weights are read, straight from the expert tensors (no per-pair weight copy, which is
what a gather-then-bmm path in torch does and what makes it slow at small batches).

Layout: ``w13 [E, hidden, 2*width]`` (gate columns ``[:width]``, up columns ``[width:]``), ``w2 [E, width, hidden]``,
``ids [T, k]`` (int, any of the E experts, repeats allowed), ``weights [T, k]`` (float). Output ``[T, hidden]`` in
x's dtype (float32 accumulation).

Three steps, all with shapes fixed by ``T*k`` (no host sync, CUDA-graph safe):

1. :func:`moe_align` (torch): the ``T*k`` (token, expert) pairs sorted by expert, each expert's run padded to a
   multiple of ``BLOCK_M``; every block of ``BLOCK_M`` sorted rows belongs to one expert (``E`` marks an unused
   block, which the kernels skip).
2. ``_moe_up_kernel``: per (block, column tile) the gate and up products of the block's tokens with its expert,
   ``silu(gate) * up`` stored once (the ``[rows, 2*width]`` intermediate never exists).
3. ``_moe_down_kernel``: per (block, column tile) ``act @ W2[e]`` times the pair's routing weight, stored per pair;
   the ``k`` pairs of a token are summed in torch (deterministic, no atomics).

Tunables (one config for both kernels): BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .base import Cost, TunableKernel, cdiv, device_limits, shared_inputs, tf32_matmul
from .configs import tuned_config

__all__ = [
    "fused_moe",
    "moe_align",
    "moe_reference",
    "moe_torch",
    "routed_inputs",
    "routed_rotation_bytes",
    "MoEKernel",
]

logger = logging.getLogger(__name__)

_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _moe_up_kernel(
    x_ptr,
    w_ptr,
    act_ptr,
    pair_ptr,
    block_expert_ptr,
    n_pairs,
    K,
    WIDTH,
    stride_xt,
    stride_we,
    stride_wk,
    stride_wn,
    stride_ar,
    TOPK: tl.constexpr,
    N_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e >= N_EXPERTS:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + rows)
    valid = pair < n_pairs
    tok = tl.where(valid, pair // TOPK, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < WIDTH
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
    w_base = w_ptr + e.to(tl.int64) * stride_we
    g_ptrs = w_base + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    u_ptrs = g_ptrs + WIDTH * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=valid[:, None], other=0.0)
            bg = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            a = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            bg = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc_g = tl.dot(a, bg, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, bu, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, bg, acc_g)
            acc_u = tl.dot(a, bu, acc_u)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(act_ptr + rows[:, None] * stride_ar + offs_n[None, :], h.to(act_ptr.dtype.element_ty), mask=n_ok[None, :])


@triton.jit
def _moe_down_kernel(
    act_ptr,
    w_ptr,
    y_ptr,
    gw_ptr,
    pair_ptr,
    block_expert_ptr,
    n_pairs,
    K,
    N,
    stride_ar,
    stride_we,
    stride_wk,
    stride_wn,
    stride_yp,
    N_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e >= N_EXPERTS:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + rows)
    valid = pair < n_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + rows[:, None] * stride_ar + offs_k[None, :]
    b_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_wk
    gw = tl.load(gw_ptr + tl.where(valid, pair, 0), mask=valid, other=0.0).to(tl.float32)
    acc = acc * gw[:, None]
    tl.store(
        y_ptr + tl.where(valid, pair, 0).to(tl.int64)[:, None] * stride_yp + offs_n[None, :],
        acc,
        mask=valid[:, None] & n_ok[None, :],
    )


def moe_align(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_pair, block_expert)``: pair indices (``t*k + j``) grouped by expert, each expert's run padded to a
    multiple of ``block_m`` with the marker ``T*k``; the expert of each block of ``block_m`` rows (``n_experts``
    for blocks past the last run). Sizes depend only on ``T*k``, ``n_experts`` and ``block_m``."""
    flat = ids.reshape(-1).to(torch.int64)
    P, dev = flat.numel(), flat.device
    n_blocks = cdiv(P + min(P, n_experts) * (block_m - 1), block_m)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    rank = torch.arange(P, device=dev) - (counts.cumsum(0) - counts)[se]
    dest = (ends - padded)[se] + rank
    sorted_pair = torch.full((n_blocks * block_m,), P, dtype=torch.int32, device=dev)
    sorted_pair.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(n_blocks, device=dev, dtype=torch.int64) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return sorted_pair, block_expert


def _check(x, w13, w2, ids, weights):
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"x must be [T, hidden], w13 [E, hidden, 2*width], w2 [E, width, hidden]; got "
            f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}"
        )
    T, H = x.shape
    E, W = w13.shape[0], w2.shape[1]
    if w13.shape[1] != H or w13.shape[2] != 2 * W or tuple(w2.shape) != (E, W, H):
        raise ValueError(
            f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden={H}: need w13 "
            f"[E, {H}, 2*width] and w2 [E, width, {H}]"
        )
    if x.dtype != w13.dtype or w2.dtype != w13.dtype or w13.dtype not in _WEIGHT_DTYPES:
        raise ValueError(
            f"x, w13, w2 must share one of float32/float16/bfloat16; got {x.dtype}, {w13.dtype}, {w2.dtype}"
        )
    if ids.dim() != 2 or ids.shape[0] != T or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"ids and weights must both be [T={T}, k]; got {tuple(ids.shape)} and {tuple(weights.shape)}")
    if x.stride(1) != 1:
        raise ValueError("x must have a contiguous last dim")
    return T, H, E, W, ids.shape[1]


def routed_inputs(
    name: str, shape: dict, dt: torch.dtype, device, seed: int, up_shape: tuple, down_shape: tuple
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Inputs of a routed-expert MoE: ``{x, ids, weights}`` fresh per ``seed`` (``k`` distinct experts per token),
    and the up and down expert weights of the given shapes, random but fixed per shape and shared by every seed's
    set (:func:`~kernels.base.shared_inputs`), so timing can rotate several routings without a copy of the weights
    each. Weights are scaled by their fan-in (``hidden``, ``width``)."""
    dev = torch.device(device)
    T, H, W, E, k = shape["tokens"], shape["hidden"], shape["width"], shape["experts"], shape["topk"]

    def make():
        gw = torch.Generator(device=dev).manual_seed(1 << 20)
        up = torch.randn(*up_shape, generator=gw, device=dev) * H**-0.5
        return up.to(dt), (torch.randn(*down_shape, generator=gw, device=dev) * W**-0.5).to(dt)

    up, down = shared_inputs((name, tuple(up_shape), tuple(down_shape), dt, str(dev)), make)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, H, generator=g, device=dev)
    ids = torch.rand(T, E, generator=g, device=dev).argsort(dim=1)[:, :k].to(torch.int32)
    weights = torch.softmax(torch.randn(T, k, generator=g, device=dev), dim=-1)
    return {"x": x.to(dt), "ids": ids, "weights": weights}, up, down


def routed_rotation_bytes(shape: dict, dt: torch.dtype) -> float:
    """Memory of one more input set of :func:`routed_inputs`: only tokens and routing are new."""
    return float(shape["tokens"] * (2 * shape["hidden"] * dt.itemsize + 8 * shape["topk"]))


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The routed-expert MoE of ``x`` (see the module docstring); ``config`` None: tuned file or default."""
    T, H, E, W, k = _check(x, w13, w2, ids, weights)
    kernel = MoEKernel.instance
    shape = {"tokens": T, "hidden": H, "width": W, "experts": E, "topk": k}
    if config is None:
        config = tuned_config(kernel, shape, x.dtype, x.device)
    else:
        kernel.require_config(config, shape, x.device, x.dtype)
    if out is None:
        out = torch.empty(T, H, device=x.device, dtype=x.dtype)
    elif tuple(out.shape) != (T, H) or out.dtype != x.dtype:
        raise ValueError(f"out must be [{T}, {H}] of {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    if T == 0:
        return out
    BM, BN, BK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    sorted_pair, block_expert = moe_align(ids, E, BM)
    n_blocks = block_expert.numel()
    act = torch.empty(n_blocks * BM, W, device=x.device, dtype=x.dtype)
    ypair = torch.empty(T * k, H, device=x.device, dtype=torch.float32)
    gw = weights.reshape(-1).to(torch.float32).contiguous()
    ieee = x.dtype == torch.float32
    launch = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    _moe_up_kernel[(n_blocks, cdiv(W, BN))](
        x,
        w13,
        act,
        sorted_pair,
        block_expert,
        T * k,
        H,
        W,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        w13.stride(2),
        act.stride(0),
        TOPK=k,
        N_EXPERTS=E,
        BLOCK_M=BM,
        BLOCK_N=BN,
        BLOCK_K=BK,
        EVEN_K=H % BK == 0,
        IEEE=ieee,
        **launch,
    )
    _moe_down_kernel[(n_blocks, cdiv(H, BN))](
        act,
        w2,
        ypair,
        gw,
        sorted_pair,
        block_expert,
        T * k,
        W,
        H,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        w2.stride(2),
        ypair.stride(0),
        N_EXPERTS=E,
        BLOCK_M=BM,
        BLOCK_N=BN,
        BLOCK_K=BK,
        EVEN_K=W % BK == 0,
        IEEE=ieee,
        **launch,
    )
    out.copy_(ypair.view(T, k, H).sum(1))
    return out


def moe_torch(x, w13, w2, ids, weights) -> torch.Tensor:
    """What plain PyTorch does at decode batch sizes: gather each pair's expert weights, then batched GEMMs."""
    T, H, E, W, k = _check(x, w13, w2, ids, weights)
    e = ids.reshape(-1).long()
    xe = x.repeat_interleave(k, dim=0).unsqueeze(1)  # [P, 1, H]
    gu = torch.bmm(xe, w13.index_select(0, e))
    act = torch.nn.functional.silu(gu[..., :W]) * gu[..., W:]
    ye = torch.bmm(act, w2.index_select(0, e)).squeeze(1).float() * weights.reshape(-1, 1).float()
    return ye.view(T, k, H).sum(1).to(x.dtype)


def moe_reference(x, w13, w2, ids, weights) -> torch.Tensor:
    """Float64 (CPU) / float32 (CUDA) reference, one expert at a time."""
    T, H, E, W, k = _check(x, w13, w2, ids, weights)
    dt = torch.float64 if x.device.type == "cpu" else torch.float32
    xr, out = x.to(dt), torch.zeros(T, H, device=x.device, dtype=dt)
    flat = ids.reshape(-1).long()
    tok = torch.arange(T, device=x.device).repeat_interleave(k)
    gw = weights.reshape(-1).to(dt)
    with tf32_matmul(False):
        for e in torch.unique(flat).tolist():
            sel = (flat == e).nonzero().squeeze(1)
            gu = xr[tok[sel]] @ w13[e].to(dt)
            act = torch.nn.functional.silu(gu[:, :W]) * gu[:, W:]
            out.index_add_(0, tok[sel], (act @ w2[e].to(dt)) * gw[sel, None])
    return out


class MoEKernel(TunableKernel):
    name = "moe"
    batch_dim = "tokens"
    instance: "MoEKernel"

    def default_config(self, shape):
        # small batches: 16-row blocks (one or two pairs per expert) and narrow column tiles so that the few
        # routed experts still spread over every SM; larger batches: wider blocks reuse each weight tile
        pairs_per_expert = shape["tokens"] * shape["topk"] / shape["experts"]
        bm = 16 if pairs_per_expert <= 16 else (32 if pairs_per_expert <= 32 else 64)
        return {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}

    def config_space(self, shape):
        return {
            "BLOCK_M": [16, 32, 64],
            "BLOCK_N": [32, 64, 128],
            "BLOCK_K": [32, 64, 128, 256],
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4],
        }

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            if config[key] < 16 or config[key] & (config[key] - 1):
                return f"tile_size: {key}={config[key]} must be a power of two >= 16 (tl.dot)"
        pairs = shape["tokens"] * shape["topk"]
        if config["BLOCK_M"] > max(16, triton.next_power_of_2(pairs)):
            return (
                f"block_m: BLOCK_M={config['BLOCK_M']} > tokens*topk={pairs} rounded up to a power of two (all padding)"
            )
        elt = 2 if dtype is None else _dtype(dtype).itemsize
        # the up kernel holds the widest tiles: x [BM, BK] and gate + up [BK, BN] each, per stage
        smem = config["num_stages"] * (config["BLOCK_M"] + 2 * config["BLOCK_N"]) * config["BLOCK_K"] * elt
        limit = device_limits(device)["shared_memory"]
        if smem > limit:
            return f"shared_memory: {smem // 1024} KiB > {limit // 1024} KiB"
        threads = 32 * config["num_warps"]
        regs = 2 * config["BLOCK_M"] * config["BLOCK_N"] // threads
        if regs > 128:
            return f"register_pressure: two fp32 accumulators 2*BLOCK_M*BLOCK_N/threads = {regs} registers/thread > 128"
        return None

    def make_inputs(self, shape, dtype, device, seed=0):
        """Fresh tokens and routing per seed over expert weights shared by every seed's set (:func:`routed_inputs`)."""
        H, W, E = shape["hidden"], shape["width"], shape["experts"]
        inputs, w13, w2 = routed_inputs(self.name, shape, _dtype(dtype), device, seed, (E, H, 2 * W), (E, W, H))
        return {**inputs, "w13": w13, "w2": w2}

    def rotation_bytes(self, shape, dtype="bfloat16"):
        return routed_rotation_bytes(shape, _dtype(dtype))

    def output_like(self, inputs):
        x = inputs["x"]
        return torch.empty_like(x)

    def run(self, inputs, config=None, out=None):
        return fused_moe(inputs["x"], inputs["w13"], inputs["w2"], inputs["ids"], inputs["weights"], config, out=out)

    def reference(self, inputs):
        return moe_reference(inputs["x"], inputs["w13"], inputs["w2"], inputs["ids"], inputs["weights"])

    def torch_baseline(self, inputs):
        return moe_torch(inputs["x"], inputs["w13"], inputs["w2"], inputs["ids"], inputs["weights"])

    def cost(self, shape, dtype="bfloat16"):
        """Bytes of the distinct experts expected to be routed to (each read once) plus activations."""
        elt = _dtype(dtype).itemsize
        T, H, W, E, k = shape["tokens"], shape["hidden"], shape["width"], shape["experts"], shape["topk"]
        used = E * (1.0 - (1.0 - min(k, E) / E) ** T)  # expected distinct experts with k distinct per token
        weights = used * 3 * H * W * elt
        return Cost(float(weights + 2 * T * H * elt), float(2 * T * k * 3 * H * W))

    def shapes(self, preset="v4flash"):
        if preset == "v4flash":  # one expert-parallel rank of 8: 32 local experts, top-6 mapped onto them
            return [{"tokens": t, "hidden": 4096, "width": 2048, "experts": 32, "topk": 6} for t in (1, 16, 64)]
        if preset == "test":
            return [
                {"tokens": 3, "hidden": 64, "width": 32, "experts": 5, "topk": 2},
                {"tokens": 9, "hidden": 96, "width": 48, "experts": 4, "topk": 3},
            ]
        raise ValueError(f"unknown preset {preset!r}; use 'v4flash' or 'test'")


def _dtype(dtype) -> torch.dtype:
    from .base import dtype_of

    dt = dtype_of(dtype)
    if dt not in _WEIGHT_DTYPES:
        raise ValueError(f"moe dtype={dtype!r} must be float32, float16 or bfloat16")
    return dt


MoEKernel.instance = MoEKernel()
