"""The end of a search: re-run the baseline and the top configurations, in time kept for it from the start.

Which configuration wins is decided in :mod:`tuner.search.winner`; this module only plans and runs the re-runs."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from tuner.search.context import CONFIRM_ATTR, Progress, SearchContext, TrialSummary
from tuner.search.sampling import (
    suggestable,
)
from tuner.search.trial import run_one
from tuner.search.winner import Measured, group_runs, pick_best

_logger = logging.getLogger(__name__)

EXTRA_RERUNS = 2
"""Re-runs of the winner at most, beyond the top-k round, while its runs disagree by more than the tolerance."""
SIDE_BY_SIDE_RUNS = 2
"""Runs of what the target measures beside the best before the confirmation round (``Target.side_by_side``: the
workload twin's exported command), kept in the same reserve."""


MAX_SHARE = 0.3
"""At most this share of the budget is kept for confirmation; a plan that needs more re-runs fewer candidates."""

MARGIN = 1.2
"""A re-run is planned at its configuration's measured duration times this (a re-run may be slower)."""


@dataclass(frozen=True)
class ConfirmPlan:
    """The re-runs the end of the search keeps time for: ``(what, seconds)`` each, from the trials' measured cost."""

    runs: tuple[tuple[str, float], ...]
    cap_s: float
    dropped: int = 0
    """Planned re-runs left out because they did not fit :data:`MAX_SHARE` of the budget."""

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.runs)

    def line(self) -> str:
        if not self.runs:
            return "no re-run planned yet (nothing measured)"
        what = ", ".join(f"{w} {s:.0f} s" for w, s in self.runs)
        more = f"; {self.dropped} more left out to fit {MAX_SHARE:.0%} of the budget" if self.dropped else ""
        return f"{self.total_s:.0f} s kept at the end for {len(self.runs)} re-run(s): {what}{more}"


def plan_confirmation(durations: list[tuple[str, float, bool]], *, k: int, budget_s: float) -> ConfirmPlan:
    """The re-runs to keep time for. ``durations`` holds one ``(name, measured seconds, timed twice already)`` per
    configuration, the baseline first and then the rest best first: the baseline and the top ``k`` not yet timed
    twice, one challenger that may overtake them (at the dearest of those) and :data:`EXTRA_RERUNS` of the winner
    while its runs disagree (at the top one's cost). Each at its own measured cost times :data:`MARGIN`: a
    configuration that compiles for a minute is planned at a minute. Cut from the end to fit ``MAX_SHARE`` of
    ``budget_s``."""
    if not durations:
        return ConfirmPlan((), MAX_SHARE * budget_s)
    base, rest = durations[0], durations[1 : k + 1]
    runs = [] if base[2] else [(f"{base[0]} (the baseline)", MARGIN * base[1])]
    runs += [(name, MARGIN * d) for name, d, twice in rest if not twice]
    if rest:
        runs.append(("a challenger", MARGIN * max(d for _, d, _ in rest)))
        runs += [(f"{rest[0][0]} again", MARGIN * rest[0][1])] * EXTRA_RERUNS
    cap, kept = MAX_SHARE * budget_s, []
    for r in runs:
        if sum(s for _, s in kept) + r[1] > cap:
            break
        kept.append(r)
    return ConfirmPlan(tuple(kept), cap, len(runs) - len(kept))


def confirm_plan(ctx: SearchContext) -> ConfirmPlan:
    """:func:`plan_confirmation` over the search's trials so far (nothing while no trial ran correctly, and
    nothing with ``--n-trials`` or ``--confirm-top 0``)."""
    if ctx.options.confirm_top <= 0 or ctx.options.n_trials is not None:
        return ConfirmPlan((), 0.0)
    groups = group_runs(ctx.trials, ctx.key_of)
    cost = _cost_by_key(ctx)
    base = next((g for g in groups if g.is_baseline), None)
    sign = 1.0 if ctx.direction == "maximize" else -1.0
    ranked = sorted((g for g in groups if g is not base), key=lambda g: -sign * g.median)
    rows = [(f"trial {base.numbers[0]}", cost[base.key], len(base.values) > 1)] if base else []
    if not rows:
        return ConfirmPlan((), MAX_SHARE * ctx.deadline.budget_s)
    rows += [(f"trial {g.numbers[0]}", cost[g.key], len(g.values) > 1) for g in ranked]
    return plan_confirmation(rows, k=ctx.options.confirm_top, budget_s=ctx.deadline.budget_s)


