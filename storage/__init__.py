"""Persistence for what Optuna does not hold: runs, trial outcomes, measurements, events, artifacts.

Optuna's ``RDBStorage`` keeps the trials themselves on the same database URL; the tables here are prefixed
``tuner_`` so both live side by side. This package imports nothing from ``tuner``, ``api`` or ``kernels``.
"""

from storage.engine import StorageError, make_engine
from storage.models import OUTCOMES, Artifact, Base, Event, Measurement, Run, TrialRecord
from storage.repo import Repo

__all__ = [
    "OUTCOMES",
    "Artifact",
    "Base",
    "Event",
    "Measurement",
    "Repo",
    "Run",
    "StorageError",
    "TrialRecord",
    "make_engine",
]
