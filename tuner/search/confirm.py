"""The end of a search: re-run the top configurations, and pick the winner by the median over its runs."""

from __future__ import annotations

import logging
import statistics

from tuner.search.context import CONFIRM_ATTR, Progress, SearchContext, TrialSummary
from tuner.search.sampling import (
    params_key,
    suggestable,
)
from tuner.search.trial import run_one

_logger = logging.getLogger(__name__)

def confirm_reserve(ctx: SearchContext) -> float:
    """Time kept back at the end to re-run the top configurations and one that may overtake them (none until there
    is something to confirm)."""
    ok = [t.duration_s for t in ctx.trials if t.outcome == "ok" and t.repeat_of is None]
    if ctx.options.confirm_top <= 0 or ctx.options.n_trials is not None or len(ok) < 5:
        return 0.0
    return min(0.15 * ctx.deadline.budget_s, 1.2 * (ctx.options.confirm_top + 1) * statistics.median(ok))


def confirm_top(ctx: SearchContext, progress: Progress | None) -> None:
    """Re-run the best few configurations once more when time allows, so the winner is not a lucky timing. A
    configuration timed once that then beats every confirmed median (the first picks fall back on a re-run:
    regression to the mean) is re-run as well, up to ``confirm_top`` more times, before it can win."""
    k = ctx.options.confirm_top
    ok = [t for t in ctx.trials if t.outcome == "ok" and t.value is not None]
    if k <= 0 or len(ok) < 2:
        return
    distinct: dict[str, TrialSummary] = {}
    for t in sorted(ok, key=lambda t: t.value, reverse=ctx.direction == "maximize"):
        distinct.setdefault(params_key(t.params), t)
    top = list(distinct.values())[:k]
    mean_dur = statistics.median(t.duration_s for t in ok if t.repeat_of is None) or 1.0

    def rerun(t: TrialSummary) -> bool:
        if ctx.stop.is_set() or ctx.deadline.remaining_for_trials() < 1.5 * mean_dur:
            return False
        if ctx.options.n_trials is not None:
            return False
        ctx.study.enqueue_trial(suggestable(ctx.resolved, t.params), user_attrs={CONFIRM_ATTR: t.number})
        trial = ctx.study.ask()
        if progress:
            progress.message(f"re-running trial {t.number}'s configuration to confirm it")
        run_one(ctx, trial, progress)
        return True

    for t in top:
        if not rerun(t):
            return
    for _ in range(k):
        challenger = unconfirmed_leader(ctx)
        if challenger is None or not rerun(challenger):
            return


def _runs_by_config(ctx: SearchContext) -> list[list[TrialSummary]]:
    groups: dict[str, list[TrialSummary]] = {}
    for t in ctx.trials:
        if t.outcome == "ok" and t.value is not None and t.repeat_of is None:
            groups.setdefault(params_key(t.params), []).append(t)
    return list(groups.values())


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


def pick_best(ctx: SearchContext) -> TrialSummary | None:
    """The configuration with the best median over its runs. Once any configuration was timed more than once,
    only those compete: a single timing is never preferred to a confirmed one (it may be the lucky draw)."""
    groups = _runs_by_config(ctx)
    if any(len(runs) > 1 for runs in groups):
        groups = [runs for runs in groups if len(runs) > 1]
    best, best_med = None, None
    for runs in groups:
        med = statistics.median(r.value for r in runs)
        if best_med is None or ctx.better(med, best_med):
            best, best_med = max(runs, key=lambda r: r.number), med
    if best is None:
        return None
    return TrialSummary(best.number, best.params, best.outcome, best_med, best.reason, best.duration_s,
                        best.is_baseline)


