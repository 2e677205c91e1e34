"""The contract every tunable kernel follows, and the helpers written once on top of it.

A :class:`TunableKernel` describes one Triton kernel to a search:

* ``name``: the registry name, also the first part of its tuned-config file name.
* ``batch_dim``: the shape entry that varies at serving time (``"batch"``, ``"M"``, ``"tokens"``);
  tuned-config lookup matches every other dim exactly and takes the nearest batch in log space.
* ``default_config(shape) -> dict``: a config that is always correct and fits every GPU the kernel
  supports. Tuned configs only make a kernel faster, never make it run.
* ``config_space(shape) -> dict[str, list]``: candidate values per tunable parameter.
* ``seed_configs(shape, device=None) -> list[dict]``: a few more starting points the kernel's own cost model
  suggests (e.g. grids that fill the GPU in whole waves), tried right after the default; ``[]`` by default.
* ``check_config(config, shape, device=None) -> str | None``: why a config cannot run (unknown
  parameter, divisibility, a shared-memory or register estimate over the limit), or ``None``.
  Named rules: the message starts with the rule name, e.g. ``"shared_memory: 260 KiB > 227 KiB"``.
* ``make_inputs(shape, dtype, device, seed) -> dict``: fresh random inputs (never zeros).
* ``run(inputs, config, out=None) -> Tensor``: launch the Triton kernel; the output is freshly
  allocated unless ``out`` is given (``check`` poisons ``out`` with NaN to catch unwritten elements).
* ``reference(inputs) -> Tensor``: the same function in float32 (CUDA) or float64 (CPU) torch.
* ``torch_baseline(inputs) -> Tensor``: plain PyTorch in the input dtype, what a serving stack would
  run without the kernel; this is what benchmarks compare against. Defaults to ``reference``.
* ``tolerance(dtype) -> float``: bound on ``|out - ref| / |ref|`` (Frobenius norms).
* ``cost(shape, dtype) -> Cost``: fewest bytes moved through device memory and FLOPs.
* ``rotation_bytes(shape, dtype) -> float``: memory each further input set takes (default ``cost.bytes``); timing
  rotates as many distinct sets as fit a fixed budget.
* ``shape_key(shape) -> str``: the bucket key used in tuned-config files.
* ``shapes(preset) -> list[dict]``: named realistic shapes (``"v4flash"``: DeepSeek-V4-Flash at
  batch 1, 16, 64; ``"test"``: tiny shapes for the CPU interpreter).

Failures a caller can classify (see :func:`classify_failure`): :class:`InvalidConfig` (rejected by
``check_config`` or by the launcher), ``triton.compiler.errors.CompilationError`` (compile error),
``triton.runtime.errors.OutOfResources`` (shared memory or registers, raised at first launch),
:class:`WrongResult` (raised by :func:`verify`), ``torch.cuda.OutOfMemoryError`` (oom).
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

__all__ = [
    "Cost",
    "KernelError",
    "InvalidConfig",
    "WrongResult",
    "OutOfResources",
    "CompilationError",
    "TunableKernel",
    "classify_failure",
    "rel_error",
    "check",
    "verify",
    "dtype_of",
    "dtype_name",
    "device_limits",
    "tf32_matmul",
    "shared_inputs",
    "release_shared_inputs",
]

logger = logging.getLogger(__name__)


class KernelError(Exception):
    """Root of the errors this package raises on purpose."""


class InvalidConfig(KernelError, ValueError):
    """A config that cannot run for this shape (the message names the rule and the values)."""


class WrongResult(KernelError):
    """The kernel ran but its output is not within tolerance of the reference."""


@dataclass(frozen=True)
class Cost:
    """Fewest bytes moved through device memory and floating-point operations of one call."""

    bytes: float
    flops: float

    def floor_us(self, bytes_per_s: float, flops_per_s: float) -> float:
        """Roofline floor in microseconds: the larger of the memory time and the compute time."""
        return max(self.bytes / bytes_per_s, self.flops / flops_per_s) * 1e6

    def bound(self, bytes_per_s: float, flops_per_s: float) -> str:
        return "memory" if self.bytes / bytes_per_s >= self.flops / flops_per_s else "compute"


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "fp8": getattr(torch, "float8_e4m3fn", None),
    "float64": torch.float64,
    "tf32": torch.float32,  # float32 storage, tf32 tensor-core math (GEMM mode)
}


def dtype_of(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.dtype`` from a name ("bfloat16", "bf16", "fp8", "tf32", ...) or a dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    found = _DTYPES.get(str(dtype).replace("torch.", ""))
    if found is None:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(k for k, v in _DTYPES.items() if v)}")
    return found


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical name of a dtype: ``torch.bfloat16`` -> ``"bfloat16"``; ``"tf32"`` stays ``"tf32"``."""
    if dtype == "tf32":
        return "tf32"
    return str(dtype_of(dtype)).replace("torch.", "")


