"""What this machine can run: capabilities that a parameter or a value may require."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

_logger = logging.getLogger(__name__)

CAPABILITIES = {
    "cuda": "an NVIDIA GPU with CUDA",
    "triton": "Triton kernels on a GPU (the CPU interpreter is far too slow to time)",
    "cuda_graphs": "CUDA graphs (needs a GPU)",
    "tf32": "TF32 tensor cores (compute capability >= 8.0)",
    "bf16_tc": "bf16 tensor cores (compute capability >= 8.0)",
    "fp8": "fp8 e4m3 tensor cores (compute capability >= 8.9)",
    "fp4": "fp4 tensor cores (compute capability >= 10.0)",
    "wgmma": "Hopper warpgroup MMA (compute capability 9.0) and a Triton with Gluon's Hopper API",
    "torch_compile": "torch.compile with a working backend compiler",
    "multi_gpu": "two or more GPUs",
    "flash_mla": "FlashMLA's Hopper kernels: an sm_90 GPU and the sgl-flash-mla wheel (`pip install tuner[flashmla]`)",
    "deep_gemm": "DeepGEMM's kernels as SGLang runs them: an sm_90 or sm_100 GPU and the deep_gemm module (SGLang's "
    "sgl-deep-gemm wheel, or DeepGEMM built from source: benchmarks/deepgemm_build.sh)",
    "sglang_triton": "SGLang's own Triton block-FP8 GEMM (compiled from sglang/kernels/ops/gemm/fp8_kernel.py) after "
    "its JIT activation quantisation: an NVIDIA GPU with Triton, the sglang package, and SGLang's JIT kernels "
    "buildable (sglang_jit)",
    "sglang_jit": "SGLang's own JIT CUDA kernels (sglang.kernels.ops): an NVIDIA GPU, the sglang package with "
    "apache-tvm-ffi, and nvcc (on PATH or under CUDA_HOME) to build them",
}


@dataclass(frozen=True)
class Hardware:
    """A description of the machine the search runs on. Build with :func:`detect_hardware` or by hand in tests."""

    gpu_name: str = "cpu"
    gpu_count: int = 0
    compute_capability: tuple[int, int] | None = None
    has_triton: bool = False
    has_torch_compile: bool = False
    extra: frozenset[str] = field(default_factory=frozenset)
    has_gluon: bool = False
    has_flash_mla: bool = False
    """The ``flash_mla`` module (the sgl-flash-mla wheel) imports."""
    has_deep_gemm: bool = False
    """The ``deep_gemm`` module is installed (SGLang's sgl-deep-gemm wheel or a build from source)."""
    has_sglang_triton: bool = False
    """SGLang's Triton block-FP8 GEMM's source (``sglang/kernels/ops/gemm/fp8_kernel.py``, compiled from the file: the
    module imports SGLang's runtime) is installed, Triton runs on a GPU, and its JIT activation quantisation can build
    (``has_sglang_jit``)."""
    has_sglang_jit: bool = False
    """The ``sglang`` and ``tvm_ffi`` modules are installed and ``nvcc`` is found: SGLang's JIT kernels can build."""

    @property
    def arch(self) -> str | None:
        """The GPU's architecture as SGLang's gates name it: ``gfx950`` (MI350/MI355X), else ``sm_XY``; None on a CPU."""
        if not self.gpu_count:
            return None
        if any(m in self.gpu_name for m in ("MI355", "MI350", "gfx950")):
            return "gfx950"
        cc = self.compute_capability
        return f"sm_{cc[0]}{cc[1]}" if cc else None

    @property
    def capabilities(self) -> frozenset[str]:
        caps = set(self.extra)
        if self.gpu_count > 0:
            caps |= {"cuda", "cuda_graphs"}
            if self.has_triton:
                caps.add("triton")
            cc = self.compute_capability or (0, 0)
            if cc >= (8, 0):
                caps |= {"tf32", "bf16_tc"}
            if cc >= (8, 9):
                caps.add("fp8")
            if cc >= (10, 0):
                caps.add("fp4")
            if cc == (9, 0) and self.has_triton and self.has_gluon:
                caps.add("wgmma")
            if cc == (9, 0) and self.has_flash_mla:
                caps.add("flash_mla")
            if cc in ((9, 0), (10, 0)) and self.has_deep_gemm:
                caps.add("deep_gemm")
            if self.has_sglang_jit:
                caps.add("sglang_jit")
            if self.has_sglang_triton and self.has_triton:
                caps.add("sglang_triton")
            if self.gpu_count >= 2:
                caps.add("multi_gpu")
        if self.has_torch_compile:
            caps.add("torch_compile")
        return frozenset(caps)

    def to_json(self) -> dict:
        """A JSON-able form (sent to trial subprocesses so they resolve the space exactly as the search did)."""
        return {
            "gpu_name": self.gpu_name,
            "gpu_count": self.gpu_count,
            "compute_capability": list(self.compute_capability) if self.compute_capability else None,
            "has_triton": self.has_triton,
            "has_torch_compile": self.has_torch_compile,
            "extra": sorted(self.extra),
            "has_gluon": self.has_gluon,
            "has_flash_mla": self.has_flash_mla,
            "has_deep_gemm": self.has_deep_gemm,
            "has_sglang_jit": self.has_sglang_jit,
            "has_sglang_triton": self.has_sglang_triton,
        }

    @classmethod
    def from_json(cls, data: dict) -> Hardware:
        cc = data.get("compute_capability")
        return cls(
            gpu_name=data.get("gpu_name", "cpu"),
            gpu_count=int(data.get("gpu_count", 0)),
            compute_capability=tuple(cc) if cc else None,
            has_triton=bool(data.get("has_triton")),
            has_torch_compile=bool(data.get("has_torch_compile")),
            extra=frozenset(data.get("extra", ())),
            has_gluon=bool(data.get("has_gluon")),
            has_flash_mla=bool(data.get("has_flash_mla")),
            has_deep_gemm=bool(data.get("has_deep_gemm")),
            has_sglang_jit=bool(data.get("has_sglang_jit")),
            has_sglang_triton=bool(data.get("has_sglang_triton")),
        )

    def missing(self, required: tuple[str, ...]) -> list[str]:
        return [r for r in required if r not in self.capabilities]


def arch_of_environment(env: dict | None) -> str | None:
    """The first GPU's architecture (:attr:`Hardware.arch`) of a stored run's environment fingerprint (``{"gpus":
    [{"name", "compute_capability": "9.0"}]}``); None for a CPU run."""
    gpu = ((env or {}).get("gpus") or [{}])[0]
    cc = tuple(int(x) for x in str(gpu.get("compute_capability") or "").split(".") if x.isdigit()) or None
    return Hardware(gpu_name=gpu.get("name", "cpu"), gpu_count=1 if gpu else 0, compute_capability=cc).arch


def detect_hardware() -> Hardware:
    """Probe torch/triton for this machine. Never raises: a missing piece only removes capabilities."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return Hardware()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    name, cc = "cpu", None
    if count:
        name = torch.cuda.get_device_name(0)
        cc = tuple(torch.cuda.get_device_capability(0))
    try:
        import triton  # noqa: F401

        has_triton = True
    except ImportError:
        has_triton = False
    has_compile = False
    if count and has_triton:
        has_compile = True
    else:
        import shutil

        # Inductor on the CPU needs a C++ compiler.
        has_compile = shutil.which("g++") is not None or shutil.which("c++") is not None
    try:  # the Hopper half of Gluon (kernels/sparse_decode_wgmma/ is written in it)
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401

        has_gluon = True
    except ImportError:
        has_gluon = False
    import importlib.util

    has_flash_mla = importlib.util.find_spec("flash_mla") is not None  # imported by the trial, not here
    # an installed module that does not load beside this torch (a wheel built for another one) is no capability: on
    # a GPU each is imported once in a child process, so the baseline never picks a kernel that cannot load
    has_deep_gemm = importlib.util.find_spec("deep_gemm") is not None and (not count or imports("deep_gemm"))
    has_sglang_jit = bool(count) and _sglang_jit_buildable() and imports("sglang.kernels.ops.attention.dsv4")
    has_sglang_triton = (  # its Triton kernels are compiled from the file: the module (SGLang's runtime) not imported
        has_sglang_jit and has_triton and _sglang_file("kernels/ops/gemm/fp8_kernel.py")
    )
    return Hardware(
        gpu_name=name,
        gpu_count=count,
        compute_capability=cc,
        has_triton=has_triton,
        has_torch_compile=has_compile,
        has_gluon=has_gluon,
        has_flash_mla=has_flash_mla,
        has_deep_gemm=has_deep_gemm,
        has_sglang_jit=has_sglang_jit,
        has_sglang_triton=has_sglang_triton,
    )


def _sglang_file(relative: str) -> bool:
    """Whether the installed sglang package holds ``relative`` (SGLang's __init__ is not run)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sglang")
    return bool(spec and spec.submodule_search_locations) and any(
        (Path(root) / relative).is_file() for root in spec.submodule_search_locations
    )


def imports(module: str, timeout_s: float = 120.0) -> bool:
    """Whether ``import module`` succeeds in a fresh Python process (this process imports nothing of it)."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        _logger.info("%s is installed but does not import here: %s", module, last[:200])
    return done.returncode == 0


def _sglang_jit_buildable() -> bool:
    """The pieces SGLang's JIT needs are there (the trial imports and builds the kernels, not this probe): the sglang
    package, apache-tvm-ffi, and nvcc on PATH or under CUDA_HOME (or /usr/local/cuda)."""
    import importlib.util
    import os
    import shutil

    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("tvm_ffi") is None:
        return False
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(home, "bin", "nvcc"))
