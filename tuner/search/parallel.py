"""Many workers on one study: local threads (``tuner search --workers N``) and processes on any machine
(``tuner worker``), all through Optuna's own distributed mode: every worker opens the same storage.

What this module adds on top of Optuna, and why:

- **Heartbeats that survive a database outage.** Optuna's ``HeartbeatThread`` dies on the first failed write,
  so a worker cut off from the database for a moment would later be taken for dead. :class:`Heartbeat` logs
  and keeps beating. A worker that really dies (kill -9, machine loss) stops beating; the next worker that
  calls ``fail_stale_trials`` fails its trial after the grace period, marks it ``crash`` in the ``tuner_``
  tables (:func:`mark_trial_crashed`) and enqueues the configuration once more (``RetryFailedTrialCallback``
  with ``max_retry=1``: a retry that is lost again is not retried).
- **Reconnecting with backoff.** :class:`ReconnectingRDBStorage` and :class:`RetryingRepo` retry a call that
  failed because the connection failed (server restart, network cut, SQLite busy) with exponential backoff
  capped at 30 s, for up to ``max_outage_s``; a finished trial's result is therefore written, not dropped.
  ``pool_pre_ping`` discards dead pooled connections.
- **A study-wide trial cap** (``max_trials``): workers ask only while the study holds fewer than that many
  trials that finished or are running (waiting retries are always taken). The check and the ask happen under
  one lock (a PostgreSQL advisory lock across processes, a thread lock inside one), so N workers stop at
  exactly the cap.
- **GPU leases per trial** (``tuner.search.leases``): the trial's params say how many GPUs it needs; it runs with
  ``CUDA_VISIBLE_DEVICES`` set to the ids it holds and gives them back however it ends.

SQLite: several *threads* of one process may share it (writes are serialized by SQLite's lock with a 30 s busy
timeout; a warning says so); several *processes* may not: ``tuner worker`` refuses it and names PostgreSQL.
The deadline is the run's (``started_at + budget_s``): a trial still running at its end is killed and recorded
as timed out, and every worker exits. Only the process that started the search exports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, text

from storage import Repo
from storage.engine import normalize_url
from storage.models import Event, TrialRecord, utcnow
from tuner.errors import LeaseCancelled, LeaseError, WorkerError
from tuner.measurement import Outcome
from tuner.search import refine
from tuner.search.context import load_history
from tuner.search.failfast import FailFast
from tuner.search.leases import GpuLeaser
from tuner.search.sampling import suggest
from tuner.search.trial import penalty_value, run_one, told

_logger = logging.getLogger(__name__)
# ask/tell with heartbeats is what this module is for; Optuna warns that it expects Study.optimize
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

T = TypeVar("T")

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 20
MAX_RETRY = 1
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_OUTAGE_S = 900.0
"""How long a worker keeps retrying one database call before it gives up and raises."""
RUN_POLL_S = 2.0



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


def retry_db(fn: Callable[[], T], *, what: str, max_outage_s: float = MAX_OUTAGE_S,
             on_retry: Callable[[BaseException], None] | None = None) -> T:
    """Call ``fn`` until it stops failing for connection reasons: backoff 0.5 s doubling to 30 s, for at most
    ``max_outage_s``; any other error, or the last connection error, is raised."""
    delay, give_up = BACKOFF_FIRST_S, time.time() + max_outage_s
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_disconnect(exc) or time.time() + delay > give_up:
                raise
            _logger.warning("database unreachable during %s (%s); retrying in %.1fs", what,
                            str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__, delay)
            if on_retry is not None:
                on_retry(exc)
            time.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)


_STORAGE_METHODS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_all_studies", "create_new_trial", "set_trial_param", "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id", "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value",
    "set_trial_user_attr", "set_trial_system_attr", "get_trial", "get_all_trials", "get_n_trials",
    "get_best_trial", "record_heartbeat", "_get_stale_trial_ids",
)


class ReconnectingRDBStorage(optuna.storages.RDBStorage):
    """``RDBStorage`` whose calls survive a lost connection (see :func:`retry_db`).

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

        return retry_db(attempt, what=f"optuna {name}", max_outage_s=self.max_outage_s,
                        on_retry=failed_once.append)

    return call


for _name in _STORAGE_METHODS:
    if hasattr(optuna.storages.RDBStorage, _name):
        setattr(ReconnectingRDBStorage, _name, _retrying(_name, getattr(optuna.storages.RDBStorage, _name)))


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


# -- crash recovery ------------------------------------------------------------------------------------------
def mark_trial_crashed(repo: Repo | RetryingRepo, run_id: int, number: int, *, reason: str,
                       params: dict | None = None) -> bool:
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
            s.add(Event(run_id=run_id, kind="trial_failed", trial_number=number,
                        payload={"outcome": "crash", "reason": reason[:300]}))
            return True

    return retry_db(write, what="mark a lost trial crashed")


