"""Triton kernels for the DeepSeek-V4-Flash decode path, each tunable, checked and costed.

Importable on a GPU host without the rest of the project. Public surface::

    from kernels import get_kernel, KERNELS              # registry
    from kernels.sparse_decode import sparse_decode, sparse_decode_simt
    from kernels.indexer import indexer_scores, indexer_topk
    from kernels.gemm import gemm, torch_linear
    from kernels.linear import linear
    from kernels.gemv import gemv
    from kernels.glue import fused_add_rmsnorm, rope
    from kernels.configs import lookup, write_config_file
    from kernels.bench import do_bench, measure_copy_bandwidth, measure_launch_us, measure_matmul_tflops

On a machine without CUDA set ``TRITON_INTERPRET=1`` before Triton is first imported to run the
kernels in Triton's interpreter (tests/kernels/conftest.py does this).
"""

from .base import Cost, InvalidConfig, KernelError, TunableKernel, WrongResult, check, classify_failure, verify
from .registry import KERNELS, get_kernel, kernel_names

__all__ = [
    "Cost",
    "InvalidConfig",
    "KernelError",
    "TunableKernel",
    "WrongResult",
    "check",
    "classify_failure",
    "verify",
    "KERNELS",
    "get_kernel",
    "kernel_names",
]
