"""What a trial returns: an outcome class, an objective value, every metric at every level, and a log excerpt."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any

from storage.types import OUTCOMES, MetricRow


class Outcome(str, enum.Enum):
    OK = "ok"
    INVALID_CONFIG = "invalid_config"
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    OOM = "oom"
    TIMEOUT = "timeout"
    CRASH = "crash"
    WRONG_RESULT = "wrong_result"
    PRUNED = "pruned"
    REQUEST_ERROR = "request_error"
    """The server ran, but refused the load's requests (HTTP 4xx): the load settings are at fault, not the
    configuration (never remembered as a failed flag set)."""


assert tuple(o.value for o in Outcome) == OUTCOMES  # one list of outcomes, two spellings (enum and storage)


OUTSIDE_SIGNAL = "outside_signal"
"""The row (value: the signal's number) of a trial whose server a signal from outside the tuner killed."""


@dataclass
class Measurement:
    """The result of one trial. ``value`` is the combined objective; only ``ok`` trials carry one."""

    outcome: Outcome
    value: float | None = None
    metrics: list[MetricRow] = field(default_factory=list)
    by_level: dict[int, float] = field(default_factory=dict)
    """The objective's metric at each level (concurrency or batch), before combining."""
    reason: str = ""
    log: str = ""
    duration_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    """What the trial hands back to the search beside its figures, as JSON (e.g. its greedy completions), for the
    target's ``after_trial`` hook to keep in the study's storage; never shown as a figure."""

    @classmethod
    def failed(cls, outcome: Outcome, reason: str, log: str = "") -> Measurement:
        return cls(outcome=outcome, reason=reason, log=log)

    @property
    def outside_signal(self) -> bool:
        """The trial's server was killed by a signal the tuner did not send (row :data:`OUTSIDE_SIGNAL`): the
        failure says nothing of the configuration, which stays eligible to run again in its study."""
        return self.metric(OUTSIDE_SIGNAL) is not None

    def metric(self, name: str, level: str = "") -> float | None:
        for m in self.metrics:
            if m.metric == name and m.level == level:
                return m.value
        return None

    def to_json(self) -> dict:
        return {
            "outcome": self.outcome.value,
            "value": self.value,
            "metrics": [[m.metric, m.level, m.value, m.unit] for m in self.metrics],
            "by_level": {str(k): v for k, v in self.by_level.items()},
            "reason": self.reason,
            "log": self.log,
            "duration_s": self.duration_s,
            "data": self.data,
        }

    @classmethod
    def from_json(cls, data: dict) -> Measurement:
        return cls(
            outcome=Outcome(data["outcome"]),
            value=data.get("value"),
            metrics=[MetricRow(*row) for row in data.get("metrics", [])],
            by_level={int(k): float(v) for k, v in (data.get("by_level") or {}).items()},
            reason=data.get("reason", ""),
            log=data.get("log", ""),
            duration_s=float(data.get("duration_s", 0.0)),
            data=dict(data.get("data") or {}),
        )


def _level_order(level: str) -> tuple[str, float]:
    kind, _, n = level.partition("=")
    try:
        return kind, float(n)
    except ValueError:
        return level, 0.0


def served_shortfall(rows) -> str:
    """The loads of a server trial that were not served in full, from its rows (``MetricRow`` s or stored
    measurements: ``metric``, ``level``, ``value``): ``c=8: 3% errors, 91% delivered; c=16: 12% errors`` for each
    level whose ``error_rate`` is above 0 or whose ``delivered`` (share of the asked tokens) is below 1; empty when
    every level was served in full or the trial stored neither figure."""
    got: dict[str, dict[str, float]] = {}
    for m in rows:
        if m.metric in ("error_rate", "delivered") and m.value is not None:
            got.setdefault(m.level, {})[m.metric] = m.value
    parts = []
    for level in sorted(got, key=_level_order):
        figs, what = got[level], []
        if figs.get("error_rate", 0.0) > 0:  # rounded up and down: a shortfall never reads as 0% or 100%
            what.append(f"{math.ceil(1000 * figs['error_rate']) / 10:g}% errors")
        if figs.get("delivered", 1.0) < 1:
            what.append(f"{math.floor(1000 * figs['delivered']) / 10:g}% delivered")
        if what:
            parts.append(f"{level}: {', '.join(what)}")
    return "; ".join(parts)


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault|Failure)|KeyboardInterrupt)(: .*)?")


def exception_line(log: str) -> str | None:
    """The exception line of the last traceback in ``log`` (``OSError: [Errno 98] Address already in use``), the
    line a reason should quote, never the ``Traceback (most recent call last):`` header; ``None`` without a traceback.
    A prefix written before the header on every line (``[rank0]: ``) is taken off."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if _TRACEBACK in ln]
    if not starts:
        return None
    i = starts[-1]
    prefix = lines[i][: lines[i].index(_TRACEBACK)]
    for ln in lines[i + 1 :]:
        if prefix and ln.startswith(prefix):
            ln = ln[len(prefix) :]
        if ln.strip() and not ln[:1].isspace():
            return ln.strip()
    found = [ln.strip() for ln in lines[i + 1 :] if _EXCEPTION.match(ln.strip())]
    return found[-1] if found else None
