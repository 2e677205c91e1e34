"""Child processes the tuner starts and must be able to kill whole: trials, trial workers, model servers.

Every such process is started with its own session (``start_new_session=True``), so its process group holds it
and everything it forks; :func:`kill_group` ends that group and nothing else. :func:`die_with_parent` (run in the
child between fork and exec) asks Linux to kill the child when the tuner process that started it dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

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


__all__ = ["die_with_parent", "kill_group"]