class StaleTrialHandler:
    """Optuna's heartbeat-stale callback: mark the lost trial ``crash`` in ``tuner_`` tables, then retry it once.

    ``run_id`` is set once the run is known (the storage is opened before the study is loaded).
    """

    def __init__(self, repo: Repo | RetryingRepo | None = None, run_id: int | None = None, *,
                 grace_period_s: int = GRACE_PERIOD_S, max_retry: int = MAX_RETRY) -> None:
        self.repo, self.run_id, self.grace_period_s = repo, run_id, grace_period_s
        retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback  # renamed in Optuna 4.9
        with _quiet_experimental():
            self.retry = retry_cls(max_retry=max_retry)
        self.max_retry = max_retry
        self.handled: list[int] = []

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        history = list(trial.system_attrs.get("retry_history", [])) + [trial.number]
        retried = len(history) <= self.max_retry
        worker = trial.user_attrs.get("tuner_worker", "its worker")
        reason = (f"lost: {worker} sent no heartbeat for {self.grace_period_s}s (killed, or cut off from the "
                  "database); " + ("its configuration is retried once as a new trial" if retried else
                                   f"not retried again (already a retry of trial {history[0]})"))
        _logger.warning("trial %d %s", trial.number, reason)
        if self.repo is not None and self.run_id is not None:
            mark_trial_crashed(self.repo, self.run_id, trial.number, reason=reason, params=trial.params)
        self.retry(study, trial)
        self.handled.append(trial.number)


def open_worker_storage(url: str, *, pool_size: int = 5, heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
                        grace_period: int = GRACE_PERIOD_S, on_stale: StaleTrialHandler | None = None,
                        max_outage_s: float = MAX_OUTAGE_S) -> ReconnectingRDBStorage:
    """The Optuna storage a worker uses: heartbeats on, stale trials failed and retried once, reconnecting,
    a pool of at least ``pool_size`` connections with ``pool_pre_ping``. Never creates a study."""
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if not is_sqlite(url):
        engine_kwargs.update(pool_size=pool_size, max_overflow=pool_size)
    stale = on_stale or StaleTrialHandler(grace_period_s=grace_period)
    with _quiet_experimental():
        storage = ReconnectingRDBStorage(normalize_url(url), engine_kwargs=engine_kwargs,
                                         heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                         heartbeat_stale_trial_callback=stale)
    storage.max_outage_s = max_outage_s
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
                _logger.warning("heartbeat for trial id %d failed: %s", self.trial_id,
                                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the study-wide cap --------------------------------------------------------------------------------------
class AskLock:
    """Serializes "check the cap, then ask" across the workers of one study: a thread lock inside a process,
    plus a PostgreSQL advisory lock keyed by the study name across processes (none on SQLite)."""

    _thread_locks: dict[str, threading.Lock] = {}
    _guard = threading.Lock()

    def __init__(self, repo: Repo | RetryingRepo, study_name: str) -> None:
        self.engine = repo.engine
        self.key = int.from_bytes(hashlib.sha1(f"tuner:{study_name}".encode()).digest()[:8], "big") >> 1
        with AskLock._guard:
            self.local = AskLock._thread_locks.setdefault(study_name, threading.Lock())
        self.pg = self.engine.dialect.name == "postgresql"

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self.local:
            if not self.pg:
                yield
                return
            conn = self.engine.connect()
            try:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
                try:
                    yield
                finally:
                    try:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                        conn.commit()
                    except Exception:  # noqa: BLE001 - a lost connection has dropped the lock already
                        conn.invalidate()
            finally:
                conn.close()


def cap_decision(study: optuna.Study, max_trials: int | None) -> str:
    """``ask`` (a retry is waiting, or the study is under the cap), ``wait`` (at the cap but a running trial
    may still be lost and retried), or ``done``."""
    if max_trials is None:
        return "ask"
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    if TrialState.WAITING in states:
        return "ask"
    running = states.count(TrialState.RUNNING)
    done = states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED)
    if done + running < max_trials:
        return "ask"
    return "wait" if running else "done"


# -- one worker's loop ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class WorkerReport:
    name: str
    trials: int = 0
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    stop_reason: str = ""


