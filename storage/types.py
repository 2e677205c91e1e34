"""Plain types shared with the trial processes, importable without SQLAlchemy (a trial subprocess imports only
this, which keeps its start-up short)."""

from __future__ import annotations

from dataclasses import dataclass

OUTCOMES = (
    "ok",
    "invalid_config",
    "compile_error",
    "out_of_resources",
    "oom",
    "timeout",
    "crash",
    "wrong_result",
    "pruned",
    "request_error",
)
"""Every outcome class a trial can end with. ``ok`` is the only one that carries an objective value."""


@dataclass(frozen=True)
class MetricRow:
    metric: str
    level: str
    value: float
    unit: str = ""
