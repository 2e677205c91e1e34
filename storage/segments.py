"""A run's segments: each ``tuner search`` process on a study (the first, then each ``--resume``) is one segment.

The run's own columns ``started_at``, ``ended_at`` and ``budget_s`` describe the current (last) segment, which is
what a worker joining the study needs; the earlier ones are kept in ``settings["earlier_segments"]`` by
``Repo.restart_run``. Everything that reports a whole study (its start, total budget, elapsed time, the time axis
of its history plot) reads the segments here, so a study run 2 x 5 minutes reports 10 minutes, not the last 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.models import Run, utcnow

EARLIER_SEGMENTS = "earlier_segments"


@dataclass(frozen=True)
class Segment:
    started_at: datetime
    """Naive UTC, as the ``tuner_`` tables store time."""
    ended_at: datetime | None
    """None while the segment's process is still running."""
    budget_s: float

    def seconds(self, now: datetime | None = None) -> float:
        return max(0.0, ((self.ended_at or now or utcnow()) - self.started_at).total_seconds())

    def to_json(self) -> dict:
        return {
            "started_at": self.started_at.isoformat(),
            "budget_s": self.budget_s,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
        }

    @classmethod
    def from_json(cls, doc: dict) -> Segment:
        end = doc.get("ended_at")
        return cls(
            datetime.fromisoformat(doc["started_at"]),
            datetime.fromisoformat(end) if end else None,
            float(doc.get("budget_s") or 0.0),
        )


def segments(run: Run) -> list[Segment]:
    """Every segment of the run, oldest first; the last one is the run's current columns."""
    earlier = (run.settings or {}).get(EARLIER_SEGMENTS) or []
    return [*(Segment.from_json(d) for d in earlier), Segment(run.started_at, run.ended_at, run.budget_s)]


def first_started_at(run: Run) -> datetime:
    return segments(run)[0].started_at


def total_budget_s(run: Run) -> float:
    return sum(s.budget_s for s in segments(run))


def elapsed_s(run: Run, now: datetime | None = None) -> float:
    """Seconds the study has been searched: the sum of its segments, without the gaps between them."""
    return sum(s.seconds(now) for s in segments(run))


def active_seconds(run: Run, at: datetime) -> float:
    """Where the wall-clock time ``at`` (naive UTC) falls on the study's searched time (the x of its history plot):
    the earlier segments' lengths plus the time since the start of the segment it falls in."""
    done = 0.0
    segs = segments(run)
    for i, seg in enumerate(segs):
        nxt = segs[i + 1].started_at if i + 1 < len(segs) else None
        if nxt is None or at < nxt:
            return round(done + min(max(0.0, (at - seg.started_at).total_seconds()), seg.seconds(at)), 3)
        done += seg.seconds()
    return round(done, 3)  # pragma: no cover - the loop returns on its last segment
