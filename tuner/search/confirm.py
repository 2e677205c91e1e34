"""The end of a search: re-run the top configurations, and pick the winner by the median over its runs."""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any

from tuner.search.context import CONFIRM_ATTR, Progress, SearchContext, TrialSummary
from tuner.search.sampling import (
    suggestable,
)
from tuner.search.trial import run_one

_logger = logging.getLogger(__name__)

EXTRA_RERUNS = 2
"""Re-runs of the winner at most, beyond the top-k round, while its runs disagree by more than the tolerance."""
SIDE_BY_SIDE_RUNS = 2
"""Runs of what the target measures beside the best before the confirmation round (``Target.side_by_side``: the
workload twin's exported command), kept in the same reserve."""


def confirm_reserve(ctx: SearchContext) -> float:
    """Time kept back at the end to re-run the baseline, the top configurations, one that may overtake them and
    the winner while its runs disagree (none until there is something to confirm)."""
    ok = [t.duration_s for t in ctx.trials if t.outcome == "ok" and t.repeat_of is None]
    if ctx.options.confirm_top <= 0 or ctx.options.n_trials is not None or len(ok) < 5:
        return 0.0
    runs = ctx.options.confirm_top + 2 + EXTRA_RERUNS + SIDE_BY_SIDE_RUNS
    return min(0.2 * ctx.deadline.budget_s, 1.2 * runs * statistics.median(ok))


def confirm_top(ctx: SearchContext, progress: Progress | None) -> None:
    """Re-run the baseline and the best few configurations once more when time allows, so neither end of every
    ratio is a lucky timing. A configuration timed once that then beats every confirmed median (the first picks
    fall back on a re-run: regression to the mean) is re-run as well, up to ``confirm_top`` more times, before it
    can win. Last, while the winner's runs disagree by more than the space's ``noise_tolerance``, it is run again
    (at most :data:`EXTRA_RERUNS` times), so its median is a median and its spread is known."""
    k = ctx.options.confirm_top
    ok = [t for t in ctx.trials if t.outcome == "ok" and t.value is not None]
    if k <= 0 or len(ok) < 2:
        return
    distinct: dict[str, TrialSummary] = {}
    for t in sorted(ok, key=lambda t: t.value, reverse=ctx.direction == "maximize"):
        distinct.setdefault(ctx.key_of(t.params), t)
    top = list(distinct.values())[:k]
    mean_dur = statistics.median(t.duration_s for t in ok if t.repeat_of is None) or 1.0

    def rerun(t: TrialSummary, why: str = "to confirm it") -> bool:
        if ctx.stop.is_set() or ctx.deadline.remaining_for_trials() < 1.5 * mean_dur:
            return False
        if ctx.options.n_trials is not None:
            return False
        ctx.study.enqueue_trial(suggestable(ctx.resolved, t.params), user_attrs={CONFIRM_ATTR: t.number})
        trial = ctx.study.ask()
        if progress:
            progress.message(f"re-running trial {t.number}'s configuration {why}")
        run_one(ctx, trial, progress)
        return True

    base = ctx.baseline
    confirmed = set()
    if base is not None and len(_runs_of(ctx, base.params)) < 2:
        if not rerun(base, "(the baseline) to confirm it"):
            return
        confirmed.add(ctx.key_of(base.params))
    for t in top:
        if ctx.key_of(t.params) in confirmed:
            continue
        if not rerun(t):
            return
    for _ in range(k):
        challenger = unconfirmed_leader(ctx)
        if challenger is None or not rerun(challenger):
            break
    tolerance = ctx.target.config.noise_tolerance
    for _ in range(EXTRA_RERUNS):
        best = pick_best(ctx)
        if best is None or best.spread <= tolerance:
            return
        if not rerun(best, f"again: its runs differ by {best.spread:.0%}, more than the {tolerance:.0%} tolerance"):
            return


def _runs_by_config(ctx: SearchContext) -> list[list[TrialSummary]]:
    groups: dict[str, list[TrialSummary]] = {}
    for t in ctx.trials:
        if t.outcome == "ok" and t.value is not None and t.repeat_of is None:
            groups.setdefault(ctx.key_of(t.params), []).append(t)  # twins of one program are one configuration
    return list(groups.values())


