"""Persistent trial workers: one long-lived ``python -m tuner.execution.child --serve`` process per GPU set, running
trial after trial (one job per stdin line, ``@@tuner-done <result path>`` when its result file is written).

For short trials such as kernel configs, where a fresh interpreter + torch + CUDA context (~2 s) would cost more than
the trial. Same contract as :class:`tuner.execution.isolation.TrialProcess` (``wait``/``kill``, intermediate values to the
pruner, the process group killed at the deadline). A prune is answered on the worker's stdin: the target stops at
that intermediate value and the process stays (a target that has not stopped :data:`PRUNE_GRACE_S` later is killed).
A trial that times out, dies, or ends with an outcome outside :data:`KEEP_ALIVE` (a crash or OOM may leave the CUDA
context broken) retires the process, and the next trial starts a fresh one; so does a trial after which the target
says the process is not to be trusted (:meth:`~tuner.targets.base.Target.worker_reusable`: the workload's numerics
failure). A fresh process costs an interpreter, torch, the target's libraries and a CUDA context: on an H200 with
SGLang's and DeepGEMM's kernels importable, 15-20 s a trial when every prune retired it.
"""

from __future__ import annotations

import atexit
import json
import logging
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from tuner.execution.isolation import (
    DONE_MARK,
    GO_VERDICT,
    LOG_LINES,
    PRUNE_VERDICT,
    RETIRE_MARK,
    TrialJob,
    ask_pruner,
    finish_measurement,
    job_payload,
    new_result_path,
    parse_report,
    read_result,
    trial_env,
)
from tuner.measurement import Measurement, Outcome
from tuner.processes import kill_group

_logger = logging.getLogger(__name__)

KEEP_ALIVE = frozenset({"ok", "wrong_result", "invalid_config", "compile_error", "out_of_resources"})
"""Outcomes after which a persistent worker is trusted with the next trial (its CUDA context is intact)."""
PRUNE_GRACE_S = 10.0
"""Seconds a pruned trial's target has to stop after the verdict before its process is killed."""


class PersistentWorker:
    """A long-lived trial process for one GPU set: many trials, one interpreter, torch import and CUDA context.

    :meth:`start` sends a job and returns a handle with the same ``wait``/``kill`` as :class:`TrialProcess`. The
    worker is killed (and the next trial starts a fresh one) when a trial times out, is pruned, the process dies, or
    the outcome is not in :data:`KEEP_ALIVE`.
    """

    def __init__(self, gpus: list[int] | None = None, env: dict[str, str] | None = None) -> None:
        self.gpus = gpus
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.started_processes = 0
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._done = threading.Event()
        self._expect = ""  # the result path of the trial in flight: only its done line counts
        self._retire = False  # the trial in flight's target asked for a fresh process after it
        self._reporter: Callable[[int, float], bool] | None = None
        self._on_prune: Callable[[], None] | None = None
        self._stdin_lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.execution.child", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=trial_env(self.gpus, self.env),
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        self.started_processes += 1
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        _logger.info("persistent trial worker %d started (gpus %s)", self.proc.pid, self.gpus)

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            line = line.rstrip("\n")
            if line == RETIRE_MARK:
                self._retire = True
            elif line.startswith(DONE_MARK):
                if line[len(DONE_MARK) :] == self._expect:
                    self._done.set()
            elif (step := parse_report(line)) is None:
                self.log.append(line)
            else:  # the worker waits for the verdict on every intermediate value
                reporter, on_prune = self._reporter, self._on_prune
                prune = reporter is not None and ask_pruner(reporter, *step)
                self._send(proc, PRUNE_VERDICT if prune else GO_VERDICT)
                if prune and on_prune is not None:
                    on_prune()

    def _send(self, proc: subprocess.Popen, line: str) -> None:
        with self._stdin_lock:
            try:
                proc.stdin.write(line + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):  # died: wait() reports it
                pass

    def start(self, job: TrialJob, reporter: Callable[[int, float], bool] | None = None) -> PersistentTrial:
        if job.gpus != self.gpus or job.env != self.env:
            raise ValueError(
                f"job for gpus {job.gpus} env {job.env} sent to a worker for gpus {self.gpus} env {self.env}"
            )
        if not self.alive():
            self._spawn()
        return PersistentTrial(self, job, reporter)

    def stop(self) -> None:
        """Kill the worker's process group (a trial running in it included)."""
        if self.proc is not None:
            kill_group(self.proc)
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
            self.proc = None


