"""Wall-clock budgets: parsing ``90s``, ``10m``, ``2h``, ``1h30m`` and the deadline that follows from one."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass

from tuner.errors import BudgetError

_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_budget(text: str) -> float:
    """Seconds in ``text``: ``90s``, ``10m``, ``2h``, ``1h30m``, ``1h30m15s``, or a bare number of seconds."""
    raw = (text or "").strip().lower().replace(" ", "")
    fix = "write it like 90s, 10m, 2h or 1h30m"
    if not raw:
        raise BudgetError(f"--budget is empty; {fix}")
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        seconds = float(raw)
    else:
        pos, seconds, seen = 0, 0.0, set()
        for m in _PART.finditer(raw):
            if m.start() != pos or m.group(2) in seen:
                raise BudgetError(f"--budget {text!r} cannot be parsed; {fix}")
            seen.add(m.group(2))
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(raw) or not seen:
            raise BudgetError(f"--budget {text!r} cannot be parsed; {fix}")
        order = [u for u in "hms" if u in seen]
        if [u for u in (m.group(2) for m in _PART.finditer(raw))] != order:
            raise BudgetError(f"--budget {text!r} has its units out of order; {fix}")
    if seconds <= 0:
        raise BudgetError(f"--budget {text!r} must be more than zero; {fix}")
    return seconds


def format_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


@dataclass(frozen=True)
class Deadline:
    """The end of a search, with time kept back for the export at the end."""

    start: float
    budget_s: float
    reserve_s: float
    kept_s: float = 0.0
    """Time kept back from the trials for what runs after them within the budget (the SGLang plug-in's side by
    side), on top of ``reserve_s``."""

    @classmethod
    def start_now(cls, budget_s: float, started_at: float | None = None) -> Deadline:
        """A budget counted from now, or from ``started_at`` (the command's start: its imports and setup count)."""
        # export and teardown need a few seconds; keep back 3% of the budget, between 2 s and 60 s
        start = time.time() if started_at is None else min(started_at, time.time())
        return cls(start, budget_s, min(60.0, max(2.0, 0.03 * budget_s)))

    @property
    def end(self) -> float:
        return self.start + self.budget_s

    @property
    def trials_end(self) -> float:
        """When trials must be over, so what runs after them and the export still fit in the budget."""
        return self.end - self.reserve_s - self.kept_s

    def keep(self, seconds: float) -> Deadline:
        """This deadline with ``seconds`` more kept back from the trials."""
        return dataclasses.replace(self, kept_s=self.kept_s + max(0.0, seconds))

    def remaining_before_export(self) -> float:
        """Seconds left before the time kept for the export."""
        return self.end - self.reserve_s - time.time()

    def elapsed(self) -> float:
        return time.time() - self.start

    def remaining_for_trials(self) -> float:
        return self.trials_end - time.time()


def process_start() -> float:
    """When this process started (``time.time()``'s clock), read from Linux's ``/proc``; elsewhere, or when that
    cannot be read, when this module was first imported. ``tuner search --budget`` counts from it: on an H200 the
    imports, CUDA's start and SGLang's parser took 22-33 s of a 7-minute budget before the search's own clock began."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / ticks  # field 22 (starttime); the split starts at field 3
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        started = boot + since_boot
    except (OSError, ValueError, StopIteration, IndexError):
        return _IMPORTED
    return started if started <= time.time() + 1.0 else _IMPORTED


_IMPORTED = time.time()
