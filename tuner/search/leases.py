"""GPU leases: each trial runs on GPUs nobody else is using, and gives them back however it ends.

Two layers, used together by :class:`GpuLeaser`:

- **In one process** (the worker threads of ``tuner search --workers N``): a pool of GPU ids guarded by one
  condition variable. A trial asks for ``n`` GPUs (``target.gpus_for(params)``: 1 for a kernel trial, TP×DP for
  a server trial) and gets the lowest free ids. Requests are served in arrival order, but a later, smaller
  request may *backfill* GPUs an earlier, bigger one cannot use yet, until that bigger request has waited
  ``backfill_window_s``; from then on nobody passes it, so the pool drains for it (no starvation).
- **Across processes on one machine** (two ``tuner worker`` processes on one box): one ``fcntl.flock`` per
  GPU id on a file under a lock folder. The kernel drops a process's locks when it dies, however it dies, so
  a crashed worker never keeps a GPU leased.

A lease is a context manager; the GPUs go back in ``finally``::

    leaser = GpuLeaser([0, 1, 2, 3])
    with leaser.lease(2) as ids:        # e.g. [0, 1]; blocks until two GPUs are free
        run_one(ctx, trial, progress, gpus=ids)
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tuner.errors import LeaseCancelled, LeaseError

_logger = logging.getLogger(__name__)

LOCK_DIR_ENV = "TUNER_GPU_LOCK_DIR"
POLL_S = 0.2
"""How often a waiter re-tries the file locks held by other processes (they cannot notify us)."""


def default_lock_dir() -> str:
    """``$TUNER_GPU_LOCK_DIR``, else ``<tmp>/tuner-gpu-locks-<uid>``: shared by every worker of this user."""
    return os.environ.get(LOCK_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"tuner-gpu-locks-{os.getuid()}")


def parse_gpu_ids(text: str | None) -> list[int] | None:
    """``"0,1,3"`` -> ``[0, 1, 3]``; empty or ``None`` -> ``None``. Raises ``ValueError`` naming the input."""
    if text is None or not text.strip():
        return None
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ValueError(f"--gpus must be GPU ids separated by commas, like 0,1,2, but got {text!r}.") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus must list distinct non-negative ids, but got {text!r}.")
    return ids


class FileLocks:
    """One ``flock`` per GPU id under ``lock_dir``, so worker processes on one machine never share a GPU."""

    def __init__(self, lock_dir: str | None = None) -> None:
        self.lock_dir = lock_dir or default_lock_dir()
        os.makedirs(self.lock_dir, exist_ok=True)
        self._fds: dict[int, int] = {}
        self._mutex = threading.Lock()

    def path(self, gpu: int) -> str:
        return os.path.join(self.lock_dir, f"gpu-{gpu}.lock")

    def try_acquire(self, gpu: int) -> bool:
        """Take GPU ``gpu``'s lock without waiting; False when another process holds it."""
        fd = os.open(self.path(gpu), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
        with self._mutex:
            self._fds[gpu] = fd
        return True

    def release(self, gpu: int) -> None:
        with self._mutex:
            fd = self._fds.pop(gpu, None)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def try_acquire_many(self, gpus: Sequence[int], n: int) -> list[int]:
        """Up to ``n`` of ``gpus`` (in order) whose locks are free; all ``n`` or none."""
        got: list[int] = []
        for g in gpus:
            if len(got) == n:
                break
            if self.try_acquire(g):
                got.append(g)
        if len(got) < n:
            for g in got:
                self.release(g)
            return []
        return got


@dataclass
class _Waiter:
    n: int
    since: float
    ticket: int
    granted: list[int] = field(default_factory=list)


class GpuLeaser:
    """Leases GPU ids to trials; thread-safe; optionally also locks each id against other processes.

    ``gpu_ids``: the pool. ``lock_dir``: folder of the per-GPU file locks (``None`` with ``cross_process``
    uses :func:`default_lock_dir`). ``backfill_window_s``: how long a waiting request may be passed by later,
    smaller ones before the pool drains for it. ``clock``: what the waits and deadlines are measured by
    (``time.time`` seconds; tests pass a clock they move).
    """

    def __init__(
        self,
        gpu_ids: Sequence[int],
        *,
        cross_process: bool = True,
        lock_dir: str | None = None,
        backfill_window_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(set(gpu_ids)) != len(gpu_ids):
            raise LeaseError(f"`gpu_ids` must be distinct, but got {list(gpu_ids)}.")
        self.gpu_ids = list(gpu_ids)
        self.backfill_window_s = backfill_window_s
        self._clock = clock
        self.files = FileLocks(lock_dir) if cross_process and self.gpu_ids else None
        self._free = list(self.gpu_ids)
        self._cond = threading.Condition()
        self._queue: list[_Waiter] = []
        self._tickets = itertools.count()
        self._busy: dict[int, int] = {}  # gpu -> ticket holding it (for tests and status)

    @property
    def size(self) -> int:
        return len(self.gpu_ids)

    def in_use(self) -> dict[int, int]:
        with self._cond:
            return dict(self._busy)

    def waiting(self) -> int:
        """Requests waiting for GPUs now."""
        with self._cond:
            return len(self._queue)

    @contextlib.contextmanager
    def lease(
        self, n: int, *, stop: threading.Event | None = None, deadline: float | None = None
    ) -> Iterator[list[int]]:
        """Hold ``n`` GPUs for the ``with`` body; ``n == 0`` yields ``[]`` at once.

        Raises :class:`LeaseError` when ``n`` exceeds the pool, :class:`LeaseCancelled` when ``stop`` is set or
        ``deadline`` (seconds of the leaser's clock, ``time.time()`` by default) passes while waiting.
        """
        ids = self.acquire(n, stop=stop, deadline=deadline)
        try:
            yield ids
        finally:
            self.release(ids)

    def acquire(self, n: int, *, stop: threading.Event | None = None, deadline: float | None = None) -> list[int]:
        if n <= 0:
            return []
        if n > self.size:
            raise LeaseError(
                f"a trial needs {n} GPUs but this worker leases from {self.size} "
                f"({self.gpu_ids}); give more ids with --gpus or shrink the configuration"
            )
        me = _Waiter(n, self._clock(), next(self._tickets))
        with self._cond:
            self._queue.append(me)
            try:
                while True:
                    if self._may_go(me):
                        picked = self._pick(me.n)
                        if picked:
                            me.granted = picked
                            for g in picked:
                                self._free.remove(g)
                                self._busy[g] = me.ticket
                            return list(picked)
                    if stop is not None and stop.is_set():
                        raise LeaseCancelled("stopped while waiting for GPUs")
                    if deadline is not None and self._clock() >= deadline:
                        raise LeaseCancelled("deadline passed while waiting for GPUs")
                    self._cond.wait(timeout=POLL_S)
            finally:
                self._queue.remove(me)
                self._cond.notify_all()

    def release(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self._cond:
            for g in ids:
                if g in self._busy:
                    del self._busy[g]
                    self._free.append(g)
                    if self.files is not None:
                        self.files.release(g)
            self._free.sort(key=self.gpu_ids.index)
            self._cond.notify_all()

    # -- policy (called with the condition held) -------------------------------------------------------------
    def _may_go(self, me: _Waiter) -> bool:
        """First come first served, with backfill: pass an earlier waiter only if it has not waited too long."""
        now = self._clock()
        for w in self._queue:
            if w is me:
                return True
            if now - w.since >= self.backfill_window_s:
                return False  # drain for the starving one
            if w.n <= me.n:
                return False  # an earlier request as small as mine goes first
        return True

    def _pick(self, n: int) -> list[int]:
        if len(self._free) < n:
            return []
        if self.files is None:
            return self._free[:n]
        return self.files.try_acquire_many(self._free, n)


__all__ = ["FileLocks", "GpuLeaser", "LeaseCancelled", "LeaseError", "default_lock_dir", "parse_gpu_ids"]