class PersistentTrial:
    """One trial inside a :class:`PersistentWorker`; ``wait``/``kill`` as in :class:`TrialProcess`."""

    def __init__(self, worker: PersistentWorker, job: TrialJob, reporter: Callable[[int, float], bool] | None) -> None:
        self.worker, self.job = worker, job
        self.proc = worker.proc
        self.result_path = new_result_path()
        self._killed_reason: Outcome | None = None
        worker.log.clear()
        worker._done.clear()
        worker._retire = False
        worker._expect = self.result_path
        worker._reporter = reporter
        self._pruned_at: float | None = None
        worker._on_prune = self._prune
        self.started = time.time()
        worker._send(worker.proc, json.dumps(job_payload(job, self.result_path)))  # type: ignore[arg-type]

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[union-attr]

    def kill(self, why: Outcome) -> None:
        if self._killed_reason is None:
            self._killed_reason = why
        kill_group(self.proc)  # type: ignore[arg-type]

    def _prune(self) -> None:
        """The pruner's verdict was sent: the target stops at this intermediate value (see :meth:`wait`)."""
        if self._pruned_at is None:
            self._pruned_at = time.time()

    def wait(self, hard_deadline: float | None = None) -> Measurement:
        deadline = hard_deadline if hard_deadline is not None else self.job.deadline
        w, proc = self.worker, self.proc
        while not w._done.wait(timeout=max(0.0, min(0.2, deadline - time.time()))):
            if proc.poll() is not None or self._killed_reason is not None:  # type: ignore[union-attr]
                break
            if self._pruned_at is not None and time.time() - self._pruned_at >= PRUNE_GRACE_S:
                self.kill(Outcome.PRUNED)  # a target that does not stop at the verdict
                break
            if time.time() >= deadline:
                self.kill(Outcome.TIMEOUT)
                break
        if not w._done.is_set():
            proc.wait()  # type: ignore[union-attr]
            time.sleep(0.05)  # let the reader take the last lines
        w._reporter = w._on_prune = None
        pruned = self._killed_reason is None and self._pruned_at is not None and w._done.is_set()
        m = finish_measurement(
            read_result(self.result_path),
            Outcome.PRUNED if pruned else self._killed_reason,
            None if proc.poll() is None else proc.returncode,  # type: ignore[union-attr]
            "\n".join(w.log),
            time.time() - self.started,
        )
        kept = m.outcome.value in KEEP_ALIVE or pruned  # a pruned target stopped on its own: its context is intact
        if self._killed_reason is not None or proc.poll() is not None or not kept or w._retire:
            w.stop()  # a fresh process for the next trial
        return m


_POOL: dict[tuple, PersistentWorker] = {}
_POOL_LOCK = threading.Lock()


def persistent_worker(gpus: list[int] | None, env: dict[str, str] | None = None) -> PersistentWorker:
    """The persistent worker of this GPU set, environment and calling thread (created on first use; parallel
    local workers each get their own)."""
    key = (tuple(gpus) if gpus is not None else None, tuple(sorted((env or {}).items())), threading.get_ident())
    with _POOL_LOCK:
        if key not in _POOL:
            _POOL[key] = PersistentWorker(gpus, env)
        return _POOL[key]


def close_workers() -> None:
    """Stop every persistent worker (end of a search; also at interpreter exit)."""
    with _POOL_LOCK:
        workers = list(_POOL.values())
        _POOL.clear()
    for w in workers:
        w.stop()


atexit.register(close_workers)
