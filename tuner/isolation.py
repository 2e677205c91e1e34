"""Run one trial in its own process group, so a crash, a hang or a CUDA error fails that trial only.

The parent sends a JSON job on stdin to ``python -m tuner.trial_worker``; the child writes its
:class:`Measurement` as JSON to a result file, and intermediate values as ``@@tuner {...}`` lines on stdout.
The parent kills the whole process group at the deadline (outcome ``timeout``) or when the pruner says so
(outcome ``pruned``); a child that dies without a result is classified from its exit status and log.

Two ways to run it: :class:`TrialProcess` starts a fresh process per trial (system targets: each trial builds a
model or a server, and nothing may leak into the next); :class:`PersistentWorker` keeps one process per GPU set
(``python -m tuner.trial_worker --serve``: one job per stdin line, ``@@tuner-done`` when its result is written) for
short trials such as kernel configs, where the ~2 s interpreter + torch + CUDA start would dominate. A persistent
worker that times out, is pruned, dies or ends a trial with an outcome that may leave the CUDA context broken
(crash, OOM) is killed, and the next trial starts a fresh one.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.measurement import Measurement, Outcome

_logger = logging.getLogger(__name__)

MARK = "@@tuner "
DONE_MARK = "@@tuner-done "
LOG_LINES = 200
KEEP_ALIVE = frozenset({"ok", "wrong_result", "invalid_config", "compile_error", "out_of_resources"})
"""Outcomes after which a persistent worker is trusted with the next trial (its CUDA context is intact)."""

_FATAL_PATTERNS = (
    ("out of memory", Outcome.OOM),
    ("OutOfMemoryError", Outcome.OOM),
    ("OutOfResources", Outcome.OUT_OF_RESOURCES),
    ("out of resource", Outcome.OUT_OF_RESOURCES),
    ("CompilationError", Outcome.COMPILE_ERROR),
)


@dataclass
class TrialJob:
    target: str
    space_yaml: str
    space_source: str
    params: dict[str, Any]
    deadline: float
    settings: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] | None = None
    gpus: list[int] | None = None
    """GPU ids this trial may see (``CUDA_VISIBLE_DEVICES``); ``None`` leaves the environment alone."""
    env: dict[str, str] = field(default_factory=dict)


class TrialProcess:
    """One running trial subprocess. :meth:`wait` returns its :class:`Measurement` however it ends."""

    def __init__(self, job: TrialJob, reporter: Callable[[int, float], bool] | None = None) -> None:
        self.job = job
        self.reporter = reporter
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._pruned = False
        self._killed_reason: Outcome | None = None
        self.result_path = _result_path()
        env = _env(job.gpus, job.env)
        payload = _payload(job, self.result_path)
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.trial_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, text=True, bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(payload))
        self.proc.stdin.close()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            line = line.rstrip("\n")
            if line.startswith(MARK):
                try:
                    msg = json.loads(line[len(MARK):])
                except json.JSONDecodeError:
                    self.log.append(line)
                    continue
                if self.reporter is not None and not self._pruned:
                    try:
                        if self.reporter(int(msg["step"]), float(msg["value"])):
                            self._pruned = True
                            self.kill(Outcome.PRUNED)
                    except Exception:  # the pruner failing must not kill the trial
                        _logger.exception("pruner failed on an intermediate value")
                continue
            self.log.append(line)

    def kill(self, why: Outcome) -> None:
        """Kill the whole process group (the trial and anything it started): SIGTERM, then SIGKILL."""
        if self._killed_reason is None:
            self._killed_reason = why
        kill_group(self.proc)

    def wait(self, hard_deadline: float | None = None) -> Measurement:
        deadline = hard_deadline if hard_deadline is not None else self.job.deadline
        while True:
            try:
                self.proc.wait(timeout=max(0.0, min(0.2, deadline - time.time())))
                break
            except subprocess.TimeoutExpired:
                if time.time() >= deadline:
                    self.kill(Outcome.TIMEOUT)
                    self.proc.wait()
                    break
        self._reader.join(timeout=2.0)
        return finish_measurement(_read_result(self.result_path), self._killed_reason, self.proc.returncode,
                                  "\n".join(self.log), time.time() - self.started)



def _result_path() -> str:
    fd, path = tempfile.mkstemp(prefix="tuner-trial-", suffix=".json")
    os.close(fd)
    os.unlink(path)
    return path


def _env(gpus: list[int] | None, extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def _payload(job: TrialJob, result_path: str) -> dict[str, Any]:
    return {"target": job.target, "space_yaml": job.space_yaml, "space_source": job.space_source,
            "params": job.params, "deadline": job.deadline, "settings": job.settings,
            "hardware": job.hardware, "result_path": result_path}


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
        self.trials = 0
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._done = threading.Event()
        self._expect = ""  # the result path of the trial in flight: only its done line counts
        self._reporter: Callable[[int, float], bool] | None = None
        self._on_prune: Callable[[], None] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.trial_worker", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=_env(self.gpus, self.env), start_new_session=True, text=True, bufsize=1,
        )
        self.started_processes += 1
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        _logger.info("persistent trial worker %d started (gpus %s)", self.proc.pid, self.gpus)

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            line = line.rstrip("\n")
            if line.startswith(DONE_MARK):
                if line[len(DONE_MARK):] == self._expect:
                    self._done.set()
            elif line.startswith(MARK):
                try:
                    msg = json.loads(line[len(MARK):])
                except json.JSONDecodeError:
                    self.log.append(line)
                    continue
                reporter = self._reporter
                if reporter is not None:
                    try:
                        if reporter(int(msg["step"]), float(msg["value"])) and self._on_prune is not None:
                            self._on_prune()
                    except Exception:  # the pruner failing must not kill the trial
                        _logger.exception("pruner failed on an intermediate value")
            else:
                self.log.append(line)

    def start(self, job: TrialJob, reporter: Callable[[int, float], bool] | None = None) -> PersistentTrial:
        if job.gpus != self.gpus or {k: v for k, v in job.env.items()} != self.env:
            raise ValueError(f"job for gpus {job.gpus} env {job.env} sent to a worker for gpus {self.gpus} env {self.env}")
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

    def __init__(self, worker: PersistentWorker, job: TrialJob, reporter: Callable[[int, float], bool] | None
                 ) -> None:
        self.worker, self.job = worker, job
        self.proc = worker.proc
        self.result_path = _result_path()
        self._killed_reason: Outcome | None = None
        worker.log.clear()
        worker._done.clear()
        worker._expect = self.result_path
        worker._reporter = reporter
        worker._on_prune = lambda: self.kill(Outcome.PRUNED)
        self.started = time.time()
        try:
            worker.proc.stdin.write(json.dumps(_payload(job, self.result_path)) + "\n")  # type: ignore[union-attr]
            worker.proc.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):  # died between trials: wait() reports it
            pass

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[union-attr]

    def kill(self, why: Outcome) -> None:
        if self._killed_reason is None:
            self._killed_reason = why
        kill_group(self.proc)  # type: ignore[arg-type]

    def wait(self, hard_deadline: float | None = None) -> Measurement:
        deadline = hard_deadline if hard_deadline is not None else self.job.deadline
        w, proc = self.worker, self.proc
        while not w._done.wait(timeout=max(0.0, min(0.2, deadline - time.time()))):
            if proc.poll() is not None or self._killed_reason is not None:  # type: ignore[union-attr]
                break
            if time.time() >= deadline:
                self.kill(Outcome.TIMEOUT)
                break
        if not w._done.is_set():
            proc.wait()  # type: ignore[union-attr]
            time.sleep(0.05)  # let the reader take the last lines
        w._reporter = w._on_prune = None
        w.trials += 1
        m = finish_measurement(_read_result(self.result_path), self._killed_reason,
                               None if proc.poll() is None else proc.returncode,  # type: ignore[union-attr]
                               "\n".join(w.log), time.time() - self.started)
        if self._killed_reason is not None or proc.poll() is not None or m.outcome.value not in KEEP_ALIVE:
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


def _read_result(path: str) -> Measurement | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return Measurement.from_json(data)


def finish_measurement(result: Measurement | None, killed: Outcome | None, returncode: int | None, log: str,
                       duration: float) -> Measurement:
    """The trial's measurement however it ended: pruned, timed out, its own result, or a death classified from its
    exit status and log."""
    if killed is Outcome.PRUNED:
        m = result or Measurement(outcome=Outcome.PRUNED)
        m.outcome, m.value, m.reason = Outcome.PRUNED, None, m.reason or "pruned on an intermediate value"
    elif killed is Outcome.TIMEOUT:
        m = Measurement.failed(Outcome.TIMEOUT, f"still running at the deadline after {duration:.1f}s; killed")
    elif result is not None:
        m = result
    else:
        m = Measurement.failed(classify_log(log), describe_exit(returncode, log))
    m.log = (m.log + "\n" + log).strip() if m.log else log
    m.duration_s = duration
    return m


def run_trial(job: TrialJob, reporter: Callable[[int, float], bool] | None = None) -> Measurement:
    """Run ``job`` in a fresh subprocess and return its measurement; never raises for a trial's failure."""
    return TrialProcess(job, reporter).wait()


def kill_group(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM the process group of ``proc`` (which we started with its own session), then SIGKILL."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    if pgid != proc.pid:  # not a group we created: never signal anything we did not start
        proc.kill()
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # the leader is gone; make sure no child of the group survives it
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def classify_log(log: str) -> Outcome:
    for pattern, outcome in _FATAL_PATTERNS:
        if pattern in log:
            return outcome
    return Outcome.CRASH


def describe_exit(code: int | None, log: str) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        head = f"trial process killed by {name}"
    else:
        head = f"trial process exited with code {code} without a result"
    last = [ln for ln in log.splitlines() if ln.strip()][-1:] 
    return head + (f": {last[0][:300]}" if last else "")