def _runs_of(ctx: SearchContext, params: dict) -> list[TrialSummary]:
    key = ctx.key_of(params)
    return next((runs for runs in _runs_by_config(ctx) if ctx.key_of(runs[0].params) == key), [])


def spread_of(values: list[float]) -> float:
    """The relative range of repeated timings: (max - min) / median; 0 for a single one."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / abs(med) if med else math.inf


def unconfirmed_leader(ctx: SearchContext) -> TrialSummary | None:
    """The configuration timed once whose value beats the best median of every configuration timed more than once
    (None when there is no such one, or nothing was timed twice)."""
    groups = _runs_by_config(ctx)
    confirmed = [statistics.median(r.value for r in runs) for runs in groups if len(runs) > 1]
    singles = [runs[0] for runs in groups if len(runs) == 1]
    if not confirmed or not singles:
        return None
    best_confirmed = max(confirmed) if ctx.direction == "maximize" else min(confirmed)
    lead = max(singles, key=lambda t: t.value) if ctx.direction == "maximize" else min(singles, key=lambda t: t.value)
    return lead if ctx.better(lead.value, best_confirmed) else None


@dataclass
class Choice:
    """The configuration a search reports and exports: its median over its runs and how far those runs spread."""

    number: int
    """The latest run of the configuration (its parameters, its stored record)."""
    params: dict[str, Any]
    value: float
    """The median of the objective over :attr:`runs`."""
    runs: list[int]
    spread: float
    """(max - min) / median over the runs; 0 for one run."""
    is_baseline: bool = False

    @property
    def summary(self) -> TrialSummary:
        return TrialSummary(self.number, self.params, "ok", self.value, "", 0.0, self.is_baseline)


def pick_best(ctx: SearchContext) -> Choice | None:
    """The configuration with the best median over its runs. Once any configuration was timed more than once,
    only those compete: a single timing is never preferred to a confirmed one (it may be the lucky draw)."""
    groups = _runs_by_config(ctx)
    if any(len(runs) > 1 for runs in groups):
        groups = [runs for runs in groups if len(runs) > 1]
    best: Choice | None = None
    for runs in groups:
        values = [r.value for r in runs]
        med = statistics.median(values)
        if best is None or ctx.better(med, best.value):
            last = max(runs, key=lambda r: r.number)
            best = Choice(last.number, last.params, med, sorted(r.number for r in runs), spread_of(values),
                          any(r.is_baseline for r in runs))
    return best


def choice_of(ctx: SearchContext, params: dict) -> Choice | None:
    """The configuration ``params`` as a choice: its median over its runs (None when it never ran correctly)."""
    runs = _runs_of(ctx, params)
    if not runs:
        return None
    values = [r.value for r in runs]
    last = max(runs, key=lambda r: r.number)
    return Choice(last.number, last.params, statistics.median(values), sorted(r.number for r in runs),
                  spread_of(values), any(r.is_baseline for r in runs))


def baseline_choice(ctx: SearchContext) -> Choice | None:
    """The baseline configuration's median over its runs (every "x baseline" uses it), or None without one."""
    base = ctx.baseline
    if base is None:
        return None
    runs = _runs_of(ctx, base.params) or [base]
    values = [r.value for r in runs]
    return Choice(base.number, base.params, statistics.median(values), sorted(r.number for r in runs),
                  spread_of(values), True)


def decide(ctx: SearchContext) -> tuple[Choice | None, Choice | None, str]:
    """``(best, baseline, note)``: the winner by median; the baseline instead when the winner does not beat it by
    more than their measured spread (then the note says so, and the export is the defaults)."""
    best, base = pick_best(ctx), baseline_choice(ctx)
    if best is None or base is None or ctx.key_of(best.params) == ctx.key_of(base.params):
        return best, base, ""
    num, den = (best.value, base.value) if ctx.direction == "maximize" else (base.value, best.value)
    # a baseline worth 0 (an infeasible goodput configuration) is beaten by any configuration worth more
    gain = num / den if den > 0 else (math.inf if num > den else 1.0)
    noise = max(best.spread, base.spread)
    if len(best.runs) > 1 and len(base.runs) > 1 and gain - 1.0 <= noise:
        return base, base, (f"nothing beat the baseline beyond the measured spread: the best ({best.params}) was "
                            f"{gain:.3f}x it, within the runs' spread of {noise:.1%}; the defaults are exported")
    return best, base, ""
