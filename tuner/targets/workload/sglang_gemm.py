"""V4's block-FP8 linears as SGLang 0.5.23 runs them on sm_90: its activation quantisation, then DeepGEMM (the
default) or its own Triton GEMM (``--fp8-gemm-backend triton``).

SGLang's dispatch (``srt/layers/quantization/fp8_utils.py``) binds ``act_scale_ue8m0=True`` for a checkpoint whose
quantisation config says ``scale_fmt: ue8m0``, as DeepSeek-V4-Flash's does (``fp8.py:550``). Both Hopper backends
then quantise an activation row the same way, ``sglang_per_token_group_quant_fp8(x, 128, scale_ue8m0=True)``: one
power-of-two float32 scale per 128 values, row-major (``fp8_utils.py:1559`` for DeepGEMM, ``:1803`` for Triton), a
JIT CUDA kernel of SGLang's (``sglang/kernels/ops/quantization/per_token_group_quant.py``). Then:

* ``gemm_impl=deepgemm``: DeepGEMM's ``fp8_gemm_nt`` on the weight's 128 x 128 blocks (SGLang's
  ``w8a8_block_fp8_matmul_deepgemm``; DeepGEMM lays the row-major scales out for TMA itself);
* ``gemm_impl=sglang_triton``: SGLang's Triton block-FP8 GEMM (``sglang/kernels/ops/gemm/fp8_kernel.py``) at the
  configs SGLang ships under ``kernels/ops/gemm/configs/`` for this GPU, its default config where no file matches
  the shape.

The twin calls these kernels of the installed SGLang, with the weight and its ``[ceil(N/128), K/128]`` float32
scales as SGLang's ``Fp8LinearMethod`` holds them (:func:`block_quantize`). Nothing of SGLang
is copied here. SGLang's ``fp8_utils``, the module that holds ``triton_w8a8_block_fp8_linear``, cannot be imported
without ``sgl_kernel`` (its AOT kernel wheel, 373 MB, built for SGLang's pinned torch), and ``fp8_kernel``, which
holds the GEMM, imports SGLang's model executor (torchvision, ``sgl_kernel``) on its way: so the quantisation is
called from its own module, and the GEMM's Triton kernels are compiled from ``fp8_kernel.py``'s source and launched
as its ``w8a8_block_fp8_matmul_triton`` launches them (:mod:`kernels.plugins.sglang_block_fp8`).

Where SGLang's JIT quantisation cannot run (no sglang package, no ``apache-tvm-ffi`` or ``nvcc`` to build it), the
DeepGEMM linear quantises in torch (:func:`group_quantize`: a scale per 128 values
too, not rounded to a power of two, in six elementwise kernels instead of one) and says so once in the trial's log; ``sglang_triton`` refuses instead, naming
what is missing.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

import torch

from tuner.errors import KnobError

BLOCK_SHAPE = [128, 128]
_logger = logging.getLogger(__name__)


BLOCK = 128
"""DeepSeek's fp8 block: a scale per 128 x 128 weights, per 128 values of an activation row."""


