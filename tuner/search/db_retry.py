"""Database calls that survive a lost connection: a worker cut off from the database for a moment (server restart,
network cut, SQLite busy) retries with exponential backoff capped at 30 s, for up to ``max_outage_s``, so a
finished trial's result is written, not dropped. ``pool_pre_ping`` discards dead pooled connections."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
from sqlalchemy import exc as sa_exc

from storage import Repo
from storage.engine import normalize_url
from tuner.search.local_trials import LocalTrialsRDBStorage

_logger = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_OUTAGE_S = 900.0
"""How long a worker keeps retrying one database call before it gives up and raises."""


def is_sqlite(url: str) -> bool:
    return normalize_url(url).startswith("sqlite")


# -- reconnecting --------------------------------------------------------------------------------------------
def is_disconnect(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the connection failed, not that the request was wrong."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return True
        if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
            return True
        if type(e).__module__.startswith("psycopg") and type(e).__name__ in ("OperationalError", "InterfaceError"):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def retry_db(
    fn: Callable[[], T],
    *,
    what: str,
    max_outage_s: float = MAX_OUTAGE_S,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call ``fn`` until it stops failing for connection reasons: backoff 0.5 s doubling to 30 s, for at most
    ``max_outage_s``; any other error, or the last connection error, is raised."""
    delay, give_up = BACKOFF_FIRST_S, time.time() + max_outage_s
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_disconnect(exc) or time.time() + delay > give_up:
                raise
            _logger.warning(
                "database unreachable during %s (%s); retrying in %.1fs",
                what,
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__,
                delay,
            )
            if on_retry is not None:
                on_retry(exc)
            time.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)


_STORAGE_METHODS = (
    "create_new_study",
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_all_studies",
    "create_new_trial",
    "set_trial_param",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial_param",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial",
    "get_all_trials",
    "get_n_trials",
    "get_best_trial",
    "record_heartbeat",
    "_get_stale_trial_ids",
)


class ReconnectingRDBStorage(LocalTrialsRDBStorage):
    """``RDBStorage`` whose calls survive a lost connection (see :func:`retry_db`), answering the trials this
    process runs from memory (:mod:`tuner.search.local_trials`).

    A state change retried after a lost acknowledgement may find the trial already finished by the first
    attempt; that ``UpdateFinishedTrialError`` counts as success. ``max_outage_s`` bounds the retrying.
    """

    max_outage_s: float = MAX_OUTAGE_S


def _retrying(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(base)
    def call(self, *args, **kwargs):
        failed_once = []

        def attempt():
            try:
                return base(self, *args, **kwargs)
            except optuna.exceptions.UpdateFinishedTrialError:
                if name == "set_trial_state_values" and failed_once:
                    return True  # the first attempt was committed; its acknowledgement was lost
                raise

        return retry_db(attempt, what=f"optuna {name}", max_outage_s=self.max_outage_s, on_retry=failed_once.append)

    return call


for _name in _STORAGE_METHODS:
    if hasattr(LocalTrialsRDBStorage, _name):
        setattr(ReconnectingRDBStorage, _name, _retrying(_name, getattr(LocalTrialsRDBStorage, _name)))


class RetryingRepo:
    """A :class:`storage.Repo` whose every method is retried on a lost connection (same policy as above)."""

    def __init__(self, repo: Repo, *, max_outage_s: float = MAX_OUTAGE_S) -> None:
        self._repo = repo
        self._max_outage_s = max_outage_s

    @property
    def engine(self):
        return self._repo.engine

    def session(self):
        return self._repo.session()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._repo, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            return retry_db(lambda: attr(*args, **kwargs), what=f"tuner {name}", max_outage_s=self._max_outage_s)

        return call
