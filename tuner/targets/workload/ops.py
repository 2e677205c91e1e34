"""The decode step's operators, chosen by the workload's knobs.

Each knob selects a real mechanism: the GEMM dtype per family changes the dtype the weights are stored in and
the matmul runs in; the attention implementation picks the torch reference or a Triton kernel; the indexer
width picks the configured context (static, as SGLang sizes it under CUDA graphs) or the live length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tuner.targets.workload.sglang_gemm import BLOCK, block_quantize, group_quantize

_logger = logging.getLogger(__name__)

GEMM_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}


GEMM_IMPLS = ("torch", "triton", "auto", "deepgemm", "sglang_triton")
"""Who runs a linear (knob ``gemm_impl``): the library through torch (cuBLAS; ``torch._scaled_mm`` for fp8), the Triton
skinny GEMM of ``kernels/gemm.py``, ``auto``: per shape, what the tuned-config file recorded as fastest
(``kernels.linear.linear``: the library, the GEMM, or at one row the GEMV of ``kernels/gemv.py``; the library where no
entry names one), or ``deepgemm``: an fp8 linear as SGLang runs V4's block-quantized ones on sm_90 (SGLang's JIT per-token-group
quantisation, then DeepGEMM's ``fp8_gemm_nt``, 128x128 weight and 1x128 activation scales; a 16-bit linear through
torch, as SGLang's), or ``sglang_triton``: an fp8 linear as SGLang runs it with ``--fp8-gemm-backend triton`` (the same
quantisation, then its own Triton ``w8a8_block_fp8_matmul``, the same block scales): ``tuner.targets.workload.sglang_gemm``."""
BLOCK_FP8_IMPLS = ("deepgemm", "sglang_triton")
"""The implementations that run fp8 linears on DeepSeek's 128x128 weight blocks (SGLang's two Hopper backends)."""


def deepgemm_servable(n: int, k: int) -> bool:
    """The shapes DeepGEMM serves for [128, 128] blocks (SGLang's ``fp8_utils.py`` sends the others to Triton)."""
    return n % 64 == 0 and k % BLOCK == 0


@dataclass
class Linear:
    """A weight stored in its family's dtype; ``fp8`` keeps e4m3 values with one scale per output channel, and scales
    each activation row (token) on the fly, as fp8 serving does (DeepSeek's checkpoints scale 128-wide blocks; one
    scale per whole tensor, as this twin first did, let a small token or channel sink into e4m3's subnormals: 0.20-0.34
    rel. error for the fp8 MoE over 12 seeds on an H200, against a 0.25 tolerance). ``impl``: one of
    :data:`GEMM_IMPLS`; anything but ``torch`` runs through ``kernels.linear.linear`` (a GPU)."""

    weight: torch.Tensor  # [out, in]
    dtype_name: str
    scale: torch.Tensor | None = None  # fp8: [1, out] float32 (deepgemm: [ceil(out/128), in/128], a scale a block)
    impl: str = "torch"

    @classmethod
    def make(cls, w: torch.Tensor, dtype_name: str, impl: str = "torch") -> Linear:
        if dtype_name == "fp8" and impl in BLOCK_FP8_IMPLS and deepgemm_servable(*w.shape):
            q, scale = block_quantize(w)
            return cls(q, dtype_name, scale, impl)
        if impl in BLOCK_FP8_IMPLS:  # a 16-bit linear, or a shape outside the fp8 blocks: torch, as below
            impl = "torch"
        if dtype_name == "fp8":
            scale = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 448.0  # [out, 1]
            return cls((w / scale).to(torch.float8_e4m3fn), dtype_name, scale.t().contiguous(), impl)
        return cls(w.to(GEMM_DTYPES[dtype_name]).contiguous(), dtype_name, None, impl)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "deepgemm":
            import deep_gemm

            from tuner.targets.workload.sglang_gemm import sglang_activation_quant

            x2 = x.reshape(-1, x.shape[-1])
            quant = sglang_activation_quant()  # SGLang's own (JIT), else torch's
            xq, xs = quant(x2.to(torch.bfloat16).contiguous()) if quant else group_quantize(x2)
            out = torch.empty(x2.shape[0], self.weight.shape[0], device=x.device, dtype=torch.bfloat16)
            deep_gemm.fp8_gemm_nt((xq, xs), (self.weight, self.scale), out)
            return out.to(x.dtype).reshape(*x.shape[:-1], -1)
        if self.impl == "sglang_triton":
            from tuner.targets.workload.sglang_gemm import block_fp8_linear

            return block_fp8_linear(x, self.weight, self.scale)
        if self.impl != "torch":
            from tuner.targets.workload.gpu_ops import kernel_linear

            return kernel_linear(self, x)
        out_dtype = x.dtype
        if self.dtype_name == "fp8":
            x2 = x.reshape(-1, x.shape[-1]).float()
            xs = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0  # [tokens, 1]
            xq = (x2 / xs).to(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, self.weight.t(), scale_a=xs, scale_b=self.scale, out_dtype=torch.bfloat16)
            return y.to(out_dtype).reshape(*x.shape[:-1], -1)
        if self.dtype_name == "tf32":
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return (x.float() @ self.weight.t()).to(out_dtype)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev
        return (x.to(self.weight.dtype) @ self.weight.t()).to(out_dtype)


@dataclass
class GroupedLinear:
    """V4's grouped output projection ``wo_a``: ``o [B, G, D] -> [B, G, R]``, one ``[D, R]`` weight per group.

    A 16-bit (or fp32/tf32) one is a torch ``bmm`` on ``weight [G, D, R]``. An fp8 one under SGLang's Hopper backends
    (``gemm_impl`` ``deepgemm`` or ``sglang_triton``: SGLang runs ``wo_a`` the same way under both) is what SGLang
    0.5.23 runs on sm_90 (``srt/models/deepseek_v4.py:3008-3024``, ``SGLANG_OPT_FP8_WO_A_GEMM`` on by default): its
    per-token-group quantisation of ``o`` with float32 scales (not rounded to powers of two on sm_90), then DeepGEMM's
    ``fp8_einsum("bhr,hdr->bhd")`` on ``weight [G, R, D]`` e4m3 with ``scale [G, R/128, D/128]``, recipe
    ``(1, 128, 128)`` (:func:`tuner.targets.workload.sglang_gemm.wo_a_einsum`). Where DeepGEMM's einsum does not run
    here (checked once per process on a small call), it is the 16-bit bmm, and the trial's log says so. This is the
    sm_90 form: on Blackwell SGLang quantises with ue8m0 scales and recipe ``(1, 1, 128)``, not repeated here."""

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    impl: str = "torch"

    @classmethod
    def make(cls, w: torch.Tensor, dtype_name: str, impl: str = "torch") -> GroupedLinear:
        """``w [G, D, R]`` in the family's dtype ``dtype_name``, run by ``impl`` (a :data:`GEMM_IMPLS` value)."""
        _, d, r = w.shape
        if dtype_name == "fp8" and impl in BLOCK_FP8_IMPLS and d % BLOCK == 0 and r % BLOCK == 0:
            from tuner.targets.workload.sglang_gemm import wo_a_einsum_runs

            if wo_a_einsum_runs():
                return cls(*block_quantize(w.transpose(1, 2)), "deepgemm")  # each group's [R, D]
        return cls(w.to(torch.bfloat16 if dtype_name in ("bf16", "fp8") else torch.float32).contiguous())

    def __call__(self, o: torch.Tensor) -> torch.Tensor:
        if self.impl == "deepgemm":
            from tuner.targets.workload.sglang_gemm import wo_a_einsum

            return wo_a_einsum(o, self.weight, self.scale)
        og = o.transpose(0, 1).to(self.weight.dtype)  # [G, B, D]
        return torch.bmm(og, self.weight).transpose(0, 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual; return rmsnorm(h) * weight, h`` (eager: three kernels and two casts)."""
    h = x + residual
    return rms_norm(h, weight), h


NORM_EPS = 1e-6
"""The RMSNorm epsilon of V4's norms in the twin (the checkpoint's ``rms_norm_eps``)."""


def rope_tables(batch: int, position: int, rope_dim: int, device, *, table: bool = True) -> dict[str, torch.Tensor]:
    """The RoPE inputs of ``batch`` tokens at ``position``: ``cos``/``sin`` [batch, rope_dim/2] (the eager glue's) and,
    with ``table``, the model's table of every position up to it as SGLang holds it (``freqs_cis`` [position+1,
    rope_dim/2] complex64, its float32 view ``freqs_real``) with the tokens' ``positions`` (int32), which the fused
    and SGLang glue read."""
    half = rope_dim // 2
    inv = 1.0 / (10000 ** (torch.arange(half, device=device, dtype=torch.float32) / half))
    ang = torch.full((batch, 1), float(position), device=device) * inv[None, :]
    out = {"cos": torch.cos(ang), "sin": torch.sin(ang)}
    if table:
        ang_all = torch.arange(position + 1, device=device, dtype=torch.float32)[:, None] * inv[None, :]
        out["freqs_cis"] = torch.polar(torch.ones_like(ang_all), ang_all)
        out["freqs_real"] = torch.view_as_real(out["freqs_cis"]).flatten(-2).contiguous()
        out["positions"] = torch.full((batch,), position, device=device, dtype=torch.int32)
    return out


def norm_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """V4's query and KV preparation: each head of ``x`` [..., d] RMS-normed in float32 (times ``weight`` where given;
    the query's norm has none), rounded to ``x``'s dtype, then :func:`rope` on its last ``rope_dim`` dims (SGLang 0.5.23
    ``fused_q_norm_rope`` and ``fused_k_norm_rope_flashmla``)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
    if weight is not None:
        y = y * weight.float()
    return rope(y.to(x.dtype), cos, sin, rope_dim)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rotate the last ``rope_dim`` dims of ``x`` [..., d] as interleaved pairs (DeepSeek's convention, and the fused
    glue kernel's: ``kernels.glue.rope``); cos/sin [B, rope_dim/2]."""
    nope, pe = x[..., :-rope_dim], x[..., -rope_dim:]
    x1, x2 = pe[..., 0::2].float(), pe[..., 1::2].float()
    while cos.dim() < x1.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rot = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)
    return torch.cat([nope, rot], dim=-1)


