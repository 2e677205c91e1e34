"""One trial: sample, check, run in its own process, store, tell Optuna. A failed trial is data, never an exception."""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import time
from typing import Any

import optuna

from search_spaces.schema import SLO_LEVEL
from tuner.execution.isolation import TrialJob, TrialProcess
from tuner.execution.persistent import persistent_worker
from tuner.measurement import Measurement, Outcome, served_shortfall
from tuner.search.context import (
    BASELINE_ATTR,
    CONFIRM_ATTR,
    Progress,
    SearchContext,
    TrialSummary,
    set_constraints,
)
from tuner.search.sampling import (
    TURNED_AWAY_ATTR,
    suggest,
)

_logger = logging.getLogger(__name__)


def penalty_value(direction: str) -> float:
    """What a failed trial is told as: worse than any real result, so TPE puts it in the bad group."""
    return 0.0 if direction == "maximize" else 1e30


def told(ctx: SearchContext, value: float, m: Measurement | None = None) -> float | list[float]:
    """What Optuna is told: ``value``, and in the multi-objective mode (``objective.pareto``) the second metric at
    the SLO's level beside it (the penalty's when ``m`` is None or lacks it)."""
    obj = ctx.resolved.space.objective
    if not obj.pareto:
        return value
    second = m.metric(obj.pareto, SLO_LEVEL) if m is not None else None
    return [value, second if second is not None and math.isfinite(second) else penalty_value("maximize")]


def propose(ctx: SearchContext, trial: optuna.Trial) -> dict[str, Any]:
    """The configuration ``trial`` runs, settled at the first call (a later one returns the same: the parallel
    workers call it first to know how many GPUs to lease, then :func:`run_one` does). A plainly sampled trial's
    proposals that repeat a timed configuration are turned away and sampled again (``sampling.suggest``); the
    baseline, a confirmation, an enqueued trial (a refining move, the warm start: its values are fixed) and the
    retry of a lost trial run the configuration they were given."""
    attrs = trial.user_attrs
    plain = not attrs.get(BASELINE_ATTR) and attrs.get(CONFIRM_ATTR) is None
    if plain:
        system = trial.storage.get_trial(trial._trial_id).system_attrs
        plain = "fixed_params" not in system and system.get("failed_trial") is None

    def repeat_of(params: dict[str, Any]) -> int | None:
        earlier = ctx.seen.get(ctx.key_of(params))
        return None if earlier is None else earlier.number

    return suggest(trial, ctx.space_for(attrs), repeat_of=repeat_of if plain else None)


def run_one(
    ctx: SearchContext,
    trial: optuna.Trial,
    progress: Progress | None,
    *,
    gpus: list[int] | None = None,
    worker: str = "",
) -> TrialSummary:
    """Sample, check, run (in a subprocess), store and tell one trial. Never raises for the trial's failure."""
    params = propose(ctx, trial)
    turned_away = int(trial.user_attrs.get(TURNED_AWAY_ATTR, 0))
    is_baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
    confirm_of = trial.user_attrs.get(CONFIRM_ATTR)
    ctx.repo.start_trial(
        ctx.run.id, trial.number, params, worker=worker or socket.gethostname(), is_baseline=is_baseline
    )
    if progress:
        progress.trial_started(trial.number, params)
    key = ctx.key_of(params)
    earlier = ctx.seen.get(key)
    t0 = time.time()
    if earlier is not None and confirm_of is None and not is_baseline:
        m = Measurement(
            outcome=Outcome(earlier.outcome),
            value=earlier.value,
            reason=f"same configuration as trial {earlier.number}: not run again "
            f"({earlier.outcome}{'' if earlier.reason == '' else ': ' + earlier.reason[:200]})",
        )
        repeat_of = earlier.number
    else:
        repeat_of = None
        reason = ctx.target.check(params)
        if not reason and not is_baseline:  # the baseline always runs: every figure needs it
            reason = ctx.target.known_failure(ctx.repo, params, run_id=ctx.run.id)
        if reason:
            m = Measurement.failed(Outcome.INVALID_CONFIG, reason)
            _logger.info("trial %d refused before running: %s", trial.number, reason)
        else:
            m = _run_isolated(ctx, trial, params, gpus, progress)
            m = ctx.target.after_trial(ctx.repo, ctx.run.id, trial.number, m, is_baseline=is_baseline)
    cut = m.outcome is Outcome.TIMEOUT and (ctx.stop.is_set() or time.time() >= ctx.deadline.trials_end - 0.5)
    if cut:
        m.reason = (
            "stopped when the search was interrupted" if ctx.stop.is_set() else "stopped at the search's deadline"
        ) + f" after {time.time() - t0:.1f}s"
    m.duration_s = m.duration_s or (time.time() - t0)
    return _record(
        ctx,
        trial,
        params,
        m,
        progress,
        is_baseline=is_baseline,
        repeat_of=repeat_of,
        cut_by_deadline=cut,
        turned_away=turned_away,
    )