def block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] (K a multiple of 128) as e4m3 with one float32 scale per 128 x 128 block: ([..., N, K],
    [..., ceil(N/128), K/128]); leading dimensions (``wo_a``'s groups) are quantised each on its own."""
    *lead, n, k = w.shape
    rows = -(-n // BLOCK) * BLOCK
    wp = torch.zeros(*lead, rows, k, device=w.device, dtype=torch.float32)
    wp[..., :n, :] = w.float()
    blocks = wp.view(*lead, rows // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[..., :, None, :, None]).to(torch.float8_e4m3fn)
    return q.view(*lead, rows, k)[..., :n, :].contiguous(), scale.contiguous()


def group_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation rows [M, K] as e4m3 with one float32 scale per 128 values of a row: ([M, K], [M, K/128])."""
    m, k = x.shape
    v = x.float().reshape(m, k // BLOCK, BLOCK)
    scale = v.abs().amax(-1).clamp(min=1e-12) / 448.0
    return (v / scale[..., None]).to(torch.float8_e4m3fn).view(m, k), scale.contiguous()


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q [..., N, K]`` e4m3 with ``scale [..., ceil(N/128), K/128]`` (:func:`block_quantize`'s) back to float32."""
    n, k = q.shape[-2:]
    s = scale.repeat_interleave(BLOCK, dim=-2)[..., :n, :].repeat_interleave(BLOCK, dim=-1)[..., :k]
    return q.float() * s


def _sglang_quant_fn(ue8m0: bool = True) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8

    def quant(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sglang_per_token_group_quant_fp8(x2, BLOCK_SHAPE[1], scale_ue8m0=ue8m0)

    return quant


@functools.lru_cache(maxsize=2)
def sglang_activation_quant(ue8m0: bool = True) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """SGLang's activation quantisation for V4's linears (``x [M, K]`` bf16 -> e4m3 ``[M, K]``, float32 ``[M, K/128]``;
    ``ue8m0``: scales rounded up to powers of two, as for V4's linears; not for ``wo_a`` on sm_90), built and run once
    on a small row here; None where it cannot (the reason logged once)."""
    try:
        quant = _sglang_quant_fn(ue8m0)
        quant(torch.ones(1, BLOCK_SHAPE[1], device="cuda", dtype=torch.bfloat16))
        return quant
    except Exception as e:  # an ImportError, a module of SGLang's runtime failing at import, or the JIT build
        _logger.warning(
            "SGLang's per-token-group fp8 quantisation does not run here (%s: %s): the DeepGEMM linears quantise "
            "their activations in torch (scales not rounded to powers of two, six kernels instead of SGLang's one)",
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )
        return None


@functools.lru_cache(maxsize=1)
def _sglang_triton() -> tuple[Callable, Callable]:
    from kernels.plugins.sglang_block_fp8 import block_fp8_matmul, source_path
    from kernels.plugins.sglang_moe import SGLangKernelUnavailable

    quant = sglang_activation_quant()
    try:
        source_path()
    except SGLangKernelUnavailable as e:
        raise KnobError(
            f"workload knob `gemm_impl=sglang_triton` runs SGLang's Triton block-FP8 GEMM from its source, but {e}; "
            "or use gemm_impl=deepgemm"
        ) from None
    if quant is None:
        raise KnobError(
            "workload knob `gemm_impl=sglang_triton` quantises activations with SGLang's JIT per_token_group_quant, "
            "which does not build here: install apache-tvm-ffi and a CUDA toolkit (nvcc on PATH or under CUDA_HOME), "
            "or use gemm_impl=deepgemm"
        )
    return quant, block_fp8_matmul


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ weight.T`` for an e4m3 ``weight [N, K]`` with block scales ``scale [ceil(N/128), K/128]``, as
    SGLang's ``triton_w8a8_block_fp8_linear`` computes it for a ue8m0 checkpoint (output in ``x``'s dtype)."""
    quant, matmul = _sglang_triton()
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.bfloat16:
        x2 = x2.to(torch.bfloat16)
    q, xs = quant(x2.contiguous())
    out = matmul(q, weight, xs, scale, BLOCK_SHAPE, output_dtype=torch.bfloat16)
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)


WO_A_RECIPE = (1, 128, 128)
"""DeepGEMM's scale granularity for ``wo_a`` on sm_90: SGLang's ``recipe`` there (``deepseek_v4.py:3017``)."""


def wo_a_einsum(o: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """V4's grouped ``wo_a`` as SGLang runs it on sm_90 (``_fp8_wo_a_einsum``): ``o [B, G, D]`` quantised per 128
    values with float32 scales (SGLang's JIT kernel, else torch's), then DeepGEMM's
    ``fp8_einsum("bhr,hdr->bhd", (o_fp8, o_s), (weight [G, R, D], scale [G, R/128, D/128]), out, recipe=(1, 128,
    128))``; bf16 ``[B, G, R]``."""
    import deep_gemm

    b, g, d = o.shape
    o2 = o.reshape(b * g, d).to(torch.bfloat16).contiguous()
    quant = sglang_activation_quant(False)
    q, s = quant(o2) if quant is not None else group_quantize(o2)
    out = torch.empty(b, g, weight.shape[1], device=o.device, dtype=torch.bfloat16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (q.view(b, g, d), s.view(b, g, -1)), (weight, scale), out, recipe=WO_A_RECIPE)
    return out


@functools.lru_cache(maxsize=1)
def wo_a_einsum_runs() -> bool:
    """Whether :func:`wo_a_einsum` runs here and agrees with float32 on one small call (checked once per process);
    where not, the reason is logged once and ``wo_a`` stays the twin's 16-bit bmm."""
    try:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        gen = torch.Generator(device="cuda").manual_seed(0)
        o = torch.randn(4, 2, 256, device="cuda", generator=gen)
        w = torch.randn(2, 128, 256, device="cuda", generator=gen)  # [G, R, D]
        q, s = block_quantize(w)
        got = wo_a_einsum(o, q, s).float()
        want = torch.einsum("bgd,grd->bgr", o, dequantize_blocks(q, s))
        err = float((got - want).norm() / want.norm())
        if not err < 5e-2:
            raise RuntimeError(f"relative error {err:.3g} against float32 on a 4 x 2 x 256 -> 128 call")
        return True
    except Exception as e:  # deep_gemm missing or failing on this GPU, or SGLang's quantisation failing
        _logger.warning(
            "DeepGEMM's fp8_einsum for V4's grouped wo_a does not run here (%s: %s): wo_a stays a 16-bit bmm",
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )
        return False
