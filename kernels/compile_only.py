"""Compile a kernel config without running it, so that compiling can overlap with timing elsewhere.

Triton compiles a config at its first launch and keeps the binary in its on-disk cache (``TRITON_CACHE_DIR``),
keyed by the source, the constexprs, the launch options and the argument specialisation (dtypes, 16-byte
alignment, ints equal to 1). A helper process that compiles a config with the same arguments fills that cache, and
the process that later times the config loads the binary instead of compiling it.

:func:`compile_config` runs a kernel's own ``run`` wrapper on *meta* tensors (shapes, strides and dtypes, no
memory) inside :func:`jit_compile_only`, where every ``@triton.jit`` launch compiles (or loads) its binary and
returns without launching. Nothing runs on the GPU: the wrapper's torch ops on meta tensors only compute shapes,
so a helper never disturbs a measurement in flight. It still needs the CUDA driver (Triton asks it for the
target), so it runs on the GPU host, never under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

import torch

from .base import TunableKernel

__all__ = ["compile_config", "jit_compile_only", "meta_inputs"]

_logger = logging.getLogger(__name__)
_lock = threading.Lock()


@contextlib.contextmanager
def jit_compile_only() -> Iterator[None]:
    """Within the block every ``@triton.jit`` launch compiles its binary (or loads it from the cache) and returns
    without launching (Triton's own ``warmup`` path). Process-wide: use it in helper processes only."""
    from triton.runtime.jit import JITFunction

    with _lock:
        original = JITFunction.run

        def run(self, *args, **kwargs):
            kwargs["warmup"] = True
            return original(self, *args, **kwargs)

        JITFunction.run = run
        try:
            yield
        finally:
            JITFunction.run = original


def meta_inputs(inputs: Any) -> Any:
    """``inputs`` with every tensor replaced by a meta tensor of the same shape, strides and dtype."""
    if isinstance(inputs, torch.Tensor):
        # a view keeps its storage offset, so its pointer's 16-byte alignment (part of the cache key) is the same
        base = torch.empty(
            inputs.untyped_storage().nbytes() // inputs.element_size(), dtype=inputs.dtype, device="meta"
        )
        return base.as_strided(inputs.shape, inputs.stride(), inputs.storage_offset())
    if isinstance(inputs, dict):
        return {k: meta_inputs(v) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(meta_inputs(v) for v in inputs)
    return inputs


def compile_config(kernel: TunableKernel, inputs: dict, config: dict) -> None:
    """Compile every Triton kernel that ``kernel.run(inputs, config)`` would launch, launching none.

    ``inputs`` are meta tensors (:func:`meta_inputs` of the inputs a trial makes). Raises what the compiler
    raises (``CompilationError``, ``OutOfResources`` where the backend checks at compile time).
    """
    out = kernel.output_like(inputs)
    with jit_compile_only():
        if out is None:
            kernel.run(inputs, config)
        else:
            kernel.run(inputs, config, out=out)
