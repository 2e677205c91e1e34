"""kill_group returns only when no process of the killed group is left: a model server's children (its GPU workers)
keep GPU memory until they have exited, and the next trial must not start beside them."""

from __future__ import annotations

import subprocess
import sys
import time

from tuner.processes import group_alive, kill_group

CHILD = r"""
import os, signal, subprocess, sys, time
# a worker that ignores SIGTERM (as a busy GPU worker may) and a leader that exits on it
kid = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "x = bytearray(300 * 2**20); print('ready', flush=True); time.sleep(600)"])
print(kid.pid, flush=True)
time.sleep(600)
"""


def test_kill_group_returns_only_when_every_process_of_the_group_has_exited():
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], start_new_session=True, stdout=subprocess.PIPE, text=True
        )
        kid = int(proc.stdout.readline())
        time.sleep(1.0)  # the worker holds its memory
        assert group_alive(proc.pid)
        kill_group(proc, grace_s=0.5)
        assert not group_alive(proc.pid), f"worker {kid} still alive after kill_group"