def _run_isolated(
    ctx: SearchContext,
    trial: optuna.Trial,
    params: dict[str, Any],
    gpus: list[int] | None,
    progress: Progress | None = None,
) -> Measurement:
    hard_end = ctx.deadline.trials_end
    per_trial = ctx.options.trial_timeout_s or ctx.target.config.trial_timeout_s
    if per_trial <= 0:
        # the baseline is often the slowest configuration of all, and every ratio needs it: give it more room
        share = 0.5 if trial.user_attrs.get(BASELINE_ATTR) else 0.25
        per_trial = max(60.0 if share == 0.5 else 30.0, share * ctx.deadline.budget_s)
    deadline = min(hard_end, time.time() + per_trial)
    hw = ctx.hardware
    # the baseline (every ratio's reference) and a confirmation re-run (the winner's median) are measured whole
    prunable = not (trial.user_attrs.get(BASELINE_ATTR) or trial.user_attrs.get(CONFIRM_ATTR) is not None)
    settings = ctx.options.settings
    incumbent = None
    if prunable and ctx.resolved.space.objective.is_goodput and ctx.best is not None:
        settings = {**settings, "incumbent_value": ctx.best.value}  # a goodput trial checks its boundary first
        incumbent = ctx.best.number
    settings = {
        **settings,
        **ctx.target.trial_settings(
            ctx.repo, ctx.run.id, incumbent=incumbent, is_baseline=bool(trial.user_attrs.get(BASELINE_ATTR))
        ),
    }
    job = TrialJob(
        target=ctx.target.name,
        space_yaml=ctx.space_yaml,
        space_source=ctx.resolved.space.source,
        params=params,
        deadline=deadline,
        settings=settings,
        hardware=hw.to_json(),
        gpus=gpus,
    )

    def reporter(step: int, value: float) -> bool:
        trial.report(value, step)
        return prunable and trial.should_prune()

    if ctx.target.persistent_worker:
        worker = persistent_worker(gpus)
        if trial.user_attrs.get(BASELINE_ATTR) and ctx.baseline_runs > 1 and not worker.alive():
            job = _warm_up(ctx, worker, job, per_trial, progress)
        proc = worker.start(job, reporter)
    else:
        proc = TrialProcess(job, reporter)
    ctx.current = proc
    try:
        return proc.wait()
    finally:
        ctx.current = None


SLOW_WARM_UP_S = 20.0
"""A warm-up run this long is said to the user: it is budget no trial had."""


def _warm_up(ctx: SearchContext, worker, job: TrialJob, per_trial: float, progress: Progress | None = None) -> TrialJob:
    """Run ``job`` (the baseline) once untimed in a fresh persistent ``worker``: its first trial pays for what a
    process does once (allocations, first calls), and the baseline, every ratio's reference, is timed warm. Returns
    the job with its deadline moved past the warm-up's time. A slow one is said in one line: on an H200 with a cold
    cache it took 191 s of a 7-minute budget (SGLang's and DeepGEMM's JIT builds), and the search showed nothing."""
    t0 = time.time()
    proc = worker.start(job)
    ctx.current = proc
    try:
        m = proc.wait()
    finally:
        ctx.current = None
    took = time.time() - t0
    _logger.info("warm-up run of the baseline's configuration (not timed): %s in %.1f s", m.outcome.value, took)
    if progress is not None and took >= SLOW_WARM_UP_S:
        progress.message(
            f"the baseline's warm-up run (not timed) took {took:.0f} s of the budget: on a fresh machine mostly the "
            "kernels' first builds (Triton, and SGLang's and DeepGEMM's JIT where they run), which later searches "
            "here reuse from their caches"
        )
    end = time.time() if ctx.stop.is_set() else min(ctx.deadline.trials_end, time.time() + per_trial)
    return dataclasses.replace(job, deadline=end)


