"""A trial's process: the parent side (``isolation``: one subprocess per trial, killed at its deadline), the child
entry point (``child``: ``python -m tuner.execution.child``), the persistent worker that runs short kernel trials
one after another (``persistent``), and the helpers that compile kernel configs ahead of timing (``compile_ahead``).
"""

from tuner.execution.isolation import TrialJob, TrialProcess, run_trial
from tuner.execution.persistent import close_workers, persistent_worker

__all__ = ["TrialJob", "TrialProcess", "close_workers", "persistent_worker", "run_trial"]
