"""Child processes the tuner starts and must be able to kill whole: trials, trial workers, model servers.

Every such process is started with its own session (``start_new_session=True``), so its process group holds it
and everything it forks; :func:`kill_group` ends that group and nothing else. :func:`die_with_parent` (run in the
child between fork and exec) asks Linux to kill the child when the tuner process that started it dies.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:  # loaded in the parent: nothing may be imported between fork and exec
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover
    _LIBC = None

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: this process gets SIGKILL when its parent dies (kill -9 included), so no orphan holds a GPU."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (a zombie, which has let go of its memory and GPU, does
    not count). Linux reads /proc; elsewhere, whether the group can still be signalled."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


ANNOUNCE_ENV = "TUNER_ANNOUNCE_GROUPS"
"""Set by the trial runner in a trial's environment: the trial then names each process group it starts."""
GROUP_MARK = "@@tuner-group "


def announce_group(pgid: int) -> None:
    """In a trial (``TUNER_ANNOUNCE_GROUPS=1``), tell the runner about a process group this trial started in its own
    session (a model server): if the trial is killed, the runner kills that group too and waits for it."""
    if os.environ.get(ANNOUNCE_ENV) == "1":
        print(f"{GROUP_MARK}{pgid}", flush=True)


def parse_group(line: str) -> int | None:
    """The group id of an :func:`announce_group` line; None for any other line."""
    if not line.startswith(GROUP_MARK):
        return None
    try:
        return int(line[len(GROUP_MARK) :].strip())
    except ValueError:
        return None


def kill_pgid(pgid: int, grace_s: float = 5.0, exit_wait_s: float = 15.0) -> None:
    """End a process group we did not start ourselves but were told of (:func:`announce_group`): SIGTERM, SIGKILL
    after ``grace_s``, and return once none of it is left (up to ``exit_wait_s``)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, exit_wait_s)):
        if not group_alive(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        except PermissionError:  # the id was reused by someone else's group: never signal it
            return
        end = time.monotonic() + wait
        while group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.02)


def kill_group(proc: subprocess.Popen, grace_s: float = 2.0, exit_wait_s: float = 15.0) -> None:
    """SIGTERM the process group of ``proc`` (which we started with its own session), then SIGKILL, and return once
    no process of the group is left (up to ``exit_wait_s``): a killed server's workers hold their GPU memory until
    they have exited, and the next trial must not start beside them."""
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
            # the leader is gone; make sure no child of the group survives it, and wait until none is left
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            end = time.monotonic() + exit_wait_s
            while group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.02)
            return
        except subprocess.TimeoutExpired:
            continue


__all__ = ["announce_group", "die_with_parent", "group_alive", "kill_group", "kill_pgid", "parse_group"]


def json_output(done: subprocess.CompletedProcess, what: str) -> dict:
    """The last JSON object a finished child printed on a line of its own (a re-measure script, a profiler, a
    side-by-side measurement). ``ValueError("<what> exited with N: <its last line>")`` when it failed or printed none;
    the last line is its standard error's last non-blank one, else its output's."""
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = [ln for ln in (done.stderr or "").splitlines() if ln.strip()][-1:]
    tail = tail or [ln for ln in (done.stdout or "").splitlines() if ln.strip()][-1:] or ["no output"]
    raise ValueError(f"{what} exited with {done.returncode}: {tail[0].strip()[:300]}")
