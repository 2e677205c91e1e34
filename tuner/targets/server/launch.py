"""Start a server in its own process group, watch its log and health endpoint, and tear it down completely.

The watcher classifies what it sees: a fatal log line (Traceback, CUDA out of memory, ``unrecognized
arguments``, ``Killed``) or an early exit becomes an :class:`~tuner.measurement.Outcome` within seconds. Teardown
signals only the process group this module created, then waits for the port (and, with ``nvidia-smi``, the GPU
memory of those processes) to be released.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuner.measurement import Outcome, exception_line
from tuner.processes import announce_group, die_with_parent, kill_group

_logger = logging.getLogger(__name__)

READY_PATTERNS = ("The server is fired up",)
"""Log lines that mean the server is up and warmed (SGLang logs this after its own warm-up request)."""

# (pattern, outcome), most specific first; the first that matches the whole log tail classifies a failure.
CLASSIFY_PATTERNS: tuple[tuple[str, Outcome], ...] = (
    ("CUDA out of memory", Outcome.OOM),
    ("OutOfMemoryError", Outcome.OOM),
    ("out of memory", Outcome.OOM),
    ("OutOfResources", Outcome.OUT_OF_RESOURCES),
    ("out of resource", Outcome.OUT_OF_RESOURCES),
    ("unrecognized arguments", Outcome.INVALID_CONFIG),
    ("error: argument", Outcome.INVALID_CONFIG),
    ("invalid choice", Outcome.INVALID_CONFIG),
    ("not supported", Outcome.INVALID_CONFIG),
    ("NotImplementedError", Outcome.INVALID_CONFIG),
    ("CompilationError", Outcome.COMPILE_ERROR),
    ("Address already in use", Outcome.CRASH),
)

# Lines that mean the server is dying even if its process lingers (SGLang often hangs after a child dies).
FATAL_BEFORE_READY = (
    "Traceback (most recent call last)",
    "unrecognized arguments",
    "error: argument",
    "CUDA out of memory",
    "OutOfMemoryError",
    "Killed",
    "Received sigquit",
)
FATAL_ALWAYS = ("CUDA out of memory", "OutOfMemoryError", "Killed", "Received sigquit")

LOG_HEAD = 30
LOG_TAIL = 150

_USAGE = re.compile(r"^\s*usage:", re.IGNORECASE)
_ARGPARSE_ERROR = re.compile(r"^\S+: error: .+")
_CLICK_ERROR = re.compile(r"^Error: .+")
_BOX = "│╭╰╮╯─┃ "


def usage_error(log: str) -> str | None:
    """The server's own complaint about its command line (argparse's ``prog: error: ...``, click's ``Error: No such
    option: --x``, typer's boxed ``Error``), when the log shows a usage error; else ``None``."""
    lines = log.splitlines()
    boxed = next((i for i, ln in enumerate(lines) if ln.strip().startswith("╭") and " Error " in ln), None)
    if boxed is not None:  # typer's rich error box: the message is inside it
        body = [ln.strip(_BOX) for ln in lines[boxed + 1 :] if not ln.strip().startswith("╰")][:3]
        body = [b for b in body if b]
        return "Error: " + " ".join(body) if body else None
    if not any(_USAGE.match(ln) for ln in lines):
        return None
    for ln in lines:
        if _ARGPARSE_ERROR.match(ln.strip()) or _CLICK_ERROR.match(ln.strip()):
            return ln.strip()
    return None


