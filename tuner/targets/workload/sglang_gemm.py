"""V4's block-FP8 linears as SGLang 0.5.23 runs them with ``--fp8-gemm-backend triton``.

SGLang's dispatch (``srt/layers/quantization/fp8_utils.py``, ``dispatch_w8a8_block_fp8_linear``) sends every block-FP8
linear to ``triton_w8a8_block_fp8_linear`` under that flag: its Triton ``per_token_group_quant_fp8`` (one e4m3 scale per
128 values of an activation row, row-major scales), then its Triton ``w8a8_block_fp8_matmul`` over the weight's
128 x 128 blocks, at the configs SGLang ships for this GPU under ``sglang/kernels/ops/gemm/configs/`` (its default
config where no file matches the shape). The twin calls that same function of the installed SGLang, with the weight
and its ``[ceil(N/128), K/128]`` float32 scales as SGLang's ``Fp8LinearMethod`` holds them
(``tuner.targets.workload.ops.block_quantize``). Nothing of SGLang is copied here.

Importing SGLang's ``fp8_utils`` loads a large part of its runtime (transformers, torchvision, its DeepGEMM wrapper);
the import happens at the first call, in the trial's process, and a failure names what is missing.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from tuner.errors import KnobError

BLOCK_SHAPE = [128, 128]


@functools.lru_cache(maxsize=1)
def _sglang_linear() -> Callable[..., torch.Tensor]:
    try:
        from sglang.srt.layers.quantization.fp8_utils import triton_w8a8_block_fp8_linear
    except Exception as e:  # an ImportError, or a module of SGLang's runtime failing at import
        raise KnobError(
            f"workload knob `gemm_impl=sglang_triton` runs SGLang's Triton block-FP8 GEMM, but "
            f"sglang.srt.layers.quantization.fp8_utils does not import here ({type(e).__name__}: {e}): install sglang "
            "0.5.23 with its runtime dependencies, or use gemm_impl=deepgemm"
        ) from None
    return triton_w8a8_block_fp8_linear


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ weight.T`` for an e4m3 ``weight [N, K]`` with block scales ``scale [ceil(N/128), K/128]``, by
    SGLang's ``triton_w8a8_block_fp8_linear`` (output in ``x``'s dtype, as SGLang's)."""
    fn = _sglang_linear()
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.bfloat16:
        x2 = x2.to(torch.bfloat16)
    out = fn(x2.contiguous(), weight, BLOCK_SHAPE, scale)
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)