CPU_FALLBACK_LIMITS = {"shared_memory": 227 * 1024, "registers_per_thread": 255, "cc": (9, 0), "sms": 132}
"""The limits :func:`device_limits` assumes without a CUDA device (CPU, the Triton interpreter, compile-only
builds): an H200's, the GPU the shipped configs were tuned on, so that ``check_config`` and the default configs
choose the same way there as on that GPU."""


def device_limits(device: Any = None) -> dict:
    """Per-block limits of ``device`` (shared memory bytes, registers), its compute capability and SM count, read
    from the device; :data:`CPU_FALLBACK_LIMITS` without a CUDA device."""
    limits = dict(CPU_FALLBACK_LIMITS)
    if device is None or not torch.cuda.is_available():
        return limits
    dev = torch.device(device)
    if dev.type != "cuda":
        return limits
    props = torch.cuda.get_device_properties(dev)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    if smem:
        limits["shared_memory"] = int(smem)
    limits["cc"] = (props.major, props.minor)
    limits["sms"] = int(props.multi_processor_count)
    return limits


def sm_count(device: Any = None) -> int:
    """The SM count of ``device`` (None: this process's current CUDA GPU), asked of the device; without a CUDA
    device, :data:`CPU_FALLBACK_LIMITS`' 132 (an H200's)."""
    return device_limits(("cuda" if torch.cuda.is_available() else None) if device is None else device)["sms"]


_TARGETS: dict[str, tuple[int, int] | None] = {}


