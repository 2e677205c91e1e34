"""Targets: what a trial runs. One registry, lazy imports (a target's heavy deps load only when it is used)."""

from __future__ import annotations

import importlib

from search_spaces import TARGET_NAMES
from tuner.errors import TargetError
from tuner.targets.base import Deployment, LaunchSpec, PreflightReport, Target

_CLASSES = {
    "workload": "tuner.targets.workload.target:WorkloadTarget",
    "sglang": "tuner.targets.server.sglang_server:SGLangTarget",
    "command": "tuner.targets.server.target:CommandTarget",
    "kernels": "tuner.targets.kernels:KernelsTarget",
}
"""Where each of ``search_spaces.TARGET_NAMES`` lives (the names themselves are the space loader's too)."""
_REGISTRY = {name: _CLASSES[name] for name in TARGET_NAMES}


def target_names() -> tuple[str, ...]:
    return TARGET_NAMES


def get_target_class(name: str) -> type[Target]:
    """A registered target by name, or a plug-in given as ``package.module:ClassName``."""
    if name not in _REGISTRY and ":" not in name:
        raise TargetError(f"unknown target {name!r}; use one of {sorted(_REGISTRY)} or module.path:ClassName")
    module, _, attr = _REGISTRY.get(name, name).partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise TargetError(f"target {name!r} is not available in this build ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, Target)):
        raise TargetError(f"target {name!r} is not a tuner Target subclass")
    return cls


__all__ = ["Deployment", "LaunchSpec", "PreflightReport", "Target", "TargetError", "get_target_class", "target_names"]
