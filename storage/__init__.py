"""Persistence for what Optuna does not hold: runs, trial outcomes, measurements, events, artifacts.

Optuna's ``RDBStorage`` keeps the trials themselves on the same database URL; the tables here are prefixed
``tuner_`` so both live side by side. This package imports nothing from ``tuner``, ``api`` or ``kernels``.
"""

from typing import TYPE_CHECKING

from storage.types import OUTCOMES, MetricRow

# SQLAlchemy loads only when a table, the engine or the Repo is first used: a trial subprocess needs just the types.
_LAZY = {
    "StorageError": "storage.engine",
    "make_engine": "storage.engine",
    "Repo": "storage.repo",
    "Artifact": "storage.models",
    "Base": "storage.models",
    "Event": "storage.models",
    "Measurement": "storage.models",
    "FailedFlagSet": "storage.models",
    "Run": "storage.models",
    "TrialRecord": "storage.models",
    "StudyNameError": "storage.names",
    "check_study_name": "storage.names",
    "STUDY_NAME_PATTERN": "storage.names",
}

if TYPE_CHECKING:  # pragma: no cover
    from storage.engine import StorageError, make_engine
    from storage.models import Artifact, Base, Event, FailedFlagSet, Measurement, Run, TrialRecord
    from storage.names import STUDY_NAME_PATTERN, StudyNameError, check_study_name
    from storage.repo import Repo


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'storage' has no attribute {name!r}")


__all__ = [
    "OUTCOMES",
    "STUDY_NAME_PATTERN",
    "Artifact",
    "Base",
    "Event",
    "FailedFlagSet",
    "Measurement",
    "MetricRow",
    "Repo",
    "Run",
    "StorageError",
    "StudyNameError",
    "TrialRecord",
    "check_study_name",
    "make_engine",
]