def gpu_target(device: Any) -> tuple[int, int] | None:
    """The compute capability a Triton launch with tensors on ``device`` compiles for; None under the interpreter.

    A launcher that picks code paths by GPU (prefetches, programmatic dependent launch) must ask this, not
    ``tensor.is_cuda``: the compile helpers (``kernels.compile_only``) launch on *meta* tensors, and a binary they
    compile with other constexprs than the trial's real CUDA launch is a cache miss, so the trial compiles again.
    CUDA tensors answer their device's capability;
    any other tensor that reaches the compiler (meta in the helpers) answers the active Triton driver's target,
    which is the GPU the helper compiles for.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    dev = torch.device(device)
    key = str(dev)
    if key not in _TARGETS:
        if dev.type == "cuda":
            _TARGETS[key] = tuple(torch.cuda.get_device_capability(dev))
        else:
            from triton.runtime import driver

            target = driver.active.get_current_target()
            arch = target.arch if isinstance(target.arch, int) else 0
            _TARGETS[key] = (arch // 10, arch % 10) if target.backend == "cuda" else None
    return _TARGETS[key]


def cdiv(a: int, b: int) -> int:
    """Ceil division of host-side ints. ``triton.cdiv`` is a ``ConstexprFunction`` in Triton 3.6 and 3.9, each call
    from Python a trip through its wrapper: the kernel search's move choice (``tuner.search.refine``) asks
    ``canonical_config`` of every neighbour, ``split_rows`` two ``cdiv`` each: a hot path of the kernel search."""
    return -(-a // b)


class TunableKernel(abc.ABC):
    """One tunable Triton kernel; contract in the module docstring."""

    name: str = ""
    batch_dim: str = "batch"
    dtypes: tuple[str, ...] = ()
    """Input dtypes the kernel runs (``dtype_name`` spelling, e.g. ``bfloat16``); empty: any."""
    switches: tuple[str, ...] = ()
    """Config fields that are on/off switches (0 or 1); every other field must be a positive int."""

    # --- optional hooks: each does nothing unless a kernel overrides it -------------------------------
    def unavailable(self) -> str | None:
        """Why this kernel cannot run here (e.g. a plug-in whose server is not installed), or None."""
        return None

    def adapt_config(self, config: dict, tuned_shape: dict, shape: dict) -> dict:
        """A config tuned at ``tuned_shape`` (the nearest key of a tuned file: another batch), made fit for ``shape``;
        ``config`` itself unless a kernel knows which fields scale with the batch (split counts, programs a request).
        The result is checked by ``check_config`` like any tuned config (the default config if it fails)."""
        return config

    def fit_dtype(self, config: dict, shape: dict, dtype: Any) -> dict:
        """``config`` (a default or tuned config, which are dtype-blind) made fit for inputs of ``dtype``; ``config``
        itself unless some dtype needs other fields (a schedule that widens an fp8 cache, a smaller ring)."""
        return config

    def recorded_time_us(self, config: dict, shape: dict) -> float | None:
        """A recorded GPU timing of ``config`` at ``shape``, for kernels that replay measured tables on a CPU (tests,
        strategy studies); None: time it for real."""
        return None

    # --- configs -------------------------------------------------------------------------------
    @abc.abstractmethod
    def default_config(self, shape: dict) -> dict: ...

    @abc.abstractmethod
    def config_space(self, shape: dict) -> dict[str, list]: ...

    def seed_configs(self, shape: dict, device: Any = None, dtype: Any = None) -> list[dict]:
        """Starting points beyond the default (rule-passing, no repeats); none unless a kernel knows better."""
        return []

    def canonical_config(self, config: dict, shape: dict) -> dict:
        """``config`` with every field that cannot change the launched program at ``shape`` set to one fixed value,
        so that configs which run the same program compare equal (a search times each program once); ``config``
        itself unless a kernel knows such fields."""
        return config

    def check_config(self, config: dict, shape: dict, device: Any = None, dtype: Any = None) -> str | None:
        """Base rules: every parameter known and present. Subclasses add their own rules."""
        space = self.config_space(shape)
        unknown = sorted(set(config) - set(space))
        if unknown:
            return f"unknown_param: {unknown} not in {sorted(space)}"
        missing = sorted(set(space) - set(config))
        if missing:
            return f"missing_param: {missing}"
        for key, value in config.items():
            if key in self.switches:
                if not isinstance(value, int) or isinstance(value, bool) or value not in (0, 1):
                    return f"switch: {key}={value!r} must be 0 or 1"
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                return f"positive_int: {key}={value!r} must be a positive int"
        return None

    def configs(self, shape: dict, device: Any = None, dtype: Any = None) -> Iterator[dict]:
        """Every config of the space that passes ``check_config``."""
        space = self.config_space(shape)
        keys = sorted(space)
        for values in itertools.product(*(space[k] for k in keys)):
            config = dict(zip(keys, values))
            if self.check_config(config, shape, device, dtype=dtype) is None:
                yield config

    def require_config(self, config: dict, shape: dict, device: Any = None, dtype: Any = None) -> None:
        why = self.check_config(config, shape, device, dtype=dtype)
        if why is not None:
            raise InvalidConfig(f"{self.name}: config {config} cannot run for shape {shape}: {why}")

    # --- inputs, run, reference ------------------------------------------------------------------
    @abc.abstractmethod
    def make_inputs(self, shape: dict, dtype: str | torch.dtype, device: Any, seed: int = 0) -> dict: ...

    @abc.abstractmethod
    def run(self, inputs: dict, config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor: ...

    @abc.abstractmethod
    def reference(self, inputs: dict) -> torch.Tensor: ...

    library_impl: str | None = None
    """The name of a library implementation a deployment can run in this kernel's place (its ``torch_baseline`` is
    that path: the GEMM's cuBLAS through torch is ``"torch"``). The kernel search times it beside the tuned config,
    the same way, and records in the tuned entry's ``impl`` whichever is faster; None: the torch path is only a
    comparison."""

    def torch_baseline(self, inputs: dict) -> torch.Tensor:
        return self.reference(inputs)

    def output_like(self, inputs: dict) -> torch.Tensor | None:
        """An empty output buffer for ``run(out=...)``, or None when the launcher takes no ``out``."""
        return None

    def tolerance(self, dtype: str | torch.dtype) -> float:
        return {
            torch.float32: 5e-3,  # tl.dot on float32 runs as tf32 on NVIDIA GPUs
            torch.float16: 5e-3,
            torch.bfloat16: 2e-2,
            torch.float64: 1e-6,
        }.get(dtype_of(dtype), 6e-2)  # fp8 e4m3

    # --- cost and shapes -------------------------------------------------------------------------
    @abc.abstractmethod
    def cost(self, shape: dict, dtype: str | torch.dtype = "bfloat16") -> Cost: ...

    def rotation_bytes(self, shape: dict, dtype: str | torch.dtype = "bfloat16") -> float:
        """Device memory each further input set of ``make_inputs`` takes, which bounds how many sets a timing
        rotates: by default all of ``cost.bytes``. A kernel whose sets share their large tensors (the MoE's expert
        weights, reused across seeds) says less, so that several routings are timed, not one."""
        return self.cost(shape, dtype).bytes

    def key_dims(self, shape: dict) -> dict:
        """The dims that make up the bucket key (subclasses may round some of them)."""
        return dict(shape)

    def shape_key(self, shape: dict) -> str:
        dims = self.key_dims(shape)
        if self.batch_dim not in dims:
            raise ValueError(f"{self.name}: shape {shape} has no batch dim {self.batch_dim!r}")
        return ",".join(f"{k}={int(dims[k])}" for k in sorted(dims))

    @abc.abstractmethod
    def shapes(self, preset: str = "v4flash") -> list[dict]: ...


# --- failure classes ---------------------------------------------------------------------------------
def classify_failure(exc: BaseException) -> str:
    """Outcome class of an exception raised while compiling, launching or checking a config."""
    if isinstance(exc, OutOfResources):
        return "out_of_resources"
    if isinstance(exc, CompilationError):
        return "compile_error"
    if isinstance(exc, InvalidConfig):
        return "invalid_config"
    if isinstance(exc, WrongResult):
        return "wrong_result"
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return "oom"
    text = f"{type(exc).__name__}: {exc}"
    if "out of resource" in text.lower() or "OutOfResources" in text:
        return "out_of_resources"
    if "CompilationError" in text or "PassManager" in text or "MLIR" in text:
        return "compile_error"
    return "crash"


# --- correctness ---------------------------------------------------------------------------------------
def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``|out - ref| / |ref|`` over finite entries; inf when shapes differ, NaN appears, or the
    positions or signs of infinities differ (a masked score must stay masked).

    Computed in float64 on ``out``'s device; only three numbers come back to the host (every kernel trial's check
    runs it, so no tensor is copied to the host)."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    out_inf, ref_inf = torch.isinf(out64), torch.isinf(ref64)
    zero = out64.new_zeros(())
    bad = torch.isnan(out64).any() | (out_inf != ref_inf).any() | (ref_inf & (out64 != ref64)).any()
    diff = torch.linalg.vector_norm(torch.where(ref_inf, zero, out64 - ref64))
    norm = torch.linalg.vector_norm(torch.where(ref_inf, zero, ref64))
    bad, diff, norm = torch.stack([bad.to(torch.float64), diff, norm]).tolist()
    return math.inf if bad else diff / max(norm, 1e-30)


def check(
    kernel: TunableKernel,
    shape: dict,
    dtype: str | torch.dtype,
    config: dict | None = None,
    device: Any = "cuda",
    seed: int = 0,
) -> float:
    """Run ``kernel`` once on fresh inputs into a NaN-poisoned output; return the relative error.

    Raises what the launch raises (InvalidConfig, CompilationError, OutOfResources, ...).
    A kernel that leaves any element unwritten returns ``inf``.
    """
    inputs = kernel.make_inputs(shape, dtype, device, seed)
    config = kernel.default_config(shape) if config is None else config
    kernel.require_config(config, shape, device, dtype)
    out = kernel.output_like(inputs)
    if out is not None:
        out.fill_(float("nan")) if out.is_floating_point() else out.fill_(-7)
        result = kernel.run(inputs, config, out=out)
    else:
        result = kernel.run(inputs, config)
    ref = kernel.reference(inputs)
    return rel_error(result, ref)


def verify(kernel: TunableKernel, shape: dict, dtype, config=None, device="cuda", seed: int = 0) -> float:
    """:func:`check`, raising :class:`WrongResult` when the error is over ``kernel.tolerance``."""
    err = check(kernel, shape, dtype, config, device, seed)
    tol = kernel.tolerance(dtype)
    if not err <= tol:
        raise WrongResult(f"{kernel.name} {shape} {dtype_name(dtype)} {config}: rel error {err:.3g} > {tol:.3g}")
    return err


_SHARED: dict[tuple, Any] = {}


def shared_inputs(key: tuple, make: Any) -> Any:
    """What every input set of one shape shares, such as MoE expert weights: ``make()`` once per ``key``. Only the
    last key is kept (it is dropped before the next is made), so a search over many shapes holds one copy."""
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = make()
    return _SHARED[key]


def release_shared_inputs() -> None:
    """Drop what :func:`shared_inputs` keeps (a process that made inputs only to take their shapes)."""
    _SHARED.clear()


@contextlib.contextmanager
def tf32_matmul(enabled: bool):
    """torch matmuls on CUDA with tf32 tensor cores on or off inside the block (the previous setting restored)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def zeroed_counters(cache: dict, device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed int32 counters on ``device``, kept in ``cache`` (a launcher's own dict) and reused:
    the kernels that use them leave every counter at zero when they finish."""
    key = str(device)
    buf = cache.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        cache[key] = buf
    return buf
