"""The numerics gate of the workload: a configuration's step output against the precise reference's.

Every trial runs one decode step on fixed inputs (a fixed seed, ``numerics_batch`` requests of ``live_context``
tokens) and compares its output with the reference configuration's on the same weights and inputs, by relative norm
error (float64). The reference (:func:`reference_knobs`) is the twin's most precise configuration: float32 GEMMs,
torch operators, a bf16 cache, eager glue (on a GPU its activations are bf16, as every configuration's are), never the
search's baseline, which on a GPU the deployment map makes SGLang's fp8 path: two fp8 outputs differ by up to the sum
of their errors, and measured against the fp8 baseline a bf16 configuration used 0.25 of fp8's 0.30. Beyond the
tolerance of the configuration's dtype family (its narrowest GEMM dtype, its cache's, and bf16 on a GPU) the trial is
``wrong_result`` and never wins.

The reference output is cached in a file keyed by everything that changes it (preset, reference knobs, weight and
input seeds, batch, live context, device, torch and Triton versions, tuned kernel config files, the twin's and the
kernels' source): the baseline trial, run first, writes it, and every later trial process reads it instead of building
a second model (on the full preset a second set of weights on the GPU). A missing or unreadable file is recomputed in
the trial's own process, so the cache only saves time and never decides a result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from tuner.targets.workload.model import DEFAULT_KNOBS, DecodeModel
from tuner.targets.workload.presets import Preset

_logger = logging.getLogger(__name__)

FAMILIES = ("fp32", "tf32", "fp16", "bf16", "fp8")
"""Dtype families from the most to the least precise."""
DEFAULT_TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 0.08, "bf16": 0.08, "fp8": 0.30}
"""Relative norm error allowed per family, read off the errors measured over 3 weight x 4 input seeds on an H200
(``benchmarks/results/numerics_gpu/h200/2026-11-30_10b81fc.md``, ``benchmarks/numerics_gpu.py``): single bf16 changes and the
hand-written best stay within 0.04 (bf16 0.08, twice that); fp8 projections 0.06-0.10, and the fp8 shared-expert GEMMs
through every layer 0.19-0.26 (all of the space's fp8 GEMMs together as well), which a V4 deployment runs (its
checkpoint is fp8), so fp8 admits them with a margin (0.30; 0.25 cut through that spread: 2 of 12 draws beyond it).
What it refuses is an error beyond what fp8 arithmetic gives, as a kernel computing another function did (0.40-0.60:
the fused glue's RoPE convention, found so)."""
GEMM_KNOBS = ("gemm_proj", "gemm_indexer", "gemm_moe", "gemm_mhc")
INPUT_SEED = 20261130
"""The numerics step's inputs (not the timed steps'): fixed, so the baseline's output can be cached."""


def dtype_family(knobs: dict[str, Any], device: torch.device) -> str:
    """The least precise dtype family a configuration computes in (its GEMMs' dtypes, its KV cache's)."""
    names = [str(knobs.get(k, "fp32")) for k in GEMM_KNOBS]
    if knobs.get("kv_cache_dtype") == "fp8_e4m3":
        names.append("fp8")
    if device.type == "cuda":
        names.append("bf16")
    return max((n for n in names if n in FAMILIES), key=FAMILIES.index, default="fp32")


def reference_knobs(preset: Preset, knobs: dict[str, Any]) -> dict[str, Any]:
    """The precise configuration a configuration's output is checked against: float32 GEMMs, and otherwise the twin's
    defaults (torch operators, a bf16 cache, eager glue), at the same context cap, its indexer scoring the live width (the same
    scores and picks as the full width, without a torch indexer as wide as a 1M cap)."""
    precise = {k: "fp32" for k in GEMM_KNOBS}
    cap = normalized(preset, knobs)["context_length"]
    return normalized(preset, {**precise, "context_length": cap, "indexer_width": "live", "kv_cache_dtype": "bf16"})


BASELINE_MARGIN = 1.2
"""A configuration within this factor of the baseline's own error is never ``wrong_result`` under a default
tolerance: the baseline is the deployment's path (on an H200 SGLang's fp8 linears, fp8 cache and DeepGEMM indexer),
whose error against the precise reference was not measured as a whole and may pass fp8's 0.30."""


def tolerance_for(family: str, overrides: dict[str, float], baseline_err: float = 0.0) -> float:
    """The family's tolerance: the setting's where given (a user's number holds as written), else the default,
    widened to :data:`BASELINE_MARGIN` times the baseline's own error when that is larger."""
    if family in overrides:
        return overrides[family]
    return max(DEFAULT_TOLERANCE[family], BASELINE_MARGIN * baseline_err)


def step_output(model: DecodeModel, batch: int, live_context: int) -> torch.Tensor:
    """One eager decode step on the fixed inputs, as float64 on the CPU."""
    st = model.state(batch, live_context, seed=INPUT_SEED)
    with torch.inference_mode():
        out = model.step(st)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return out.detach().to("cpu", torch.float64)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||``; infinite for a non-finite output or a shape mismatch."""
    if out.shape != ref.shape or not bool(torch.isfinite(out).all()):
        return math.inf
    denom = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(out - ref)) / (denom if denom > 0 else 1.0)


def normalized(preset: Preset, knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs a :class:`DecodeModel` runs with (its defaults filled in), for comparing and keying."""
    out = {**DEFAULT_KNOBS, **{k: v for k, v in knobs.items() if k in DEFAULT_KNOBS or "." in k}}
    if out["context_length"] is None:
        out["context_length"] = preset.max_context
    return out


def code_digest() -> str:
    """A digest of the source that computes a step (the twin's model and operators, the Triton kernels): a cached
    reference output from other code is never read as this code's."""
    import kernels

    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + sorted(Path(kernels.__file__).resolve().parent.rglob("*.py"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(
    preset: Preset, reference: dict[str, Any], *, seed: int, batch: int, live_context: int, device: torch.device
) -> str:
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    kdir = os.environ.get("TUNER_KERNEL_CONFIG_DIR")  # tuned configs change a Triton kernel's summation order
    configs = (
        sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(kdir).glob("*.json"))
        if kdir and Path(kdir).is_dir()
        else []
    )
    doc = {
        "preset": preset.name,
        "knobs": {k: str(v) for k, v in sorted(reference.items())},
        "seed": seed,
        "input_seed": INPUT_SEED,
        "batch": batch,
        "live_context": live_context,
        "device": dev,
        "torch": torch.__version__,
        "triton": triton_version,
        "kernel_configs": [kdir, configs],
        "code": code_digest(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_NUMERICS_CACHE") or Path(tempfile.gettempdir()) / "tuner-numerics")


def reference_output(
    preset: Preset,
    reference: dict[str, Any],
    device: torch.device,
    *,
    seed: int,
    batch: int,
    live_context: int,
    own: DecodeModel | None = None,
) -> torch.Tensor:
    """The reference configuration's step output (``reference``: :func:`reference_knobs`): from the cache file, else
    computed here (with ``own``, the trial's model, when its knobs are the reference's) and written for the next
    trial."""
    reference = normalized(preset, reference)
    path = cache_dir() / (
        cache_key(preset, reference, seed=seed, batch=batch, live_context=live_context, device=device) + ".pt"
    )
    try:
        ref = torch.load(path, map_location="cpu")
        if isinstance(ref, torch.Tensor):
            return ref
    except (OSError, RuntimeError, EOFError, ValueError):
        pass
    if own is not None and own.knobs == reference:
        ref = step_output(own, batch, live_context)
    else:
        base = DecodeModel(preset, reference, device, seed=seed)
        ref = step_output(base, batch, live_context)
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        torch.save(ref, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        _logger.info("numerics: cannot cache the reference output at %s (%s); each trial computes it", path, exc)
    return ref
