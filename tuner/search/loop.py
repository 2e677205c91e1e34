"""The sequential search loop: ask, run, tell until the deadline; refining moves in the last share of the time."""

from __future__ import annotations

import logging

from tuner.search import refine, stages
from tuner.search.confirm import confirm_reserve
from tuner.search.context import MAX_REPEATS_IN_A_ROW, Progress, SearchContext
from tuner.search.failfast import FailFast
from tuner.search.trial import run_one

_logger = logging.getLogger(__name__)


def sequential_loop(ctx: SearchContext, progress: Progress | None) -> None:
    repeats_in_a_row = 0
    reproposed = False  # the last trial's proposals repeated a timed configuration (recorded or turned away)
    failures_in_a_row = 0
    started = len(ctx.trials)
    fail_fast = FailFast(ctx.target.config.fail_fast_after)
    while not ctx.stop.is_set():
        if ctx.options.n_trials is not None and len(ctx.trials) - started >= ctx.options.n_trials:
            ctx.stop_reason = f"{ctx.options.n_trials} trials done"
            return
        reserve = confirm_reserve(ctx)
        if ctx.deadline.remaining_for_trials() <= max(1.0, ctx.target.min_trial_s()) + reserve:
            ctx.stop_reason = "budget used"  # or too little of it left for one more trial to give a figure
            return
        # the last share, or TPE re-proposed a timed configuration: a move from the best, enqueued right before the
        # ask that takes it (a move left waiting would be taken by the confirmation's ask instead)
        if (
            reproposed
            or refine.in_window(ctx, reserve, len(ctx.trials) - started)
            or stages.opening(ctx, refine.open_moves)
        ):
            refine.enqueue_next(ctx, progress)
        trial = ctx.study.ask()
        summary = run_one(ctx, trial, progress)
        repeats_in_a_row = repeats_in_a_row + 1 if summary.repeat_of is not None else 0  # exhaustion: recorded ones
        reproposed = summary.reproposed
        failures_in_a_row = failures_in_a_row + 1 if summary.outcome not in ("ok", "pruned") else 0
        give_up = fail_fast.observe(summary)
        if give_up:
            ctx.stop_reason = give_up
            ctx.failed.set()
            ctx.stop.set()
            return
        if stages.after_trial(ctx, progress):
            ctx.stop_reason = ctx.stages.converged_line
            return
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            if stages.on_exhausted(ctx, repeats_in_a_row, progress):
                repeats_in_a_row = 0
                continue
            ctx.stop_reason = f"search space exhausted: {repeats_in_a_row} repeated configurations in a row"
            return
        if failures_in_a_row and failures_in_a_row % 10 == 0 and progress:
            progress.message(f"{failures_in_a_row} failed trials in a row: see `tuner status` for their reasons")
