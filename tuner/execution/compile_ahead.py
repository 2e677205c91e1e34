"""Compile kernel configs ahead of their trials, in helper processes, while the trial worker times others.

A kernel trial is mostly compile time (about 1 s per config on an H200 host against ~0.1 s of checking and timing),
and compiling is CPU work. The kernel search asks Optuna for a few trials ahead (TPE with a constant liar, so the
pending ones are kept apart), hands their configs to :class:`CompileAhead`, and runs the trials in order; by the
time a trial reaches the GPU its binary is in Triton's on-disk cache and the trial worker only loads it.

Helpers compile with :func:`kernels.compile_only.compile_config` (the kernel's own wrapper on meta tensors, Triton's
warmup path): compiling launches nothing, so a measurement in flight on the same GPU is not disturbed (a helper makes
each case's inputs once on the GPU, a few ms of random fill, to take their shapes and strides). A helper's failure
is never a trial's outcome: the trial compiles for itself and its own error (compile error, out of resources) is
what is recorded. Helpers ignore Ctrl-C; the search shuts them down.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

_logger = logging.getLogger(__name__)

MAX_HELPERS = 4
_inputs: dict[tuple, Any] = {}  # in a helper: the meta inputs of the case it last compiled for


def default_helpers(gpu_count: int, cpus: int | None = None) -> int:
    """How many compile helpers a GPU host gets: the CPUs left beside the search and its trial worker, at most
    :data:`MAX_HELPERS`; none without a GPU (the interpreter has nothing to compile)."""
    if cpus is None:
        cpus = os.cpu_count() or 1
    return 0 if gpu_count < 1 else max(0, min(MAX_HELPERS, cpus - 2))


def _init_helper(env: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)


def _compile_task(kernel_name: str, shape: dict[str, int], dtype: str, config: dict[str, Any], seed: int) -> float:
    """In a helper: compile ``config`` for the inputs a trial of this case makes; returns the seconds it took."""
    import torch

    from kernels.base import release_shared_inputs
    from kernels.compile_only import compile_config, meta_inputs
    from tuner.targets.kernels import load_kernel

    kernel = load_kernel(kernel_name)
    key = (kernel_name, json.dumps(shape, sort_keys=True), dtype)
    if key not in _inputs:
        _inputs.clear()
        # once per case, a few ms of random fill on the GPU: a trial's inputs, kept as shapes, strides and dtypes
        real = kernel.make_inputs(shape, dtype, "cuda", seed)
        _inputs[key] = meta_inputs(real)
        del real
        release_shared_inputs()  # e.g. MoE expert weights: the trial worker holds its own copy, not four more
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    compile_config(kernel, _inputs[key], config)
    return time.perf_counter() - t0


class CompileAhead:
    """A pool of ``helpers`` compile processes on the GPUs ``gpus`` (the trial worker's ``CUDA_VISIBLE_DEVICES``,
    so the compiled target is the same), sharing the search's ``TRITON_CACHE_DIR``."""

    def __init__(self, helpers: int, gpus: list[int] | None = None) -> None:
        import multiprocessing

        from tuner.execution.isolation import trial_env

        self.helpers = helpers
        env = {k: v for k, v in trial_env(gpus, {}).items() if k in ("CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR")}
        self._pool = ProcessPoolExecutor(
            max_workers=helpers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_helper,
            initargs=(env,),
        )
        self.submitted = 0
        self.compiled = 0
        self.failed = 0
        self.first_error = ""

    def submit(
        self, kernel_name: str, shape: dict[str, int], dtype: str, config: dict[str, Any], seed: int = 0
    ) -> Future:
        self.submitted += 1
        fut = self._pool.submit(_compile_task, kernel_name, dict(shape), dtype, dict(config), seed)
        fut.add_done_callback(self._count)
        return fut

    def _count(self, fut: Future) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            self.compiled += 1
        else:
            self.failed += 1
            if self.failed == 1:
                self.first_error = f"{type(exc).__name__}: {exc}"[:300]
            _logger.log(
                logging.WARNING if self.failed == 1 else logging.DEBUG,
                "compile ahead failed (the trial compiles for itself): %s: %s",
                type(exc).__name__,
                exc,
            )

    def wait(self, fut: Future, timeout_s: float) -> None:
        """Wait for ``fut`` up to ``timeout_s``; its failure or lateness only means the trial compiles itself."""
        try:
            fut.result(timeout=max(0.0, timeout_s))
        except Exception:  # noqa: BLE001 - counted and logged in _count; a timeout leaves it running
            pass

    def summary(self) -> str:
        return (
            f"compile ahead ({self.helpers} helpers): {self.submitted} configs sent, {self.compiled} compiled, "
            f"{self.failed} failed" + (f" (first: {self.first_error})" if self.first_error else "")
        )

    def close(self) -> None:
        """Stop the helpers now (a compile in flight is abandoned)."""
        procs = list(getattr(self._pool, "_processes", {}).values())  # the executor has no public kill
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
        _logger.info("%s", self.summary())


__all__ = ["CompileAhead", "default_helpers"]
