"""Run one trial in its own process group, so a crash, a hang or a CUDA error fails that trial only.

The parent sends a JSON job on stdin to ``python -m tuner.execution.child``; the child writes its
:class:`Measurement` as JSON to a result file, and intermediate values as ``@@tuner {...}`` lines on stdout.
The parent kills the whole process group at the deadline (outcome ``timeout``) or when the pruner says so
(outcome ``pruned``); a child that dies without a result is classified from its exit status and log.

Two ways to run it: :class:`TrialProcess` starts a fresh process per trial (system targets: each trial builds a
model or a server, and nothing may leak into the next); :class:`tuner.execution.persistent.PersistentWorker` keeps one process per GPU set
(``python -m tuner.execution.child --serve``: one job per stdin line, ``@@tuner-done`` when its result is written) for
short trials such as kernel configs, where the ~2 s interpreter + torch + CUDA start would dominate. A persistent
worker that times out, is pruned, dies or ends a trial with an outcome that may leave the CUDA context broken
(crash, OOM) is killed, and the next trial starts a fresh one.
"""

from __future__ import annotations

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

from tuner.measurement import Measurement, Outcome, exception_line
from tuner.processes import ANNOUNCE_ENV, group_alive, kill_group, kill_pgid, parse_group

_logger = logging.getLogger(__name__)

MARK = "@@tuner "
DONE_MARK = "@@tuner-done "
RETIRE_MARK = "@@tuner-retire"
PRUNE_VERDICT, GO_VERDICT = "@@tuner-prune", "@@tuner-go"
"""A persistent worker's parent answers each intermediate value on the worker's stdin with one of these lines: the
worker's ``report`` returns True on a prune, the target stops (``report``'s contract), and the process is kept."""
"""Printed by a persistent worker just before a trial's done line when its target does not trust the process with
the next trial (:meth:`~tuner.targets.base.Target.worker_reusable`): the parent retires it."""
LOG_LINES = 200

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
        self.groups: list[int] = []
        """Process groups the trial started in their own sessions (its servers), as it announced them."""
        self.result_path = new_result_path()
        env = {**trial_env(job.gpus, job.env), ANNOUNCE_ENV: "1"}
        payload = job_payload(job, self.result_path)
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.execution.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            text=True,
            bufsize=1,
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
            group = parse_group(line)
            if group is not None:
                self.groups.append(group)
                continue
            step = parse_report(line)
            if step is None:
                self.log.append(line)
            elif self.reporter is not None and not self._pruned and ask_pruner(self.reporter, *step):
                self._pruned = True
                self.kill(Outcome.PRUNED)

    def kill(self, why: Outcome) -> None:
        """Kill the whole process group (the trial and anything it started), then every group the trial announced
        (its servers, in their own sessions), and return when none of them is left."""
        if self._killed_reason is None:
            self._killed_reason = why
        kill_group(self.proc)
        self._end_groups()

    def _end_groups(self) -> None:
        for pgid in self.groups:
            if group_alive(pgid):
                _logger.info("ending process group %d that trial process %d started", pgid, self.proc.pid)
                kill_pgid(pgid)

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
        if self.proc.returncode != 0:  # a trial that died may leave its server behind (one that ended well stopped
            self._end_groups()  # it; a group id may be reused once its group is gone, so not checked then)
        return finish_measurement(
            read_result(self.result_path),
            self._killed_reason,
            self.proc.returncode,
            "\n".join(self.log),
            time.time() - self.started,
        )


def parse_report(line: str) -> tuple[int, float] | None:
    """``(step, value)`` of an ``@@tuner {...}`` line of a trial's stdout; None for any other line."""
    if not line.startswith(MARK):
        return None
    try:
        msg = json.loads(line[len(MARK) :])
        return int(msg["step"]), float(msg["value"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def ask_pruner(reporter: Callable[[int, float], bool], step: int, value: float) -> bool:
    """The reporter's verdict on an intermediate value; a pruner that fails does not stop the trial."""
    try:
        return bool(reporter(step, value))
    except Exception:  # noqa: BLE001
        _logger.exception("pruner failed on an intermediate value")
        return False


def new_result_path() -> str:
    """A fresh path (not yet created) for a trial's result file."""
    fd, path = tempfile.mkstemp(prefix="tuner-trial-", suffix=".json")
    os.close(fd)
    os.unlink(path)
    return path


def trial_env(gpus: list[int] | None, extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def job_payload(job: TrialJob, result_path: str) -> dict[str, Any]:
    return {
        "target": job.target,
        "space_yaml": job.space_yaml,
        "space_source": job.space_source,
        "params": job.params,
        "deadline": job.deadline,
        "settings": job.settings,
        "hardware": job.hardware,
        "result_path": result_path,
        "sent_at": time.time(),
    }


def read_result(path: str) -> Measurement | None:
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


def finish_measurement(
    result: Measurement | None, killed: Outcome | None, returncode: int | None, log: str, duration: float
) -> Measurement:
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
    last = [exc] if (exc := exception_line(log)) else [ln for ln in log.splitlines() if ln.strip()][-1:]
    return head + (f": {last[0][:300]}" if last else "")
