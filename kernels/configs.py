"""Tuned-config files: one JSON file per (kernel, GPU name, dtype, Triton version).

File name: ``{kernel}__{GPU name, non-alphanumerics as _}__{dtype}__triton-{version}.json``, e.g.
``sparse_decode__NVIDIA_H200__bfloat16__triton-3.6.0.json``. Content: a flat mapping from shape-bucket
keys (``TunableKernel.shape_key``) to ``{"config": {...}, "time_us": x, "default_time_us": y}``.

An entry may also name the implementation that measured fastest for its key, ``"impl": "torch"`` or
``"triton"`` (:func:`lookup_impl`; the GEMM's library-or-Triton choice): a tuned file never ships a Triton
kernel where the library measured faster.

Directory: ``$TUNER_KERNEL_CONFIG_DIR`` when set, else ``kernels/tuned/`` inside this package.

Nearest key: among the file's keys with every non-batch dim equal to the shape's, the one whose
batch is nearest in log space (ties go to the smaller batch). No such key, no file, or an unreadable
file (logged as a warning) means the kernel's default config. A tuned config that fails
``check_config`` for the actual shape is ignored (warning) in favour of the default.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
import triton

from .base import dtype_name

__all__ = [
    "clear_cache",
    "config_dir",
    "config_path",
    "gpu_name",
    "lookup",
    "tuned_config",
    "lookup_impl",
    "nearest_key",
    "read_config_file",
    "tuned_impl",
    "write_config_file",
]

logger = logging.getLogger(__name__)

ENV_VAR = "TUNER_KERNEL_CONFIG_DIR"
_CACHE: dict[tuple, dict] = {}


def config_dir() -> Path:
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path(__file__).resolve().parent / "tuned"


def gpu_name(device: Any = None) -> str:
    """GPU name as torch reports it ("NVIDIA H200"), or "cpu" without CUDA or for a device that is not a GPU (a CPU
    tensor's lookup on a GPU host reads the CPU's files: torch would raise for it)."""
    if device is not None and torch.device(device).type not in ("cuda", "meta"):
        return "cpu"
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(None if device is None or torch.device(device).type == "meta" else device)
    return "cpu"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.\-]+", "_", text).strip("_")


def config_path(kernel_name: str, gpu: str, dtype, triton_version: str | None = None, directory=None) -> Path:
    """Path of the tuned-config file of (kernel, GPU, dtype, Triton version)."""
    version = triton_version or triton.__version__
    name = f"{_safe(kernel_name)}__{_safe(gpu)}__{dtype_name(dtype)}__triton-{_safe(version)}.json"
    folder = Path(directory) if directory is not None else config_dir()
    return folder / name


def read_config_file(path: str | Path) -> dict:
    """Entries of one file; ``{}`` when it is missing; warning and ``{}`` when unreadable."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"top level is {type(data).__name__}, not an object")
        return data
    except (OSError, ValueError) as exc:
        logger.warning("tuned-config file %s is unreadable (%s); using default configs", path, exc)
        return {}