def planned_line(confirm_top: int, n_trials: int | None, budget_s: float, trial_s: float | None) -> str:
    """The dry-run plan's line for confirmation: what :func:`plan_confirmation` keeps at the end when every trial
    costs the target's estimate ``trial_s`` (the search plans it again from the trials' measured cost)."""
    if confirm_top <= 0 or n_trials is not None:
        return "none (" + ("--confirm-top 0" if confirm_top <= 0 else "--n-trials: every trial runs once") + ")"
    if not trial_s or trial_s <= 0:
        return (
            f"the baseline and the top {confirm_top} re-run at the end, in time planned from the trials' "
            f"measured cost (no estimate of a trial's cost before the first one runs)"
        )
    rows = [("trial 0", trial_s, False)] + [(f"the {_nth(i + 1)} best", trial_s, False) for i in range(confirm_top)]
    plan = plan_confirmation(rows, k=confirm_top, budget_s=budget_s)
    return f"{plan.line()} (at {trial_s:.0f} s a trial; planned again from the trials' measured cost)"


def _nth(i: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(i, f"{i}th")


def _cost_by_key(ctx: SearchContext) -> dict[str, float]:
    """Each configuration's measured duration (the median over its runs)."""
    by: dict[str, list[float]] = {}
    for t in ctx.trials:
        if t.outcome == "ok" and t.repeat_of is None:
            by.setdefault(ctx.key_of(t.params), []).append(t.duration_s)
    return {k: statistics.median(v) for k, v in by.items()}


def confirm_reserve(ctx: SearchContext) -> float:
    """Time kept back at the end for :func:`confirm_plan`'s re-runs."""
    return confirm_plan(ctx).total_s


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
    cost = _cost_by_key(ctx)

    def rerun(t: TrialSummary, why: str = "to confirm it") -> bool:
        need = MARGIN * (cost.get(ctx.key_of(t.params)) or mean_dur)  # its own measured cost, not the median's
        if ctx.stop.is_set() or ctx.deadline.remaining_for_trials() < need:
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
        if progress and ctx.baseline_value is not None:
            progress.message(
                f"the baseline's median over its runs, {ctx.baseline_value:.2f}, is the figure every "
                f'"x baseline" uses from here on, the final line\'s included'
            )
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
        best = _best(ctx)
        if best is None or best.spread <= tolerance:
            return
        again = next(t for t in ctx.trials if t.number == best.last)
        if not rerun(again, f"again: its runs differ by {best.spread:.0%}, more than the {tolerance:.0%} tolerance"):
            return


def _runs_of(ctx: SearchContext, params: dict) -> list[int]:
    key = ctx.key_of(params)
    return next((list(g.numbers) for g in group_runs(ctx.trials, ctx.key_of) if g.key == key), [])


def _best(ctx: SearchContext) -> Measured | None:
    return pick_best(
        group_runs(ctx.trials, ctx.key_of),
        maximize=ctx.direction == "maximize",
        tolerance=ctx.target.config.noise_tolerance,
    )[0]


def unconfirmed_leader(ctx: SearchContext) -> TrialSummary | None:
    """The configuration timed once whose value beats the best median of every configuration timed more than once
    (None when there is no such one, or nothing was timed twice)."""
    groups = group_runs(ctx.trials, ctx.key_of)
    confirmed = [g.median for g in groups if len(g.values) > 1]
    singles = [g for g in groups if len(g.values) == 1]
    if not confirmed or not singles:
        return None
    best_confirmed = max(confirmed) if ctx.direction == "maximize" else min(confirmed)
    pick = max if ctx.direction == "maximize" else min
    lead = pick(singles, key=lambda g: g.median)
    if not ctx.better(lead.median, best_confirmed):
        return None
    return next(t for t in ctx.trials if t.number == lead.last)
