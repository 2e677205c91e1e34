"""Derived views of a study (parameter importances, plot figures): computed once, then served from memory.

A view is recomputed only when the study has changed (its newest event id, the version) *and* the value held is
older than its refresh interval: ``derived_refresh_s``, or ten times what the last computation cost when that is
longer, so a view that takes 4 s on a 5,000-trial study is refreshed at most every 40 s (a tenth of one core),
never per event. The refresh runs in a background thread while requests keep getting the value held; only the
first request for a view (cold) waits, and concurrent first requests share one computation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

_logger = logging.getLogger(__name__)

COST_FACTOR = 10.0
"""A view is refreshed at most every COST_FACTOR x its last computation time."""


@dataclass
class _Entry:
    value: Any
    version: Hashable
    at: float
    cost_s: float
    refreshing: bool = False


class DerivedViews:
    """Thread-safe: called from the request threadpool."""

    def __init__(self, refresh_s: float, *, size: int = 64) -> None:
        self.refresh_s = refresh_s
        self._size = size
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._cold: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, version: Hashable, compute: Callable[[], Any]) -> Any:
        """The view ``key`` as held, computing it first when none is held; starts a background refresh when
        ``version`` differs from the one it was computed at and the refresh interval has passed."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if self._due(entry, version):
                    entry.refreshing = True
                    threading.Thread(target=self._refresh, args=(key, version, compute), daemon=True,
                                     name=f"refresh-{key}").start()  # fmt: skip
                return entry.value
            cold = self._cold.setdefault(key, threading.Lock())
        with cold:  # the first requests for a view share one computation
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                entry = self._compute(key, version, compute)
            with self._lock:
                self._cold.pop(key, None)
            return entry.value

    def _due(self, entry: _Entry, version: Hashable) -> bool:
        interval = max(self.refresh_s, COST_FACTOR * entry.cost_s)
        return entry.version != version and not entry.refreshing and time.monotonic() - entry.at >= interval

    def _compute(self, key: Hashable, version: Hashable, compute: Callable[[], Any]) -> _Entry:
        t = time.monotonic()
        value = compute()
        entry = _Entry(value, version, time.monotonic(), time.monotonic() - t)
        _logger.info("computed %s at version %s in %.2f s", key, version, entry.cost_s)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return entry

    def _refresh(self, key: Hashable, version: Hashable, compute: Callable[[], Any]) -> None:
        try:
            self._compute(key, version, compute)
        except Exception:  # the value held stays; the next due request tries again
            _logger.exception("refreshing %s failed; serving the value held", key)
            with self._lock:
                if key in self._entries:
                    self._entries[key].refreshing = False
                    self._entries[key].at = time.monotonic()
