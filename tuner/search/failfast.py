"""When a search should give up early: its baseline failed (nothing can be compared without it), or trial after
trial fails the same way (a broken environment, not a bad configuration: a known complaint about peer tuners is
the runaway loop of failed trials)."""

from __future__ import annotations

import re

from tuner.search.context import TrialSummary

RAN_AND_FAILED = ("crash", "oom", "timeout", "compile_error", "out_of_resources", "request_error")
"""Outcomes of a trial that ran and failed. A configuration refused before running (``invalid_config``), a wrong
result and a pruned trial say something about the configuration, not the environment: they neither count nor reset
the run."""

CUT_BY_THE_SEARCH = ("stopped at the search's deadline", "stopped when the search was interrupted")


def _same(reason: str) -> str:
    """A failure's reason with the parts that differ from trial to trial (numbers, paths, ports) blurred."""
    first = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return re.sub(r"\d+(\.\d+)?", "#", first)[:160]


class FailFast:
    """Watches finished trials in order; :meth:`observe` returns why the search should end now, or None."""

    def __init__(self, same_failures: int) -> None:
        self.limit = same_failures
        self.key: tuple[str, str] | None = None
        self.count = 0

    def observe(self, s: TrialSummary) -> str | None:
        if s.repeat_of is not None or any(s.reason.startswith(c) for c in CUT_BY_THE_SEARCH):
            return None
        if s.is_baseline and s.outcome not in ("ok", "pruned"):
            return (
                f"the baseline (trial {s.number}) failed, {s.outcome}: {_first_line(s.reason)}; every ratio needs "
                "it, so the search stops here: fix that and run it again"
            )
        if s.outcome in ("ok", "pruned"):
            self.key, self.count = None, 0
            return None
        if s.outcome not in RAN_AND_FAILED:
            return None
        key = (s.outcome, _same(s.reason))
        self.count = self.count + 1 if key == self.key else 1
        self.key = key
        if self.limit and self.count >= self.limit:
            return (
                f"{self.count} trials in a row failed the same way, {s.outcome}: {_first_line(s.reason)}; the "
                "search stops (setting fail_fast_after: 0 turns this off)"
            )
        return None


def _first_line(reason: str) -> str:
    lines = [ln for ln in (reason or "").splitlines() if ln.strip()]
    return lines[0][:300] if lines else "no reason recorded"