def classify(log: str, default: Outcome = Outcome.CRASH) -> Outcome:
    for pattern, outcome in CLASSIFY_PATTERNS:
        if pattern in log:
            return outcome
    return default


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (``oom_kill`` of cgroup v2's
    ``memory.events``, or v1's ``memory.oom_control``), or ``None`` where it cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = []
    for ln in lines:
        _, controllers, path = ln.split(":", 2)
        if controllers == "":
            paths.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            paths.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control")
    for f in paths:
        try:
            for ln in f.read_text().splitlines():
                key, _, value = ln.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def kernel_oom_record(pid: int) -> str | None:
    """The kernel's OOM-killer line about ``pid`` (``Out of memory: Killed process N``, ``oom-kill:... pid=N``) from
    ``dmesg``, where the kernel log is readable; else ``None``."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5, errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return None
    pat = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    return next((ln.strip() for ln in reversed(out.splitlines()) if pat.search(ln)), None)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(low: int = 30000, high: int = 30999, host: str = "127.0.0.1") -> int:
    """A free TCP port in ``[low, high]`` (random start, so parallel workers rarely collide)."""
    if not 0 < low <= high < 65536:
        raise ValueError(f"port range must satisfy 0 < low <= high < 65536, but got ({low=}, {high=}).")
    span = high - low + 1
    start = random.randrange(span)
    for i in range(span):
        port = low + (start + i) % span
        if port_is_free(port, host):
            return port
    raise RuntimeError(f"no free port in {low}-{high}; widen settings `port_range`")


def parse_port_range(value) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    lo, _, hi = str(value).partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"settings `port_range` must look like '30000-30999', but got {value!r}.") from None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``, read from /proc."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def gpu_pids() -> set[int] | None:
    """Pids holding GPU memory according to nvidia-smi; ``None`` when nvidia-smi is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {int(x) for x in out.stdout.split() if x.strip().isdigit()}


@dataclass
class ServerFailure:
    outcome: Outcome
    reason: str


class ServerProcess:
    """One server process group. Use as a context manager, or call :meth:`stop` in a ``finally``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        port: int,
        host: str = "127.0.0.1",
        health_paths: Sequence[str] = ("/health", "/v1/models"),
        ready_patterns: Sequence[str] = READY_PATTERNS,
        fatal_grace_s: float = 2.0,
        cwd: str | None = None,
    ) -> None:
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings, never one shell string (got a str)")
        self.argv = [str(a) for a in argv]
        self.port = port
        self.host = host
        self.base_url = f"http://{host}:{port}"
        self.health_paths = tuple(health_paths)
        self.ready_patterns = tuple(ready_patterns)
        self.fatal_grace_s = fatal_grace_s
        self.head: list[str] = []
        self.tail: deque[str] = deque(maxlen=LOG_TAIL)
        self.lines_seen = 0
        self.ready = False
        self.ready_line_seen = False
        self.ready_at: float | None = None
        self._fatal_at: float | None = None
        self._fatal_line = ""
        self._lock = threading.Lock()
        self._stopped = False
        self._signalled = False
        """The tuner sent the server a signal (:meth:`kill_now`, :meth:`stop`)."""
        self.started = time.time()
        self._oom_kills = oom_kill_count()  # an OOM kill is told apart from another signal by this count growing
        full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        _logger.info("starting server on port %d: %s", port, " ".join(self.argv))
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            text=True,
            errors="replace",
            bufsize=1,
            preexec_fn=die_with_parent,
        )
        self.pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        announce_group(self.pgid)  # in a trial: the runner ends this group too if it must kill the trial
        self._reader = threading.Thread(target=self._read, name=f"server-log-{port}", daemon=True)
        self._reader.start()

    # -- log ------------------------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self._lock:
                self.lines_seen += 1
                if len(self.head) < LOG_HEAD:
                    self.head.append(line)
                else:
                    self.tail.append(line)
                if not self.ready_line_seen and any(p in line for p in self.ready_patterns):
                    self.ready_line_seen = True
                fatal = FATAL_ALWAYS if self.ready else FATAL_BEFORE_READY
                if self._fatal_at is None and any(p in line for p in fatal):
                    self._fatal_at = time.time()
                    self._fatal_line = line.strip()
                    _logger.info("fatal line from server on port %d: %s", self.port, line.strip()[:300])

    def log_text(self) -> str:
        with self._lock:
            skipped = self.lines_seen - len(self.head) - len(self.tail)
            middle = [f"... ({skipped} lines skipped) ..."] if skipped > 0 else []
            return "\n".join(self.head + middle + list(self.tail))

    # -- state ----------------------------------------------------------------------------------------------
    def failure(self) -> ServerFailure | None:
        """Why the server is dead or dying, or ``None`` while it looks healthy."""
        code = self.proc.poll()
        if code is not None:
            self._reader.join(timeout=1.0)  # let the last lines (the traceback's end) arrive
            log = self.log_text()
            outcome = classify(log)
            usage = None if self.ready else usage_error(log)
            if usage:  # the server refused its own command line: the flags are at fault, not the server
                return ServerFailure(
                    Outcome.INVALID_CONFIG, f"server refused its command line (exit {code}): {usage[:300]}"
                )
            last = self._reason_line(log)
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            if code < 0 and outcome is Outcome.CRASH:  # a signal: oom only with the kernel's evidence
                evidence = self._oom_evidence()
                if evidence:
                    outcome = Outcome.OOM
                    how += f" ({evidence})"
            when = "after becoming ready" if self.ready else "before becoming ready"
            return ServerFailure(outcome, f"server {how} {when}: {last.strip()[:300]}")
        if self._fatal_at is not None and time.time() - self._fatal_at >= self.fatal_grace_s:
            log = self.log_text()
            return ServerFailure(
                classify(log), f"server logged a fatal line and did not exit: {self._reason_line(log)[:300]}"
            )
        return None

    def failure_within(self, seconds: float, poll_s: float = 0.05) -> ServerFailure | None:
        """:meth:`failure`, waiting up to ``seconds`` for one: a request to a dying server can fail (its connection
        reset) moments before the process is seen to exit."""
        end = time.time() + seconds
        while True:
            f = self.failure()
            if f is not None or time.time() >= end:
                return f
            time.sleep(poll_s)

    def outside_signal(self) -> int | None:
        """The signal that killed the server when the tuner sent none (a kill from outside: an operator, another
        job; the kernel's OOM killer is ``oom``, not this), else None. Meaningful before :meth:`stop`."""
        code = self.proc.poll()
        if code is None or code >= 0 or self._signalled:
            return None
        return None if self._oom_evidence() else -code

    def _oom_evidence(self) -> str:
        """The kernel's word that the server was killed for memory: its OOM-killer record of the server's pid, or
        the memory cgroup's OOM-kill count grown since the start; ``""`` without evidence."""
        record = kernel_oom_record(self.proc.pid)
        if record:
            return f"the kernel's OOM killer: {record[:200]}"
        now = oom_kill_count()
        if now is not None and self._oom_kills is not None and now > self._oom_kills:
            return f"the memory cgroup counted {now - self._oom_kills} OOM kill(s) since the start"
        return ""

    def _reason_line(self, log: str) -> str:
        """The line a failure's reason quotes: a traceback's exception line, else the fatal line, else the last."""
        if not self._fatal_line or "Traceback" in self._fatal_line:
            exc = exception_line(log)
            if exc:
                return exc
        return self._fatal_line or next((ln for ln in reversed(log.splitlines()) if ln.strip()), "")

    def _health_ok(self, client: httpx.Client) -> bool:
        for path in self.health_paths:
            try:
                r = client.get(self.base_url + path)
            except httpx.HTTPError:
                return False  # not listening yet: no point trying the next path
            if r.status_code == 200:
                return True
        return False

    def wait_ready(self, deadline: float, poll_s: float = 0.05) -> ServerFailure | None:
        """Block until the server answers its health endpoint (or logs its ready line); a failure otherwise."""
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=0.5), trust_env=False) as client:
            while True:
                failure = self.failure()
                if failure is not None:
                    return failure
                if self.ready_line_seen or self._health_ok(client):
                    self.ready = True
                    self.ready_at = time.time()
                    _logger.info("server on port %d ready after %.2fs", self.port, self.ready_at - self.started)
                    return None
                if time.time() >= deadline:
                    return ServerFailure(
                        Outcome.TIMEOUT,
                        f"server not ready after {time.time() - self.started:.1f}s "
                        f"(no healthy {'/'.join(self.health_paths)}, no ready line)",
                    )
                time.sleep(poll_s)

    # -- teardown -------------------------------------------------------------------------------------------
    def kill_now(self) -> None:
        """SIGKILL our process group at once, without waiting (used from a signal handler)."""
        self._signalled = True
        try:
            if os.getpgid(self.proc.pid) == self.pgid:
                os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, port_timeout_s: float = 30.0, gpu_timeout_s: float = 60.0) -> None:
        """Kill the whole process group we created; wait for the port and the GPU memory to be released."""
        if self._stopped:
            return
        self._signalled = True
        self._stopped = True
        members = set(group_members(self.pgid)) | {self.proc.pid}
        kill_group(self.proc, grace_s=5.0)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent to the group
            _logger.warning("server leader %d still running after SIGKILL", self.proc.pid)
        end = time.time() + 5.0
        while group_members(self.pgid) and time.time() < end:
            time.sleep(0.02)
        self._reader.join(timeout=2.0)
        end = time.time() + port_timeout_s
        while not port_is_free(self.port, self.host) and time.time() < end:
            time.sleep(0.05)
        if not port_is_free(self.port, self.host):
            _logger.warning("port %d still busy %.0fs after teardown", self.port, port_timeout_s)
        held = gpu_pids()
        if held is not None:
            end = time.time() + gpu_timeout_s
            while held and held & members and time.time() < end:
                time.sleep(0.5)
                held = gpu_pids() or set()
            if held and held & members:
                _logger.warning("GPU memory still held by %s after teardown", sorted(held & members))
        _logger.info("server on port %d stopped after %.2fs", self.port, time.time() - self.started)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
