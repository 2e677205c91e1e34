"""Heartbeats and lost workers: a worker beats for its running trial; one that stops beating (kill -9, machine
loss) has its trial failed after the grace period by the next worker that calls :func:`fail_stale_trials`, marked
``crash`` in the ``tuner_`` tables and retried once (``RetryFailedTrialCallback`` with ``max_retry=1``).
:class:`Heartbeat` survives a database outage: Optuna's own heartbeat thread dies on the first failed write."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
from sqlalchemy import select

from storage import Repo
from storage.engine import normalize_url, tune_sqlite_engine
from storage.models import Event, TrialRecord, utcnow
from tuner.search.db_retry import MAX_OUTAGE_S, ReconnectingRDBStorage, RetryingRepo, is_sqlite, retry_db

_logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 20
MAX_RETRY = 1


# -- crash recovery ------------------------------------------------------------------------------------------
def mark_trial_crashed(
    repo: Repo | RetryingRepo, run_id: int, number: int, *, reason: str, params: dict | None = None
) -> bool:
    """Record trial ``number`` as a ``crash`` if it is still ``running`` (or missing) in the ``tuner_`` tables.

    Returns True when it changed something. A per-trial variant of ``Repo.mark_stale_running``.
    """

    def write() -> bool:
        with repo.session() as s, s.begin():
            rec = s.scalar(select(TrialRecord).where(TrialRecord.run_id == run_id, TrialRecord.number == number))
            if rec is None:
                rec = TrialRecord(run_id=run_id, number=number, params=dict(params or {}), worker="")
                s.add(rec)
            elif rec.state != "running":
                return False
            rec.state, rec.outcome, rec.reason, rec.finished_at = "failed", "crash", reason[:4000], utcnow()
            s.add(
                Event(
                    run_id=run_id,
                    kind="trial_failed",
                    trial_number=number,
                    payload={"outcome": "crash", "reason": reason[:300]},
                )
            )
            return True

    return retry_db(write, what="mark a lost trial crashed")


class StaleTrialHandler:
    """Optuna's heartbeat-stale callback: mark the lost trial ``crash`` in ``tuner_`` tables, then retry it once.

    ``run_id`` is set once the run is known (the storage is opened before the study is loaded).
    """

    def __init__(
        self,
        repo: Repo | RetryingRepo | None = None,
        run_id: int | None = None,
        *,
        grace_period_s: int = GRACE_PERIOD_S,
        max_retry: int = MAX_RETRY,
    ) -> None:
        self.repo, self.run_id, self.grace_period_s = repo, run_id, grace_period_s
        retry_cls = (
            getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            or optuna.storages.RetryFailedTrialCallback
        )  # renamed in Optuna 4.9
        with _quiet_experimental():
            self.retry = retry_cls(max_retry=max_retry)
        self.max_retry = max_retry
        self.handled: list[int] = []

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        history = list(trial.system_attrs.get("retry_history", [])) + [trial.number]
        retried = len(history) <= self.max_retry
        worker = trial.user_attrs.get("tuner_worker", "its worker")
        reason = (
            f"lost: {worker} sent no heartbeat for {self.grace_period_s}s (killed, or cut off from the "
            "database); "
            + (
                "its configuration is retried once as a new trial"
                if retried
                else f"not retried again (already a retry of trial {history[0]})"
            )
        )
        _logger.warning("trial %d %s", trial.number, reason)
        if self.repo is not None and self.run_id is not None:
            mark_trial_crashed(self.repo, self.run_id, trial.number, reason=reason, params=trial.params)
        self.retry(study, trial)
        self.handled.append(trial.number)


def open_worker_storage(
    url: str,
    *,
    pool_size: int = 5,
    heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
    grace_period: int = GRACE_PERIOD_S,
    on_stale: StaleTrialHandler | None = None,
    max_outage_s: float = MAX_OUTAGE_S,
) -> ReconnectingRDBStorage:
    """The Optuna storage a worker uses: heartbeats on, stale trials failed and retried once, reconnecting,
    a pool of at least ``pool_size`` connections with ``pool_pre_ping``. Never creates a study."""
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if not is_sqlite(url):
        engine_kwargs.update(pool_size=pool_size, max_overflow=pool_size)
    stale = on_stale or StaleTrialHandler(grace_period_s=grace_period)
    with _quiet_experimental():
        storage = ReconnectingRDBStorage(
            normalize_url(url),
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            heartbeat_stale_trial_callback=stale,
        )
    storage.max_outage_s = max_outage_s
    tune_sqlite_engine(storage.engine)
    return storage


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail the study's trials whose worker stopped beating (runs the stale callback on each)."""
    with _quiet_experimental():
        optuna.storages.fail_stale_trials(study)


class Heartbeat:
    """Beat for one trial every ``interval_s`` until the ``with`` ends; a failed beat is logged, not fatal."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval_s: float) -> None:
        self.storage, self.trial_id, self.interval_s = storage, trial_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_id}", daemon=True)

    def _beat(self) -> None:
        while True:
            try:  # the plain RDBStorage method: one attempt, the next beat is the retry
                optuna.storages.RDBStorage.record_heartbeat(self.storage, self.trial_id)
            except Exception as exc:  # noqa: BLE001 - keep beating; the grace period covers short outages
                _logger.warning(
                    "heartbeat for trial id %d failed: %s",
                    self.trial_id,
                    str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__,
                )
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
