"""The built-in target names. A space's ``target`` is one of them or a plug-in ``module.path:ClassName``; the
space loader checks it against this list and tuner's target registry maps each name to its class, so both read
the names from here (a foundation package tuner may import)."""

from __future__ import annotations

TARGET_NAMES: tuple[str, ...] = ("workload", "sglang", "kernels", "command")
"""The targets a space may name without a module path."""