def sparse_attention_torch(
    q: torch.Tensor, kv_pool: torch.Tensor, rows: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference sparse MQA decode: q [B, H, d], kv_pool [N, d] (K = V), rows [B, T] (-1 = masked) -> [B, H, d].
    An fp8 pool comes with ``kv_scale`` [N] (row r holds ``kv_pool[r] * kv_scale[r]``): the gathered rows are
    dequantised in float32."""
    safe = rows.clamp(min=0)
    kv = kv_pool[safe].float()  # [B, T, d]
    if kv_scale is not None:
        kv = kv * kv_scale[safe].unsqueeze(-1)
    s = torch.einsum("bhd,btd->bht", q.float(), kv) * scale
    s = s.masked_fill((rows < 0).unsqueeze(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bht,btd->bhd", p, kv).to(q.dtype)


def indexer_scores_torch(qi: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``score[b, j] = sum_h relu(q[b,h] . k[b,j]) * w[b,h]`` with the [B, H, rows] logits in memory, as SGLang's
    torch path does. qi [B, Hi, Di], w [B, Hi], keys [B, rows, Di] -> [B, rows] float32."""
    if dtype == torch.float8_e4m3fn:  # no fp8 bmm in torch: emulate the precision, compute in bf16
        qi, keys, dtype = qi.to(dtype).to(torch.bfloat16), keys.to(dtype).to(torch.bfloat16), torch.bfloat16
    logits = torch.einsum("bhd,bjd->bhj", qi.to(dtype), keys.to(dtype))
    return (torch.relu(logits).float() * w.float().unsqueeze(-1)).sum(1)
