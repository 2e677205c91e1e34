"""The one root of tuner's errors, and every error class the tuner raises for input it cannot use.

Each message names the thing, shows the value and says the fix; the CLI catches :class:`TunerError` alone and
prints it as one ``error:`` line. The foundation packages (``search_spaces``, ``storage``) import nothing of the
tuner, so they keep their own roots (``SpaceError``, ``StorageError``); :func:`tuner_errors` turns those into
:class:`InputError` at the tuner's edge, so a caller still catches one class.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class TunerError(Exception):
    """The root: an input or a situation the tuner cannot use. The message says the fix."""


class InputError(TunerError, ValueError):
    """A foundation package refused an input (a space file, a storage URL); the message is its own."""


class SettingsError(TunerError, ValueError):
    """A setting the target or the search does not know, or a value of the wrong type."""


class BudgetError(TunerError, ValueError):
    """A budget string that cannot be used."""


class SearchError(TunerError):
    """The search cannot start (bad input, unreachable storage, study conflict)."""


class TargetError(TunerError):
    """A target cannot be set up at all (missing server, bad settings). Raised before the search starts."""


class FlagsUnavailable(TargetError):
    """The server's flags could not be read (not installed, import error, no --help)."""


class KnobError(TunerError, ValueError):
    """A knob value the built-in workload does not know."""


class ExportError(TunerError, ValueError):
    """A study that cannot be exported, or an exported script that cannot be read back."""


class WorkerError(TunerError):
    """A worker cannot join a study (unknown study, SQLite across machines, bad options)."""


class LeaseError(TunerError, ValueError):
    """A GPU request that can never be served (more GPUs than the pool has)."""


class LeaseCancelled(TunerError):
    """The wait for GPUs ended because the worker was told to stop or the wait's deadline passed."""


@contextmanager
def tuner_errors() -> Iterator[None]:
    """Inside: a ``SpaceError``, ``StorageError`` or ``StudyNameError`` is raised again as :class:`InputError`
    (same message)."""
    from search_spaces import SpaceError
    from storage import StorageError, StudyNameError

    try:
        yield
    except (SpaceError, StorageError, StudyNameError) as exc:
        raise InputError(str(exc)) from exc


__all__ = [
    "BudgetError",
    "ExportError",
    "FlagsUnavailable",
    "InputError",
    "KnobError",
    "LeaseCancelled",
    "LeaseError",
    "SearchError",
    "SettingsError",
    "TargetError",
    "TunerError",
    "WorkerError",
    "tuner_errors",
]
