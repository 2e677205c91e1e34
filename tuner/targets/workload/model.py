"""A DeepSeek-V4-Flash-shaped decode step with random weights.

What is modelled: every layer of the preset in V4-Flash's pattern (window-only, compress-4 with the indexer and
top-k sparse attention over the selected compressed rows plus the sliding window, compress-128 attending to all
of its compressed rows plus the window), the low-rank q path, the grouped low-rank output projection, an fp32
"MHC-pre"-style linear per layer, RMSNorm/RoPE/residual glue, and an MoE on one expert-parallel rank (the rank's
local experts; each token's top-k experts are mapped onto them) plus the shared expert. The MoE runs as torch ops
(``moe_impl: torch``: with few pairs each pair's expert weights are gathered with ``index_select`` and multiplied by
``bmm``, with many every expert runs a fixed-capacity batch, dropping pairs over capacity; static shapes either way)
or as the fused Triton MoE of ``kernels.moe`` (``moe_impl: triton``: pairs sorted by expert, each routed expert's
weights read in place, no pair dropped).

What is not: no all-to-all between ranks, no FP4 experts, no LM head or sampling, no prefill; weights are shared
between layers of the same kind (every layer still runs), and the KV of compressed rows is random (the cost of
reading it is real, its content is not a model's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tuner.errors import KnobError
from tuner.targets.workload.ops import (
    GEMM_IMPLS,
    NORM_EPS,
    GroupedLinear,
    Linear,
    add_rms_norm,
    indexer_scores_torch,
    norm_rope,
    rms_norm,
    rope_tables,
    sparse_attention_torch,
)
from tuner.targets.workload.presets import Preset

_logger = logging.getLogger(__name__)

KV_CACHE_DTYPES = ("bf16", "fp8_e4m3")
FP8_KV_ATTENTION = ("torch", "mma", "wgmma", "flashmla_kv")
INDEXER_IMPLS = ("torch", "triton", "deepgemm")
"""The indexer: the twin's torch ops, its fused Triton kernel, or SGLang's Hopper path (DeepGEMM's paged logits over
SGLang's paged fp8 index cache, then a top-k of the live columns: ``tuner.targets.workload.sglang_indexer``)."""
GLUES = ("eager", "fused", "compile", "sglang")
"""The glue (residual add + RMSNorm, V4's query and KV norm + RoPE): see :meth:`DecodeModel._glue_fns`."""
FLASHMLA = ("flashmla_kv", "flashmla_sparse")
"""SGLang's own attention kernels (the sgl-flash-mla wheel): flashmla_kv on V4's fp8 cache, flashmla_sparse on bf16."""
"""The attention implementations that read an fp8 cache (the per-head SIMT kernel takes a 16-bit one only)."""

DEFAULT_KNOBS: dict[str, Any] = {
    "context_length": None,  # None = the preset's max context
    "indexer_width": "static",
    "indexer_impl": "torch",
    # with indexer_impl=deepgemm, the live top-k: torch.topk (a stand-in) or SGLang's own JIT kernel (sglang)
    "indexer_topk": "torch",
    # the fused indexer on a capacity-sized grid computes its dead tiles too (SGLang 0.5.23 under CUDA graphs);
    # `skip` is SGLang's open PR #40431, no launch flag: like `indexer_width`, a knob to measure, not searched
    "indexer_dead_tiles": "compute",
    "attention_impl": "torch",
    # the attention's KV cache: bf16 (the activations' dtype: float32 on a CPU) or fp8_e4m3 (e4m3 rows and a float32
    # scale per row, as V4-Flash serves with --kv-cache-dtype fp8_e4m3): half the bytes every attention reads
    "kv_cache_dtype": "bf16",
    "gemm_proj": "bf16",
    "gemm_indexer": "fp32",
    "gemm_moe": "bf16",
    "gemm_mhc": "fp32",
    "gemm_impl": "torch",  # every Linear's GEMM: torch (cuBLAS, _scaled_mm for fp8), triton (kernels/gemm.py) or auto
    "glue": "eager",
    "moe_impl": "torch",
}


@dataclass
class AttnWeights:
    q_a: Linear
    q_a_norm: torch.Tensor
    q_b: Linear
    kv: Linear
    kv_norm: (
        torch.Tensor
    )  # [head_dim], ones: the fused glue's kernel (weightless, as SGLang's q kernel) computes the same
    o_a: GroupedLinear  # [G, (H/G)*d] -> [G, o_lora] per group, in the projection dtype
    o_b: Linear
    idx_q: Linear | None
    idx_w: Linear | None


@dataclass
class LayerWeights:
    attn: dict[str, AttnWeights]
    norm1: torch.Tensor
    norm2: torch.Tensor
    mhc: Linear
    gate: Linear
    w13: torch.Tensor  # [E, hidden, 2*width]
    w2: torch.Tensor  # [E, width, hidden]
    shared_w13: Linear
    shared_w2: Linear


WEIGHT_KNOBS = ("gemm_proj", "gemm_indexer", "gemm_moe", "gemm_mhc", "gemm_impl")
"""The knobs the weights depend on (their dtypes, and the GEMM implementation each :class:`Linear` holds)."""
WEIGHT_CACHE_SIZE = 2
"""Weight sets a process keeps for the next model (a long-lived trial worker): the full preset's are ~2.3 GB each."""
_WEIGHTS: OrderedDict[tuple, tuple[LayerWeights, tuple[float, ...]]] = OrderedDict()


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))


