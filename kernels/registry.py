"""One flat registry of every tunable kernel. Modules are imported on first use."""

from __future__ import annotations

import importlib

from .base import TunableKernel

__all__ = ["KERNELS", "get_kernel", "kernel_names"]

# name -> "module:class"; the module is imported the first time the kernel is asked for.
KERNELS: dict[str, str] = {
    "sparse_decode": "kernels.sparse_decode:SparseDecodeKernel",
    "sparse_decode_simt": "kernels.sparse_decode:SparseDecodeSimtKernel",
    "sparse_decode_wgmma": "kernels.sparse_decode_wgmma:SparseDecodeWgmmaKernel",
    "indexer": "kernels.indexer:IndexerKernel",
    "gemm": "kernels.gemm:GemmKernel",
    "gemv": "kernels.gemv:GemvKernel",
    "moe": "kernels.moe:MoEKernel",
    "rmsnorm": "kernels.glue:RMSNormKernel",
    "rope": "kernels.glue:RopeKernel",
    # plug-ins: kernels that load a server's own Triton source (kernels/plugins/)
    "sglang_fused_moe": "kernels.plugins.sglang_moe:SGLangFusedMoEKernel",
}

_INSTANCES: dict[str, TunableKernel] = {}


def kernel_names() -> list[str]:
    return list(KERNELS)


def get_kernel(name: str) -> TunableKernel:
    """The kernel object registered as ``name``."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; registered: {sorted(KERNELS)}")
    if name not in _INSTANCES:
        module_name, class_name = KERNELS[name].split(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        _INSTANCES[name] = getattr(cls, "instance", None) or cls()
    return _INSTANCES[name]