def worker_loop(ctx, progress, *, name: str, leaser: GpuLeaser | None = None, max_trials: int | None = None,
                storage: optuna.storages.RDBStorage | None = None, heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
                ask_lock: AskLock | None = None) -> WorkerReport:
    """Ask, lease GPUs, run (``tuner.search.run_one``), tell, until the deadline, ``ctx.stop`` or the cap.

    ``ctx`` is this worker's own :class:`tuner.search.SearchContext` (its ``study`` opened on ``storage``);
    ``storage`` enables heartbeats and the stale-trial check; ``leaser`` ``None`` leaves
    ``CUDA_VISIBLE_DEVICES`` alone.
    """
    report = WorkerReport(name)
    lock = ask_lock or AskLock(ctx.repo, ctx.run.study_name)
    last_stale = 0.0
    repeated = False
    fail_fast = FailFast(ctx.target.config.fail_fast_after)
    while True:
        if ctx.stop.is_set():
            report.stop_reason = ctx.stop_reason or "stopped"
            break
        if ctx.deadline.remaining_for_trials() <= 1.0:
            report.stop_reason = "budget used"
            break
        if storage is not None and time.time() - last_stale >= heartbeat_interval:
            last_stale = time.time()

            def fail_stale():
                # under the ask lock: failing a lost trial and enqueueing its retry is one step for the cap, else
                # another worker sees one running trial fewer, asks a new trial, and the study ends one over the cap
                with lock.held():
                    fail_stale_trials(ctx.study)

            try:
                retry_db(fail_stale, what="fail stale trials")
            except Exception:  # noqa: BLE001 - another worker will do it
                _logger.exception("checking for lost trials failed")

        def ask_step():
            with lock.held():
                d = cap_decision(ctx.study, max_trials)
                if d == "ask" and (repeated or refine.in_window(ctx, 0.0)):
                    refine.enqueue_next(ctx, progress)  # the last share, or TPE re-proposed a timed configuration
                return d, (ctx.study.ask() if d == "ask" else None)

        decision, trial = retry_db(ask_step, what="ask")
        if decision == "done":
            report.stop_reason = f"{max_trials} trials in the study"
            break
        if decision == "wait":
            ctx.stop.wait(min(0.5, heartbeat_interval / 2))
            continue
        summary = _run_trial(ctx, trial, progress, run_one, name=name, leaser=leaser, storage=storage,
                             heartbeat_interval=heartbeat_interval)
        repeated = summary is not None and summary.repeat_of is not None
        if summary is not None:
            report.trials += 1
            report.outcomes[summary.outcome] = report.outcomes.get(summary.outcome, 0) + 1
            give_up = fail_fast.observe(summary)
            if give_up:
                report.stop_reason = ctx.stop_reason = give_up
                ctx.failed.set()
                ctx.stop.set()
                break
    _logger.info("worker %s stops after %d trials: %s", name, report.trials, report.stop_reason)
    return report


def _run_trial(ctx, trial: optuna.Trial, progress, run_one, *, name: str, leaser: GpuLeaser | None,
               storage, heartbeat_interval: float):
    beat = Heartbeat(storage, trial._trial_id, heartbeat_interval) if storage is not None else contextlib.nullcontext()
    with beat:
        retry_db(lambda: trial.set_user_attr("tuner_worker", name), what="tag the trial")
        params = retry_db(lambda: suggest(trial, ctx.resolved), what="sample")  # run_one gets the same values
        frozen = retry_db(lambda: ctx.study._storage.get_trial(trial._trial_id), what="read the trial")
        if frozen.system_attrs.get("failed_trial") is not None:  # a retry of a lost trial: run it, do not dedupe
            earlier = ctx.seen.get(ctx.key_of(params))
            if earlier is not None and earlier.outcome == "crash":
                ctx.seen.pop(ctx.key_of(params), None)
        # under a GPU leaser a trial holds at least one GPU: it never sees all of them, nor none
        need = max(1, ctx.target.gpus_for(params)) if leaser is not None and leaser.size else 0
        try:
            if leaser is None:
                return run_one(ctx, trial, progress, worker=name)
            with leaser.lease(need, stop=ctx.stop, deadline=ctx.deadline.trials_end) as ids:
                return run_one(ctx, trial, progress, gpus=ids, worker=name)
        except LeaseError as exc:
            _refuse(ctx, trial, params, Outcome.INVALID_CONFIG, str(exc), name, teach=True)
        except LeaseCancelled as exc:
            _refuse(ctx, trial, params, Outcome.TIMEOUT, f"{exc}; not run", name, teach=False)
    return None


def _refuse(ctx, trial: optuna.Trial, params: dict, outcome: Outcome, reason: str, worker: str, *,
            teach: bool) -> None:
    """Record a trial that never ran: in the ``tuner_`` tables and in Optuna (bad if ``teach``, else FAIL)."""
    ctx.repo.start_trial(ctx.run.id, trial.number, params, worker=worker)
    ctx.repo.finish_trial(ctx.run.id, trial.number, outcome=outcome.value, value=None, reason=reason)
    if teach:
        retry_db(lambda: trial.set_user_attr("constraints", [1.0]), what="tell")
        retry_db(lambda: ctx.study.tell(trial, told(ctx, penalty_value(ctx.direction))), what="tell")
    else:
        retry_db(lambda: ctx.study.tell(trial, state=TrialState.FAIL), what="tell")
    _logger.warning("trial %d %s: %s", trial.number, outcome.value, reason)