def weights_fingerprint(w: LayerWeights) -> tuple[float, ...]:
    """The sum and the sum of squares of every weight tensor (float64 sums, one device sync): a stray write into them
    changes it (one that only permutes values would not; a kernel's out-of-bounds store does not do that)."""
    with torch.no_grad():
        parts = [
            torch.stack([t.float().sum(dtype=torch.float64), t.float().square().sum(dtype=torch.float64)])
            for t in _tensors(w)
        ]
        return tuple(torch.cat(parts).tolist())


def clear_weights() -> None:
    """Drop the weights kept for reuse (tests; a fresh process starts with none)."""
    _WEIGHTS.clear()


def quantize_kv_rows(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 rows, float32 scale per row) of KV rows, in the layout the sparse decode kernels read
    (``kernels.sparse_decode.quantize_kv_fp8``: ``scale[r] = max|kv[r]| / 448``)."""
    from kernels.sparse_decode import quantize_kv_fp8

    return quantize_kv_fp8(kv)


def store_kv_rows_torch(rows: torch.Tensor, pool: torch.Tensor, pool_scale: torch.Tensor, slots: torch.Tensor) -> None:
    """The new KV rows quantised and written at ``slots`` of the fp8 cache and its scales, as torch ops (the fused
    glue does it in one launch: ``kernels.glue.store_kv_rows``)."""
    q, scale = quantize_kv_rows(rows)
    pool_scale.index_copy_(0, slots, scale)
    pool.view(torch.uint8).index_copy_(0, slots, q.view(torch.uint8))  # index_copy_ has no float8 kernel on a CPU


class DecodeModel:
    """Weights and knobs for one preset on one device. :meth:`state` builds a batch; :meth:`step` runs it."""

    def __init__(self, preset: Preset, knobs: dict[str, Any], device: str | torch.device, seed: int = 0) -> None:
        self.p = preset
        # workload knobs, plus kernel fields as "kernel.FIELD" (e.g. "sparse_decode.S")
        self.knobs = {**DEFAULT_KNOBS, **{k: v for k, v in knobs.items() if k in DEFAULT_KNOBS or "." in k}}
        if self.knobs["context_length"] is None:
            self.knobs["context_length"] = preset.max_context
        self.device = torch.device(device)
        self.act_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self._check_knobs()
        # weights are drawn on the device itself: a CPU draw of the full preset's ~1B numbers takes seconds; a
        # long-lived trial worker reuses the last ones built with the same key (see `_weights`)
        self.w, self.weights_reused = self._weights(seed)
        self.attention_fn = self._attention_fn()
        self.triton_indexer = None
        if self.knobs["indexer_impl"] == "triton":
            from tuner.targets.workload.gpu_ops import triton_indexer

            self.triton_indexer = triton_indexer(self.knobs)
        self.sglang_indexer = None
        if self.knobs["indexer_impl"] == "deepgemm":
            from tuner.targets.workload.sglang_indexer import SGLangIndexer

            self.sglang_indexer = SGLangIndexer(preset.index_topk, self.knobs["indexer_topk"])
        self.triton_moe = None
        if self.knobs["moe_impl"] == "triton":
            from tuner.targets.workload.gpu_ops import triton_moe

            self.triton_moe = triton_moe(self.knobs)
        self.add_rms_norm, self._q_prep, self._kv_prep = self._glue_fns()
        self._store_kv = store_kv_rows_torch
        if self.knobs["glue"] == "fused" and self.knobs["kv_cache_dtype"] == "fp8_e4m3":
            from tuner.targets.workload.gpu_ops import fused_store_kv

            self._store_kv = fused_store_kv()  # one launch a layer, as a server's quantised cache write
        self.scale = 1.0 / math.sqrt(preset.head_dim)

    def _glue_fns(self):
        """``(add_rms_norm, q_prep, kv_prep)`` for knob ``glue``: the residual add + RMSNorm, and V4's query (each head
        RMS-normed without weight, then RoPE) and KV (RMSNorm with its weight, then RoPE) preparation. ``eager``: torch
        ops; ``compile``: the same under torch.compile; ``fused``: the twin's Triton kernels (``kernels.glue``'s add +
        norm, ``kernels.sglang_q_norm_rope`` for both heads); ``sglang``: SGLang's JIT CUDA ``fused_q_norm_rope``, and
        its ``fused_k_norm_rope_flashmla`` writing the KV row into V4's cache (``kv_prep`` None: :meth:`_flashmla_kv`
        calls it), the residual's add + norm on the twin's fused kernel (SGLang's is its mHC combine, which the twin
        does not model)."""
        mode, R = self.knobs["glue"], self.p.rope_dim

        def eager_q(q, st):
            return norm_rope(q, st["cos"], st["sin"], R)

        def eager_kv(kv, weight, st):
            return norm_rope(kv, st["cos"], st["sin"], R, weight)

        if mode in ("fused", "sglang"):
            from tuner.targets.workload.gpu_ops import fused_glue, fused_norm_rope

            fused_norm = fused_glue()
            if mode == "sglang":
                from tuner.targets.workload.gpu_ops import sglang_q_norm_rope

                return fused_norm, sglang_q_norm_rope(NORM_EPS), None
            q_prep = fused_norm_rope(NORM_EPS)

            def fused_kv(kv, weight, st):  # weightless kernel: the twin's kv norm weight is ones
                return q_prep(kv.unsqueeze(1), st).squeeze(1)

            return fused_norm, q_prep, fused_kv
        if mode == "compile":
            # one compiled entry per function and input shape: a long-lived trial worker meets every bucket set's
            # padded batches, past dynamo's default of 8 entries a function, beyond which it would run the glue
            # eagerly without a word
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            return (
                torch.compile(add_rms_norm, dynamic=False),
                torch.compile(eager_q, dynamic=False),
                torch.compile(eager_kv, dynamic=False),
            )
        return add_rms_norm, eager_q, eager_kv

    # -- set-up -------------------------------------------------------------------------------------------
    def _check_knobs(self) -> None:
        k = self.knobs
        for fam in ("gemm_proj", "gemm_indexer", "gemm_moe", "gemm_mhc"):
            if k[fam] not in ("fp32", "tf32", "bf16", "fp16", "fp8"):
                raise KnobError(f"workload knob `{fam}` must be fp32, tf32, bf16, fp16 or fp8, but got {k[fam]!r}")
            if k[fam] == "fp8" and self.device.type != "cuda":
                raise KnobError(f"workload knob `{fam}=fp8` needs a GPU with fp8 (compute capability >= 8.9)")
        if k["gemm_impl"] not in GEMM_IMPLS:
            raise KnobError(
                f"workload knob `gemm_impl` must be one of {', '.join(GEMM_IMPLS)}, but got {k['gemm_impl']!r}"
            )
        if k["kv_cache_dtype"] not in KV_CACHE_DTYPES:
            raise KnobError(
                f"workload knob `kv_cache_dtype` must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"but got {k['kv_cache_dtype']!r}"
            )
        if k["kv_cache_dtype"] == "fp8_e4m3" and k["attention_impl"] not in FP8_KV_ATTENTION:
            raise KnobError(
                f"workload knob `kv_cache_dtype=fp8_e4m3` needs attention_impl {', '.join(FP8_KV_ATTENTION)} "
                f"(the {k['attention_impl']} kernel reads a 16-bit cache), but got "
                f"attention_impl={k['attention_impl']!r}: set attention_impl or kv_cache_dtype=bf16"
            )
        if k["indexer_width"] not in ("static", "live"):
            raise KnobError(f"workload knob `indexer_width` must be static or live, but got {k['indexer_width']!r}")
        ctx = int(k["context_length"])
        if ctx < 1024:
            raise KnobError(f"workload knob `context_length` must be >= 1024, but got {ctx}")
        if k["glue"] not in GLUES:
            raise KnobError(f"workload knob `glue` must be one of {', '.join(GLUES)}, but got {k['glue']!r}")
        if k["glue"] == "sglang" and k["attention_impl"] != "flashmla_kv":
            raise KnobError(
                "workload knob `glue=sglang` runs SGLang's JIT norm/RoPE kernels, whose KV kernel writes V4's fp8 cache "
                f"for FlashMLA: it needs attention_impl=flashmla_kv, but got attention_impl={k['attention_impl']!r}"
            )
        if k["moe_impl"] not in ("torch", "triton"):
            raise KnobError(f"workload knob `moe_impl` must be torch or triton, but got {k['moe_impl']!r}")
        if k["indexer_impl"] not in INDEXER_IMPLS:
            raise KnobError(
                f"workload knob `indexer_impl` must be one of {', '.join(INDEXER_IMPLS)}, but got {k['indexer_impl']!r}"
            )
        if k["indexer_impl"] == "deepgemm":
            if self.device.type != "cuda":
                raise KnobError("workload knob `indexer_impl=deepgemm` needs an sm_90 or sm_100 GPU with deep_gemm")
            if self.p.indexer_heads not in (32, 64) or self.p.indexer_dim != 128:
                raise KnobError(
                    f"workload knob `indexer_impl=deepgemm` needs an indexer of 32 or 64 heads of 128 "
                    f"(DeepGEMM's sm_90 paged logits), but preset {self.p.name} has "
                    f"{self.p.indexer_heads} of {self.p.indexer_dim}: use indexer_impl=torch or triton"
                )
        if k["indexer_topk"] not in ("torch", "sglang"):
            raise KnobError(f"workload knob `indexer_topk` must be torch or sglang, but got {k['indexer_topk']!r}")
        if k["indexer_topk"] == "sglang" and k["indexer_impl"] != "deepgemm":
            raise KnobError(
                "workload knob `indexer_topk=sglang` is the top-k of SGLang's Hopper indexer: it needs "
                f"indexer_impl=deepgemm, but got indexer_impl={k['indexer_impl']!r}"
            )
        if k["indexer_dead_tiles"] not in ("compute", "skip"):
            raise KnobError(
                f"workload knob `indexer_dead_tiles` must be compute or skip, but got {k['indexer_dead_tiles']!r}"
            )
        if self.device.type != "cuda":
            for knob, gpu_only in (
                ("indexer_impl", "triton"),
                ("glue", "fused"),
                ("glue", "compile"),
                ("moe_impl", "triton"),
                ("gemm_impl", "triton"),
                ("gemm_impl", "auto"),
                ("gemm_impl", "deepgemm"),
                ("gemm_impl", "sglang_triton"),
                ("glue", "sglang"),
            ):
                if k[knob] == gpu_only:
                    raise KnobError(f"workload knob `{knob}={gpu_only}` needs a GPU (Triton)")

    def weights_key(self, seed: int) -> tuple:
        """Everything the random weights depend on: the preset, the seed, the device, the activations' dtype and the
        GEMM families' dtypes and implementation (the draws themselves are the same whatever the knobs)."""
        return (self.p, seed, str(self.device), str(self.act_dtype), *(self.knobs[k] for k in WEIGHT_KNOBS))

    def _weights(self, seed: int) -> tuple[LayerWeights, bool]:
        """The weights of this key, from :data:`_WEIGHTS` when an earlier model in this process built them and they
        still hold the values they were built with (their fingerprint), else drawn now; and whether they were
        reused. A trial that wrote into them (a kernel's stray store) cannot pass its values on: the next model
        finds the fingerprint changed and draws them again."""
        key = self.weights_key(seed)
        hit = _WEIGHTS.pop(key, None)
        if hit is not None:
            if weights_fingerprint(hit[0]) == hit[1]:
                _WEIGHTS[key] = hit
                return hit[0], True
            _logger.warning("cached weights of %s changed since they were built; drawing them again", self.p.name)
        g = torch.Generator(device=self.device).manual_seed(seed)
        w = self._init_weights(g)
        _WEIGHTS[key] = (w, weights_fingerprint(w))
        while len(_WEIGHTS) > WEIGHT_CACHE_SIZE:
            _WEIGHTS.popitem(last=False)
        return w, False

    def _rand(self, g: torch.Generator, *shape: int, scale: float | None = None) -> torch.Tensor:
        fan_in = shape[-1] if scale is None else 1
        t = torch.randn(*shape, generator=g, device=g.device)
        return (t * (scale if scale is not None else 1.0 / math.sqrt(fan_in))).to(self.device)

    def _linear(self, w: torch.Tensor, dtype_name: str) -> Linear:
        """A linear of the model: its family's dtype, its GEMM run by knob ``gemm_impl``."""
        return Linear.make(w, dtype_name, self.knobs["gemm_impl"])

    def _init_weights(self, g: torch.Generator) -> LayerWeights:
        p, k = self.p, self.knobs
        proj, dt = k["gemm_proj"], self.act_dtype
        attn = {}
        for kind in sorted(set(p.kinds())):
            gsize = (p.heads // p.o_groups) * p.head_dim
            attn[kind] = AttnWeights(
                q_a=self._linear(self._rand(g, p.q_lora, p.hidden), proj),
                q_a_norm=torch.ones(p.q_lora, device=self.device, dtype=dt),
                q_b=self._linear(self._rand(g, p.heads * p.head_dim, p.q_lora), proj),
                kv=self._linear(self._rand(g, p.head_dim, p.hidden), proj),
                kv_norm=torch.ones(p.head_dim, device=self.device, dtype=dt),
                o_a=GroupedLinear.make(
                    self._rand(g, p.o_groups, gsize, p.o_lora, scale=1 / math.sqrt(gsize)), proj, k["gemm_impl"]
                ),
                o_b=self._linear(self._rand(g, p.hidden, p.o_groups * p.o_lora), proj),
                idx_q=self._linear(self._rand(g, p.indexer_heads * p.indexer_dim, p.q_lora), k["gemm_indexer"])
                if kind == "csa"
                else None,
                idx_w=self._linear(self._rand(g, p.indexer_heads, p.hidden), k["gemm_indexer"])
                if kind == "csa"
                else None,
            )
        moe_dt = (
            torch.bfloat16
            if k["gemm_moe"] in ("bf16", "fp8")
            else (torch.float16 if k["gemm_moe"] == "fp16" else torch.float32)
        )
        E, W = p.experts_local, p.expert_width
        return LayerWeights(
            attn=attn,
            norm1=torch.ones(p.hidden, device=self.device, dtype=dt),
            norm2=torch.ones(p.hidden, device=self.device, dtype=dt),
            mhc=self._linear(self._rand(g, p.mhc_out, p.mhc_mult * p.hidden), k["gemm_mhc"]),
            gate=self._linear(self._rand(g, p.experts_total, p.hidden), "fp32"),
            w13=self._rand(g, E, p.hidden, 2 * W, scale=1 / math.sqrt(p.hidden)).to(moe_dt),
            w2=self._rand(g, E, W, p.hidden, scale=1 / math.sqrt(W)).to(moe_dt),
            shared_w13=self._linear(self._rand(g, 2 * W, p.hidden), k["gemm_moe"]),
            shared_w2=self._linear(self._rand(g, p.hidden, W), k["gemm_moe"]),
        )

    def _attention_fn(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]:
        impl = self.knobs["attention_impl"]
        if impl == "torch":
            return sparse_attention_torch
        if impl in FLASHMLA:
            if self.p.head_dim != 512 or self.p.heads not in (64, 128):
                raise KnobError(
                    f"workload knob `attention_impl={impl}` runs FlashMLA, which takes head dim 512 and "
                    f"64 or 128 heads, but preset {self.p.name} has {self.p.heads} heads of "
                    f"{self.p.head_dim}: use the dsv4-flash preset or another attention_impl"
                )
            if self.device.type != "cuda":
                raise KnobError(f"workload knob `attention_impl={impl}` needs an sm_90 GPU (FlashMLA)")
            try:
                from tuner.targets.workload.gpu_ops import flashmla_attention

                return flashmla_attention(impl)
            except ImportError:
                raise KnobError(
                    f"workload knob `attention_impl={impl}` needs the sgl-flash-mla wheel: "
                    "pip install 'tuner[flashmla]'"
                ) from None
        if self.device.type != "cuda":
            raise KnobError(f"workload knob `attention_impl={impl}` needs a GPU (Triton kernel)")
        from tuner.targets.workload.gpu_ops import triton_attention

        return triton_attention(impl, self.knobs)

    # -- a batch ------------------------------------------------------------------------------------------
    def state(self, batch: int, live_context: int, seed: int = 1) -> dict[str, torch.Tensor]:
        """Caches, block tables and inputs for ``batch`` requests with ``live_context`` tokens each.

        Built once per batch size, outside the timed step (as a server's page tables are).
        """
        p, dev, dt = self.p, self.device, self.act_dtype
        if live_context < p.window:
            raise ValueError(f"`live_context` must be >= the window ({p.window}), but got {live_context}")
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=dev).to(dt)

        B, L = batch, live_context
        n_csa, n_hca = math.ceil(L / p.csa_ratio), math.ceil(L / p.hca_ratio)
        ctx = int(self.knobs["context_length"])
        if self.knobs["indexer_width"] == "static":
            width = p.indexer_width(ctx)
        else:
            width = n_csa
        width = max(width, n_csa)
        ar = torch.arange(B, device=dev)
        # compressed-4 rows of request b live at pool rows 1 + b*n_csa + j; row 0 is the padding row
        j = torch.arange(width, device=dev)
        csa_table = torch.where(j[None, :] < n_csa, 1 + ar[:, None] * n_csa + j[None, :], torch.zeros_like(j)[None, :])
        hca_rows = 1 + ar[:, None] * n_hca + torch.arange(n_hca, device=dev)[None, :]
        win_rows = ar[:, None] * p.window + torch.arange(p.window, device=dev)[None, :]
        extra: dict[str, torch.Tensor] = rope_tables(
            B, L, p.rope_dim, dev, table=self.knobs["glue"] in ("fused", "sglang")
        )
        # every random input is drawn in the same order whatever the knobs, so two configurations see the same inputs
        # (the numerics gate compares their outputs)
        base = {
            "x": rnd(B, p.hidden),
            "win_pool": rnd(B * p.window, p.head_dim),
            "csa_pool": rnd(1 + B * n_csa, p.head_dim),
            "csa_keys": rnd(1 + B * n_csa, p.indexer_dim),
            "hca_pool": rnd(1 + B * n_hca, p.head_dim),
        }
        if self.knobs["attention_impl"] == "flashmla_kv":  # the same rows in V4's cache, as SGLang's pool holds them
            from tuner.targets.workload.gpu_ops import quantize_v4

            for name in ("win", "csa", "hca"):
                base[f"{name}_v4"] = quantize_v4(base[f"{name}_pool"])
        if self.knobs["kv_cache_dtype"] == "fp8_e4m3":  # the same rows, stored as the server's fp8 cache stores them
            for name in ("win", "csa", "hca"):
                base[f"{name}_pool"], base[f"{name}_scale"] = quantize_kv_rows(base[f"{name}_pool"])
        if self.sglang_indexer is not None:  # SGLang's paged index cache and page table, the cap sizing the table
            from tuner.targets.workload.sglang_indexer import COMPRESSED_PAGE_ROWS, page_table_width, paged_index_state

            pages = (
                page_table_width(ctx, p.csa_ratio)
                if self.knobs["indexer_width"] == "static"
                else math.ceil(n_csa / COMPRESSED_PAGE_ROWS)
            )
            extra |= paged_index_state(base["csa_keys"], B, n_csa, pages)
            extra["idx_live"] = n_csa
            self.sglang_indexer.prepare(extra)
        if self.triton_indexer is not None:  # the server's key cache, sized by the width it scores: the same keys
            keys = base["csa_keys"][csa_table]
            if self.knobs["gemm_indexer"] == "fp8":
                keys = keys.float()
                scale = keys.abs().amax(-1).clamp(min=1e-6) / 448.0
                extra["csa_keys_dense"] = (keys / scale[..., None]).to(torch.float8_e4m3fn)
                extra["csa_keys_scale"] = scale.float().contiguous()
            else:
                extra["csa_keys_dense"] = keys.to(
                    torch.float32 if self.knobs["gemm_indexer"] in ("fp32", "tf32") else torch.bfloat16
                )
            del keys
        return (
            extra
            | base
            | {
                "csa_table": csa_table,
                "csa_live": torch.full((B,), n_csa, device=dev, dtype=torch.long),
                "hca_rows": hca_rows,
                "win_rows": win_rows,
                "win_slot": win_rows[:, (L - 1) % p.window],
            }
        )

    # -- the step -----------------------------------------------------------------------------------------
    profiling = False
    """When set (by ``tuner.targets.workload.profile``), each stage of a step runs inside a ``stage::NAME`` profiler
    range (glue, mhc, attention, indexer, moe), so a profile can say which stage the time goes to."""

    def _stage(self, name: str):
        return torch.profiler.record_function(f"stage::{name}") if self.profiling else contextlib.nullcontext()

    def step(self, st: dict[str, torch.Tensor]) -> torch.Tensor:
        """One decode step for every request of the batch: all layers, returning the final hidden state."""
        x = st["x"]
        residual = torch.zeros_like(x)
        for kind in self.p.kinds():
            with self._stage("glue"):
                h, residual = self.add_rms_norm(x, residual, self.w.norm1)
            with self._stage("mhc"):
                h = self._mhc(h)
            x = self._attention(kind, h, st)
            with self._stage("glue"):
                h, residual = self.add_rms_norm(x, residual, self.w.norm2)
            with self._stage("moe"):
                x = self._moe(h)
        return rms_norm(x + residual, self.w.norm1)

    def _mhc(self, h: torch.Tensor) -> torch.Tensor:
        # the "MHC-pre" linear: mixing weights of the hyper-connection streams from all streams, in its own dtype;
        # the mixed stream is the layer's input, so this GEMM's dtype reaches the output (and the numerics gate)
        streams = h.repeat(1, self.p.mhc_mult)
        mix = torch.sigmoid(self.w.mhc(streams).float()).mean(-1, keepdim=True)
        return (h * mix.to(h.dtype)).to(h.dtype)

    def _attention(self, kind: str, h: torch.Tensor, st: dict[str, torch.Tensor]) -> torch.Tensor:
        with self._stage("attention"):
            return self._attention_stage(kind, h, st)

    def _attention_stage(self, kind: str, h: torch.Tensor, st: dict[str, torch.Tensor]) -> torch.Tensor:
        p, w = self.p, self.w.attn[kind]
        B = h.shape[0]
        qa = rms_norm(w.q_a(h), w.q_a_norm)
        q = self._q_prep(w.q_b(qa).view(B, p.heads, p.head_dim), st)
        if "win_v4" in st:  # FlashMLA on V4's cache: the window is the main cache, the compressed rows the extra one
            return self._flashmla_kv(kind, w, q, h, qa, st)
        kv_new = self._kv_prep(w.kv(h), w.kv_norm, st)
        fp8 = "win_scale" in st
        if fp8:  # the new row quantised as it is written, a scale per row
            self._store_kv(kv_new, st["win_pool"], st["win_scale"], st["win_slot"])
        else:
            st["win_pool"].index_copy_(0, st["win_slot"], kv_new)
        if kind == "window":
            other = None
            rows = st["win_rows"]
        elif kind == "hca":
            other = "hca"
            rows = torch.cat([st["hca_rows"], st["win_rows"] + st["hca_pool"].shape[0]], dim=1)
        else:
            with self._stage("indexer"):
                sel = self._indexer(w, qa, h, st)
            other = "csa"
            rows = torch.cat([sel, st["win_rows"] + st["csa_pool"].shape[0]], dim=1)
        if other is None:
            pool, kv_scale = st["win_pool"], st.get("win_scale")
        else:
            pool = torch.cat([st[f"{other}_pool"], st["win_pool"]], dim=0)
            kv_scale = torch.cat([st[f"{other}_scale"], st["win_scale"]]) if fp8 else None
        o = self.attention_fn(q, pool, rows, self.scale, kv_scale)  # [B, H, d]
        oa = w.o_a(o.reshape(B, p.o_groups, -1)).reshape(B, -1).to(h.dtype)  # [B, G, (H/G)*d] -> [B, G*o_lora]
        return w.o_b(oa)

    def _flashmla_kv(
        self,
        kind: str,
        w: AttnWeights,
        q: torch.Tensor,
        h: torch.Tensor,
        qa: torch.Tensor,
        st: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The attention as SGLang's DeepSeek-V4 backend runs it on Hopper: the new row stored into the V4 window
        cache (with ``glue=sglang`` normed, roped and stored by SGLang's one JIT kernel), then one FlashMLA sparse
        decode over the window (main) and the compressed rows (extra)."""
        B, p = h.shape[0], self.p
        if self._kv_prep is None:
            from tuner.targets.workload.gpu_ops import sglang_k_norm_rope_store

            sglang_k_norm_rope_store(w.kv(h), w.kv_norm, NORM_EPS, st, st["win_v4"], st["win_slot"])
        else:
            from tuner.targets.workload.gpu_ops import store_v4

            store_v4(st["win_v4"], self._kv_prep(w.kv(h), w.kv_norm, st), st["win_slot"])
        extra = extra_rows = None
        if kind == "hca":
            extra, extra_rows = st["hca_v4"], st["hca_rows"]
        elif kind != "window":
            with self._stage("indexer"):
                extra_rows = self._indexer(w, qa, h, st)
            extra = st["csa_v4"]
        o = self.attention_fn(q, st["win_v4"], st["win_rows"], self.scale, None, extra, extra_rows)
        oa = w.o_a(o.reshape(B, p.o_groups, -1)).reshape(B, -1).to(h.dtype)
        return w.o_b(oa)

    def _indexer(self, w: AttnWeights, qa: torch.Tensor, h: torch.Tensor, st: dict[str, torch.Tensor]) -> torch.Tensor:
        """Score the request's compressed rows (the configured width or the live length) and pick the top-k."""
        p = self.p
        B = h.shape[0]
        qi = w.idx_q(qa).view(B, p.indexer_heads, p.indexer_dim)
        wts = w.idx_w(h)
        if self.sglang_indexer is not None:
            return self.sglang_indexer(qi, wts, st)
        table = st["csa_table"]  # [B, width]
        if self.triton_indexer is not None:
            keys = st["csa_keys_dense"]
            scores = self.triton_indexer(qi, wts, keys, st["csa_live"].to(torch.int32), st.get("csa_keys_scale"))
        else:
            keys = st["csa_keys"][table]  # [B, width, Di]: the gather SGLang does over its page table
            scores = indexer_scores_torch(
                qi, wts, keys, w.idx_q.weight.dtype if w.idx_q.dtype_name != "fp8" else torch.float8_e4m3fn
            )
            valid = torch.arange(table.shape[1], device=table.device)[None, :] < st["csa_live"][:, None]
            scores = scores.masked_fill(~valid, float("-inf"))
        k = min(p.index_topk, table.shape[1])
        top = scores.topk(k, dim=-1)
        rows = table.gather(1, top.indices)
        return torch.where(torch.isfinite(top.values), rows, torch.full_like(rows, -1))

    def _moe(self, h: torch.Tensor) -> torch.Tensor:
        p, w = self.p, self.w
        logits = w.gate(h.float())
        gw, gi = torch.softmax(logits, dim=-1).topk(p.topk_experts, dim=-1)  # [B, k]
        E = p.experts_local
        if self.triton_moe is not None:
            # the fused Triton MoE: pairs sorted by expert, each routed expert's weights read in place
            out = self.triton_moe(h.to(w.w13.dtype).contiguous(), w.w13, w.w2, gi % E, gw).float()
        else:
            out = self._moe_torch(h, gi, gw)
        su = w.shared_w13(h)
        shared = w.shared_w2(torch.nn.functional.silu(su[:, : p.expert_width]) * su[:, p.expert_width :])
        return (out + shared.float()).to(h.dtype)

    def _moe_torch(self, h: torch.Tensor, gi: torch.Tensor, gw: torch.Tensor) -> torch.Tensor:
        p, w = self.p, self.w
        B, E = h.shape[0], p.experts_local
        e = (gi % E).reshape(-1)
        tok = torch.arange(B, device=h.device).repeat_interleave(p.topk_experts)
        if 2 * e.numel() <= E:
            # few (token, expert) pairs: read only the experts they use, one weight slice per pair
            xe = h[tok].to(w.w13.dtype).unsqueeze(1)  # [P, 1, hidden]
            gu = torch.bmm(xe, w.w13.index_select(0, e))
            act = torch.nn.functional.silu(gu[..., : p.expert_width]) * gu[..., p.expert_width :]
            ye = torch.bmm(act, w.w2.index_select(0, e)).squeeze(1)
            contrib = ye.float() * gw.reshape(-1).unsqueeze(-1)
        else:
            # many pairs: every local expert runs a fixed-capacity batch (static shapes, CUDA-graph friendly)
            cap = max(1, math.ceil(p.capacity_factor * B * p.topk_experts / E))
            onehot = torch.nn.functional.one_hot(e, E)
            pos = (onehot.cumsum(0) - 1).gather(1, e[:, None]).squeeze(1)
            keep = pos < cap
            slot = torch.where(keep, e * cap + pos, torch.full_like(pos, E * cap))
            buf = torch.zeros(E * cap + 1, p.hidden, device=h.device, dtype=w.w13.dtype)
            buf.index_copy_(0, slot, h[tok].to(w.w13.dtype))
            xe = buf[:-1].view(E, cap, p.hidden)
            gu = torch.bmm(xe, w.w13)
            act = torch.nn.functional.silu(gu[..., : p.expert_width]) * gu[..., p.expert_width :]
            ye = torch.bmm(act, w.w2).reshape(E * cap, p.hidden)
            ye = torch.cat([ye, torch.zeros(1, p.hidden, device=h.device, dtype=ye.dtype)])
            contrib = ye[slot].float() * (gw.reshape(-1) * keep).unsqueeze(-1)
        return torch.zeros(B, p.hidden, device=h.device, dtype=torch.float32).index_add_(0, tok, contrib)
