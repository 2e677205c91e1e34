"""Many workers on one study: local threads (``tuner search --workers N``) and processes on any machine
(``tuner worker``), all through Optuna's own distributed mode: every worker opens the same storage.

What this module adds on top of Optuna, and why:

- **Heartbeats and lost workers** (``tuner.search.heartbeat``) and **database calls that survive a lost
  connection** (``tuner.search.db_retry``): a worker's trial beats while it runs, a lost one is failed, marked
  ``crash`` and retried once; a finished trial's result is written even across a database restart.
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
import hashlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import optuna
from optuna.trial import TrialState
from sqlalchemy import text

from storage import Repo
from tuner.errors import LeaseCancelled, LeaseError, WorkerError
from tuner.measurement import Outcome
from tuner.search import refine, stages
from tuner.search.context import MAX_REPEATS_IN_A_ROW, load_history
from tuner.search.db_retry import (
    ReconnectingRDBStorage,
    RetryingRepo,
    is_disconnect,
    is_sqlite,
    retry_db,
)
from tuner.search.failfast import FailFast
from tuner.search.heartbeat import (
    HEARTBEAT_INTERVAL_S,
    Heartbeat,
    StaleTrialHandler,
    fail_stale_trials,
    mark_trial_crashed,
    open_worker_storage,
)
from tuner.search.leases import GpuLeaser
from tuner.search.local_trials import cached
from tuner.search.trial import penalty_value, propose, run_one, told

_logger = logging.getLogger(__name__)
# ask/tell with heartbeats is what this module is for; Optuna warns that it expects Study.optimize
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

RUN_POLL_S = 2.0


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
    storage = study._storage
    if hasattr(storage, "state_counts"):  # the search's indexed cache: counted as trials come, not per ask
        count = storage.state_counts(study._study_id)
    else:
        count = dict.fromkeys(TrialState, 0)
        for t in study.get_trials(deepcopy=False):
            count[t.state] += 1
    if count[TrialState.WAITING]:
        return "ask"
    running = count[TrialState.RUNNING]
    done = count[TrialState.COMPLETE] + count[TrialState.PRUNED]
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


def worker_loop(
    ctx,
    progress,
    *,
    name: str,
    leaser: GpuLeaser | None = None,
    max_trials: int | None = None,
    storage: optuna.storages.RDBStorage | None = None,
    heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
    ask_lock: AskLock | None = None,
    ahead: bool = False,
) -> WorkerReport:
    """Ask, lease GPUs, run (``tuner.search.run_one``), tell, until the deadline, ``ctx.stop`` or the cap.

    ``ctx`` is this worker's own :class:`tuner.search.SearchContext` (its ``study`` opened on ``storage``);
    ``storage`` enables heartbeats and the stale-trial check; ``leaser`` ``None`` leaves
    ``CUDA_VISIBLE_DEVICES`` alone. ``ahead``: while a trial runs, the next one is asked for and sampled on a thread
    of this worker's (:func:`_ask_and_begin`), so the sampler's time overlaps the trial instead of idling the worker
    between trials; a trial asked ahead that the worker does not run (the search ended first) is told FAIL.
    """
    report = WorkerReport(name)
    lock = ask_lock or AskLock(ctx.repo, ctx.run.study_name)
    last_stale = 0.0
    repeated = False
    fail_fast = FailFast(ctx.target.config.fail_fast_after)
    pool = ThreadPoolExecutor(1, thread_name_prefix=f"ask-ahead-{name}") if ahead else None
    pending: Future | None = None

    def ask_step():
        with lock.held():
            d = cap_decision(ctx.study, max_trials)
            if d == "ask" and (
                repeated or refine.in_window(ctx, 0.0) or stages.opening(ctx, refine.open_moves)
            ):  # the last share, TPE re-proposed a timed configuration, or a new stage's opening
                refine.enqueue_next(ctx, progress)
            return d, (ctx.study.ask() if d == "ask" else None)

    def begin() -> _Asked:
        return _ask_and_begin(ctx, ask_step, name=name, storage=storage, heartbeat_interval=heartbeat_interval)

    try:
        while True:
            if ctx.stop.is_set():
                report.stop_reason = ctx.stop_reason or "stopped"
                break
            if ctx.stages is not None and ctx.stages.done:  # another worker saw the last stage converge
                report.stop_reason = ctx.stages.converged_line
                break
            if ctx.deadline.remaining_for_trials() <= max(1.0, ctx.target.min_trial_s()):
                report.stop_reason = "budget used"  # or too little of it left for one more trial to give a figure
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

            asked = pending.result() if pending is not None else begin()
            pending = None
            if asked.decision == "done":
                report.stop_reason = f"{max_trials} trials in the study"
                break
            if asked.decision == "wait":
                ctx.stop.wait(min(0.5, heartbeat_interval / 2))
                continue
            if pool is not None and ctx.deadline.remaining_for_trials() > 2 * max(1.0, ctx.target.min_trial_s()):
                pending = pool.submit(begin)  # the next trial, sampled while this one runs
            summary = _run_trial(ctx, asked, progress, run_one, name=name, leaser=leaser)
            repeated = summary is not None and summary.reproposed  # a repeat recorded, or proposals turned away
            if summary is not None:
                report.trials += 1
                report.outcomes[summary.outcome] = report.outcomes.get(summary.outcome, 0) + 1
                give_up = fail_fast.observe(summary)
                if give_up:
                    report.stop_reason = ctx.stop_reason = give_up
                    ctx.failed.set()
                    ctx.stop.set()
                    break
                if stages.after_trial(ctx, progress):
                    report.stop_reason = ctx.stages.converged_line
                    break
                spent, index = stages.repeats_in_a_row(ctx)
                if spent >= MAX_REPEATS_IN_A_ROW and not stages.on_exhausted(ctx, spent, progress, index):
                    report.stop_reason = f"search space exhausted: {spent} repeated configurations in a row"
                    break
    finally:
        if pending is not None:
            _abandon(ctx, pending)
        if pool is not None:
            pool.shutdown(wait=True)
    _logger.info("worker %s stops after %d trials: %s", name, report.trials, report.stop_reason)
    return report


@dataclasses.dataclass
class _Asked:
    """A trial asked for, tagged and sampled, its heartbeat beating; or why there is none (``wait``, ``done``)."""

    decision: str
    trial: optuna.Trial | None = None
    beat: Heartbeat | None = None
    params: dict | None = None


def _ask_and_begin(ctx, ask_step, *, name: str, storage, heartbeat_interval: float) -> _Asked:
    """Ask (``ask_step``: the cap, refining, ``study.ask``), then beat for the trial, tag it and settle its
    configuration (``tuner.search.trial.propose``: where TPE samples)."""
    decision, trial = retry_db(ask_step, what="ask")
    if decision != "ask":
        return _Asked(decision)
    beat = Heartbeat(storage, trial._trial_id, heartbeat_interval) if storage is not None else None
    if beat is not None:
        beat.__enter__()
    try:
        retry_db(lambda: trial.set_user_attr("tuner_worker", name), what="tag the trial")
        params = retry_db(lambda: propose(ctx, trial), what="sample")  # settled here: run_one gets the same values
    except BaseException:
        if beat is not None:
            beat.__exit__(None, None, None)
        raise
    return _Asked("ask", trial, beat, params)


def _abandon(ctx, pending: Future) -> None:
    """A trial asked ahead that its worker will not run: its heartbeat stopped, told FAIL (the tuner's tables hold
    no record of it: it never started)."""
    try:
        asked = pending.result()
    except Exception:  # noqa: BLE001 - the ask failed (retry_db gave up): it created nothing to fail, or the stale check will
        _logger.exception("asking the next trial ahead failed")
        return
    if asked.trial is None:
        return
    if asked.beat is not None:
        asked.beat.__exit__(None, None, None)
    trial = asked.trial
    try:
        retry_db(lambda: ctx.study.tell(trial, state=TrialState.FAIL), what="tell")
        _logger.info("trial %d was asked ahead and not run: its worker stopped first", trial.number)
    except Exception:  # noqa: BLE001 - its heartbeat stopped: the stale check fails it
        _logger.exception("could not fail trial %d, asked ahead and not run", trial.number)


def _run_trial(ctx, asked: _Asked, progress, run_one, *, name: str, leaser: GpuLeaser | None):
    """Run the trial :func:`_ask_and_begin` gave (on leased GPUs), then stop its heartbeat."""
    trial, params = asked.trial, asked.params
    try:
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
    finally:
        if asked.beat is not None:
            asked.beat.__exit__(None, None, None)
    return None


def _refuse(ctx, trial: optuna.Trial, params: dict, outcome: Outcome, reason: str, worker: str, *, teach: bool) -> None:
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
        return optuna.load_study(study_name=name, storage=cached(storage), sampler=sampler, pruner=pruner)
    except KeyError:
        raise WorkerError(
            f"no Optuna study {name!r} in this storage; start it with `tuner search --study {name}` first"
        ) from None


def run_parallel(ctx, progress=None) -> list[WorkerReport]:
    """Run the search's trials on ``ctx.options.workers`` threads, GPUs leased per trial from ``ctx.options.gpus``
    (or every visible GPU). Called by ``tuner.search.run_search``; returns when every worker has stopped."""
    opts = ctx.options
    gpus = list(opts.gpus) if opts.gpus else list(range(ctx.hardware.gpu_count or 0))
    n = max(1, opts.workers)
    if opts.gpus and opts.workers <= 1:
        n = max(1, len(gpus))  # --gpus alone: one worker per GPU (a multi-GPU trial just leaves others waiting)
    if is_sqlite(opts.storage_url) and n > 1:
        msg = (
            f"{n} worker threads share SQLite storage in this process; writes are serialized. Use PostgreSQL "
            "(--storage postgresql://...) to add `tuner worker` processes or machines"
        )
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
            reports[i] = worker_loop(
                contexts[i],
                shared_progress,
                name=worker_name(i),
                leaser=leaser,
                max_trials=cap,
                storage=storage,
                ask_lock=lock,
                ahead=True,
            )
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


__all__ = [
    "AskLock",
    "Heartbeat",
    "ReconnectingRDBStorage",
    "RetryingRepo",
    "StaleTrialHandler",
    "WorkerError",
    "WorkerReport",
    "cap_decision",
    "fail_stale_trials",
    "is_disconnect",
    "is_sqlite",
    "load_worker_study",
    "mark_trial_crashed",
    "open_worker_storage",
    "retry_db",
    "run_parallel",
    "worker_loop",
    "worker_name",
]