# -- local workers: threads in the search process ------------------------------------------------------------
class _LockedProgress:
    """Serializes a Progress shared by worker threads."""

    def __init__(self, inner) -> None:
        self._inner, self._lock = inner, threading.Lock()

    def __getattr__(self, name: str):
        fn = getattr(self._inner, name)

        def call(*args, **kwargs):
            with self._lock:
                return fn(*args, **kwargs)

        return call


def worker_name(index: int | None = None) -> str:
    base = f"{socket.gethostname()}:{os.getpid()}"
    return base if index is None else f"{base}:w{index}"


def load_worker_study(storage: optuna.storages.RDBStorage, name: str, sampler=None, pruner=None) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        raise WorkerError(f"no Optuna study {name!r} in this storage; start it with `tuner search --study {name}` "
                          "first") from None


def run_parallel(ctx, progress=None) -> list[WorkerReport]:
    """Run the search's trials on ``ctx.options.workers`` threads, GPUs leased per trial from ``ctx.options.gpus``
    (or every visible GPU). Called by ``tuner.search.run_search``; returns when every worker has stopped."""
    opts = ctx.options
    gpus = list(opts.gpus) if opts.gpus else list(range(ctx.hardware.gpu_count or 0))
    n = max(1, opts.workers)
    if opts.gpus and opts.workers <= 1:
        n = max(1, len(gpus))  # --gpus alone: one worker per GPU (a multi-GPU trial just leaves others waiting)
    if is_sqlite(opts.storage_url) and n > 1:
        msg = (f"{n} worker threads share SQLite storage in this process; writes are serialized. Use PostgreSQL "
               "(--storage postgresql://...) to add `tuner worker` processes or machines")
        _logger.warning(msg)
        if progress:
            progress.message(msg)
    stale = StaleTrialHandler()
    storage = open_worker_storage(opts.storage_url, pool_size=2 * n + 2, on_stale=stale)
    repo = RetryingRepo(Repo(opts.storage_url, pool_size=n + 2))
    stale.repo, stale.run_id = repo, ctx.run.id
    study = load_worker_study(storage, ctx.run.study_name, ctx.study.sampler, ctx.study.pruner)
    leaser = GpuLeaser(gpus) if gpus else None
    lock = AskLock(repo, ctx.run.study_name)
    cap = None
    if opts.n_trials is not None:
        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        cap = done + opts.n_trials
    shared_progress = _LockedProgress(progress) if progress is not None else None
    contexts = [dataclasses.replace(ctx, study=study, repo=repo, current=None) for _ in range(n)]
    reports: list[WorkerReport | None] = [None] * n

    def work(i: int) -> None:
        try:
            reports[i] = worker_loop(contexts[i], shared_progress, name=worker_name(i), leaser=leaser,
                                     max_trials=cap, storage=storage, ask_lock=lock)
        except Exception as exc:  # noqa: BLE001 - one worker failing must not end the others
            _logger.exception("worker %d failed", i)
            reports[i] = WorkerReport(worker_name(i), stop_reason=f"failed: {exc}")

    threads = [threading.Thread(target=work, args=(i,), name=f"tuner-worker-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    killed = False
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.2)
        if ctx.stop.is_set() and not killed:  # Ctrl-C / SIGTERM: the handler only sees ctx.current
            killed = True
            for c in contexts:
                if c.current is not None:
                    c.current.kill(Outcome.TIMEOUT)
    done_reports = [r for r in reports if r is not None]
    if not ctx.stop.is_set():
        ctx.stop_reason = next((r.stop_reason for r in done_reports if r.stop_reason), "budget used")
    elif ctx.failed.is_set():  # the worker that gave up says why (each worker holds its own copy of the reason)
        ctx.stop_reason = next((c.stop_reason for c in contexts if c.stop_reason), ctx.stop_reason)
    # trials other workers (other processes, other machines) ran count for the export too
    ctx.trials.clear()
    ctx.counts.clear()
    ctx.seen.clear()
    load_history(ctx)
    return done_reports


__all__ = ["AskLock", "Heartbeat", "ReconnectingRDBStorage", "RetryingRepo", "StaleTrialHandler", "WorkerError",
           "WorkerReport", "cap_decision", "fail_stale_trials", "is_disconnect", "is_sqlite", "load_worker_study",
           "mark_trial_crashed", "open_worker_storage", "retry_db", "run_parallel", "worker_loop", "worker_name"]