def _record(
    ctx: SearchContext,
    trial: optuna.Trial,
    params: dict[str, Any],
    m: Measurement,
    progress: Progress | None,
    *,
    is_baseline: bool,
    repeat_of: int | None,
    cut_by_deadline: bool = False,
    turned_away: int = 0,
) -> TrialSummary:
    space = ctx.resolved.space
    constraints = _level_constraints(space, m)
    gates = [_own_constraint(m, name) for name in ctx.target.constraint_names()]
    if m.outcome is Outcome.OK and m.value is not None and math.isfinite(m.value):
        set_constraints(trial, constraints + gates or [0.0])
        state, values = optuna.trial.TrialState.COMPLETE, told(ctx, m.value, m)
    elif m.outcome is Outcome.PRUNED:
        state, values = optuna.trial.TrialState.PRUNED, None
    elif m.outcome is Outcome.TIMEOUT and cut_by_deadline:
        # the search ended under it: says nothing about the configuration, so Optuna is not taught it is bad
        state, values = optuna.trial.TrialState.FAIL, None
    else:
        if m.outcome is Outcome.OK:  # ok but no finite value: treat as a crash of the measurement
            m.outcome, m.reason = Outcome.CRASH, m.reason or "the trial reported no finite objective value"
        # a failed trial is infeasible: a target's own check it failed (wrong_result) says by how much
        set_constraints(trial, [1.0] * len(space.objective.constraints) + [g if g > 0 else 1.0 for g in gates] or [1.0])
        state, values = optuna.trial.TrialState.COMPLETE, told(ctx, penalty_value(ctx.direction))
    trial.set_user_attr("outcome", m.outcome.value)
    if repeat_of is not None:
        trial.set_user_attr("repeat_of", repeat_of)
    value = m.value if m.outcome is Outcome.OK else None
    ctx.repo.finish_trial(
        ctx.run.id,
        trial.number,
        outcome=m.outcome.value,
        value=value,
        reason=m.reason,
        log_excerpt=m.log,
        metrics=m.metrics,
        duration_s=m.duration_s,
        repeat_of=repeat_of,
    )
    if m.outcome is not Outcome.OK and repeat_of is None and not cut_by_deadline:
        ctx.target.remember_failure(ctx.repo, ctx.run.id, trial.number, params, m)
    try:
        ctx.study.tell(trial, values, state=state)
    except Exception:  # noqa: BLE001 - e.g. a heartbeat already failed it; the tuner_ tables still hold the truth
        _logger.exception("could not tell Optuna about trial %d", trial.number)
    summary = TrialSummary(
        trial.number,
        params,
        m.outcome.value,
        value,
        m.reason,
        m.duration_s,
        is_baseline,
        repeat_of,
        served_shortfall(m.metrics),
        turned_away,
    )
    ctx.trials.append(summary)
    ctx.counts[summary.outcome] = ctx.counts.get(summary.outcome, 0) + 1
    if not m.outside_signal:  # a kill from outside says nothing of the configuration: it may run again
        ctx.seen.setdefault(ctx.key_of(params), summary)
    base = ctx.baseline
    if (
        summary.outcome == "ok"
        and repeat_of is None
        and base is not None
        and ctx.key_of(params) == ctx.key_of(base.params)
    ):  # a baseline run moves its median: status reads it
        median = ctx.baseline_value
        if median is not None:
            ctx.repo.set_baseline(ctx.run.id, median)
    # a record, not a warning: a failed trial is data, and its own line (progress, `tuner status`) says why
    _logger.info("trial %d %s value=%s %s", trial.number, m.outcome.value, value, m.reason[:200])
    if progress:
        progress.trial_finished(summary, ctx)
    return summary


def _level_constraints(space, m: Measurement) -> list[float]:
    out = []
    for c in space.objective.constraints:
        v = m.metric(c.metric, c.level)
        out.append(1.0 if v is None else c.violation(v))
    return out


def _own_constraint(m: Measurement, name: str) -> float:
    """A target's own constraint (:meth:`~tuner.targets.base.Target.constraint_names`) as the trial stored it;
    violated when it stored none (the trial failed before that check)."""
    v = m.metric("constraint", name)
    return 1.0 if v is None or not math.isfinite(v) else float(v)
