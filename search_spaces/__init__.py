"""Declarative search spaces: YAML files, loaded and validated into typed objects, resolved for the hardware.

This package imports nothing from ``tuner``, ``api``, ``storage`` or ``kernels``.
"""

from search_spaces.buckets import DENSITIES, expand_buckets
from search_spaces.hardware import Hardware, detect_hardware
from search_spaces.loader import builtin_space_path, load_space, load_space_text
from search_spaces.resolve import Inactive, ResolvedSpace, resolve
from search_spaces.schema import Condition, Constraint, Objective, Param, ServerCounterpart, Space, SpaceError
from search_spaces.targets import TARGET_NAMES

__all__ = [
    "DENSITIES",
    "Condition",
    "Constraint",
    "Hardware",
    "Inactive",
    "Objective",
    "Param",
    "ResolvedSpace",
    "ServerCounterpart",
    "Space",
    "SpaceError",
    "TARGET_NAMES",
    "builtin_space_path",
    "detect_hardware",
    "expand_buckets",
    "load_space",
    "load_space_text",
    "resolve",
]
