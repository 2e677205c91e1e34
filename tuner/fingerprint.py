"""The environment a run was measured on: GPUs, driver, CUDA, torch, triton, server version, project commit."""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

_logger = logging.getLogger(__name__)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_sha(package_dir: Path | None = None) -> str | None:
    """The commit of the checkout the ``tuner`` package runs from, ``-dirty`` when it has changes; None when the
    package is not a checkout's own (``package_dir``'s parent must be the top level of the git repository that
    holds it: an install copied into another repository records none, not that repository's commit)."""
    root = (package_dir or Path(__file__).resolve().parent).parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None
    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return sha + ("-dirty" if dirty else "")


def fingerprint() -> dict:
    """A JSON-able description of this machine's serving stack. Never raises."""
    info: dict = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "optuna": _version("optuna"),
        "sglang": _version("sglang"),
        # a tree copied to a GPU host may carry a stale .git: whoever starts a recorded run there names the commit
        "git_sha": os.environ.get("TUNER_COMMIT") or git_sha(),
        "git_sha_from": "TUNER_COMMIT" if os.environ.get("TUNER_COMMIT") else "git",
        "gpus": [],
        "gpu_count": 0,
    }
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            info["gpu_count"] = n
            for i in range(n):
                props = torch.cuda.get_device_properties(i)
                info["gpus"].append(
                    {
                        "name": props.name,
                        "compute_capability": f"{props.major}.{props.minor}",
                        "memory_gib": round(props.total_memory / 2**30, 1),
                    }
                )
    except Exception as exc:  # noqa: BLE001 - a fingerprint never fails a run
        _logger.warning("could not read the GPU description: %s", exc)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0:
            info["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        pass
    return info