def write_config_file(
    kernel_name: str,
    gpu: str,
    dtype,
    entries: dict[str, dict],
    triton_version: str | None = None,
    directory: str | Path | None = None,
) -> Path:
    """Merge ``entries`` (key -> {"config", "time_us", "default_time_us"}) into the file, atomically.

    Written to a temporary file in the same folder, then renamed over the old one, so a reader sees
    either the old or the new content, never half of it. New entries replace old ones of the same key.
    Writers of one folder take turns (an exclusive ``flock`` on the folder, where the OS has it), so two kernel
    searches that tune into the same file at once both keep their entries: the read-merge-rename of one never
    starts from a file the other is about to replace.
    """
    for key, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise ValueError(f"entry for key {key!r} must be a dict with a 'config' dict, got {entry!r}")
    path = config_path(kernel_name, gpu, dtype, triton_version, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_lock(path.parent):
        merged = read_config_file(path)
        merged.update(entries)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(merged, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    clear_cache()
    return path


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``folder`` for this process and thread (``flock`` on the folder itself, so no
    lock file is left behind); nothing where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: writers are not serialised there
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


def _parse_key(key: str) -> dict[str, int] | None:
    try:
        return {k: int(v) for k, v in (item.split("=", 1) for item in key.split(","))}
    except ValueError:
        return None


def nearest_key(keys, wanted: str, batch_dim: str) -> str | None:
    """The key with the same non-batch dims as ``wanted`` and the nearest batch in log space."""
    target = _parse_key(wanted)
    if target is None or batch_dim not in target:
        return None
    rest = {k: v for k, v in target.items() if k != batch_dim}
    best, best_dist = None, math.inf
    for key in keys:
        dims = _parse_key(key)
        if dims is None or batch_dim not in dims:
            continue
        if {k: v for k, v in dims.items() if k != batch_dim} != rest:
            continue
        dist = abs(math.log(max(dims[batch_dim], 1)) - math.log(max(target[batch_dim], 1)))
        if dist < best_dist - 1e-12 or (
            abs(dist - best_dist) <= 1e-12 and dims[batch_dim] < _parse_key(best)[batch_dim]
        ):
            best, best_dist = key, dist
    return best


def lookup(kernel_name: str, shape: dict, dtype, device: Any = None) -> dict:
    """Tuned config for the nearest key of this GPU's file, else the kernel's default config."""
    from .registry import get_kernel

    kernel = get_kernel(kernel_name)
    gpu = gpu_name(device)
    key = kernel.shape_key(shape)
    cache_key = (kernel_name, key, dtype_name(dtype), gpu, str(config_dir()), triton.__version__)
    cached = _CACHE.get(cache_key)
    if cached is not None:
        return dict(cached)
    config = kernel.fit_dtype(kernel.default_config(shape), shape, dtype)
    entries = read_config_file(config_path(kernel_name, gpu, dtype))
    found = nearest_key(entries, key, kernel.batch_dim)
    if found is not None:
        tuned = {**config, **entries[found].get("config", {})}
        if found != key:  # tuned at another batch: the kernel may adapt what scales with it
            tuned = kernel.adapt_config(tuned, {**shape, kernel.batch_dim: _parse_key(found)[kernel.batch_dim]}, shape)
        why = kernel.check_config(tuned, shape, device, dtype=dtype)
        if why is None:
            config = tuned
        else:
            logger.warning(
                "%s: tuned config %s (key %s) rejected for %s: %s; using default", kernel_name, tuned, found, key, why
            )
    _CACHE[cache_key] = dict(config)
    return config


_LAUNCH: dict[tuple, dict] = {}


def tuned_config(kernel, shape: dict, dtype, device: Any = None) -> dict:
    """The config a launcher uses when it is given none: :func:`lookup`'s answer, remembered per (kernel, shape,
    dtype, device), so a launch after the first pays one dict lookup. The one cache every kernel's launcher uses;
    :func:`clear_cache` empties it."""
    key = (kernel.name, tuple(sorted(shape.items())), str(dtype), str(device))
    hit = _LAUNCH.get(key)
    if hit is None:
        hit = _LAUNCH[key] = lookup(kernel.name, shape, dtype, device)
    return hit


def lookup_entry(kernel_name: str, shape: dict, dtype, device: Any = None) -> dict | None:
    """The whole entry of the nearest key of this GPU's file (config, times, ``impl``), or None."""
    from .registry import get_kernel

    kernel = get_kernel(kernel_name)
    entries = read_config_file(config_path(kernel_name, gpu_name(device), dtype))
    found = nearest_key(entries, kernel.shape_key(shape), kernel.batch_dim)
    return dict(entries[found]) if found is not None else None


def lookup_impl(kernel_name: str, shape: dict, dtype, device: Any = None) -> str | None:
    """The ``"impl"`` recorded with the nearest key of this GPU's file (``"torch"``, ``"triton"``), or None."""
    entry = lookup_entry(kernel_name, shape, dtype, device)
    impl = entry.get("impl") if entry is not None else None
    return impl if isinstance(impl, str) else None


def tuned_impl(kernel, shape: dict, dtype, device: Any = None) -> str | None:
    """:func:`lookup_impl`'s answer, remembered in the same cache as :func:`tuned_config`."""
    key = ("impl", kernel.name, tuple(sorted(shape.items())), str(dtype), str(device))
    if key not in _LAUNCH:
        _LAUNCH[key] = lookup_impl(kernel.name, shape, dtype, device)  # type: ignore[assignment]
    return _LAUNCH[key]  # type: ignore[return-value]


def tuned_entry(kernel, shape: dict, dtype, device: Any = None) -> dict | None:
    """:func:`lookup_entry`'s answer, remembered in the same cache as :func:`tuned_config`."""
    key = ("entry", kernel.name, tuple(sorted(shape.items())), str(dtype), str(device))
    if key not in _LAUNCH:
        _LAUNCH[key] = lookup_entry(kernel.name, shape, dtype, device)  # type: ignore[assignment]
    return _LAUNCH[key]  # type: ignore[return-value]


def clear_cache() -> None:
    """Forget every looked-up config (call after changing files or $TUNER_KERNEL_CONFIG_DIR)."""
    _CACHE.clear()
    _LAUNCH.clear()
