"""The search: an Optuna study in a real database, trials run for real in subprocesses, by a wall-clock deadline.

Flow (one way): load the space -> resolve it for this machine -> preflight the target -> create the schema and the
study once -> baseline first -> ask / check / run in a subprocess / store / tell, stage after stage
(``tuner.search.stages``: the command's values first, then the code changes) until the deadline or the last stage
converges -> re-run the top few (when time allows) -> export the best. The last share of the time for trials goes to one-change moves
from the best so far (``tuner.search.refine``). A failed trial is data: it is stored with its outcome class and told
to Optuna as a bad, infeasible result, so the sampler learns; the search never dies of one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from tuner.budget import format_seconds
from tuner.execution.persistent import close_workers
from tuner.export.script import export_run, nothing_met_the_slo
from tuner.measurement import Outcome
from tuner.processes import json_output
from tuner.search.confirm import SIDE_BY_SIDE_RUNS, confirm_top, planned_line
from tuner.search.context import (
    CONFIRM_ATTR,
    Progress,
    SearchContext,
    SearchOptions,
    SearchResult,
    TrialSummary,
    open_context,
    prepare,
    study_name_for,
)
from tuner.search.kernel_search import is_kernel_plan, kernel_phase, run_kernel_search
from tuner.search.loop import sequential_loop
from tuner.search.parallel import run_parallel
from tuner.search.sampling import suggestable
from tuner.search.stages import StagePlan, convergence_line
from tuner.search.stages import plan as plan_stages
from tuner.search.trial import run_one
from tuner.search.winner import decide_for_search

_logger = logging.getLogger(__name__)


def run_search(options: SearchOptions, progress: Progress | None = None) -> SearchResult:
    """Run a whole search: set up, trials until the deadline, confirm the top few, export. See module docstring."""

    if is_kernel_plan(options):  # one sub-study per kernel x shape; see tuner.search.kernel_search
        return run_kernel_search(options, progress)
    if options.dry_run:
        resolved, _, target, report, _ = prepare(options)
        report.plan(options.budget_s)
        report.facts["confirmation"] = planned_line(
            options.confirm_top, options.n_trials, options.budget_s, report.trial_s
        )
        planned = StagePlan(
            plan_stages(resolved, deployable_only=bool(options.settings.get("deployable_only"))),
            stretch=options.converge_after,
            n_trials=options.n_trials,
        )
        for i, line in enumerate(planned.planned_lines(options.budget_s if options.n_trials is None else None)):
            report.facts[f"stage {i + 1}"] = line.split(" ", 2)[2]
        report.facts["convergence"] = convergence_line(options.converge_after, options.n_trials)
        keep = plugin_keep_s(options.budget_s, options.n_trials, target, resolved)
        if keep:
            report.facts["plug-in phase"] = (
                f"the trials end {keep:.0f} s early: the SGLang plug-in's kernels are then timed beside SGLang's own "
                "at the best's shapes, inside the budget"
            )
        return SearchResult(
            study_name_for(options, resolved),
            options.storage_url,
            "dry_run",
            [],
            None,
            None,
            None,
            None,
            None,
            None,
            report,
            0.0,
        )
    ctx = open_context(options, progress)
    _keep_time_for_plugin(ctx)
    if progress:
        progress.started(ctx)
    state = "finished"
    prev_handler = _install_sigint(ctx)
    _maybe_kernel_phase(ctx, progress)
    try:
        if options.workers > 1 or options.gpus:
            run_parallel(ctx, progress)
        else:
            sequential_loop(ctx, progress)
        if not ctx.stop.is_set():
            _side_by_side(ctx, progress)
            confirm_top(ctx, progress)
            _plugin_phase(ctx, progress)
        if ctx.failed.is_set():
            state = "failed"
        elif ctx.stop.is_set():
            state = "interrupted"
    except KeyboardInterrupt:
        state = "interrupted"
        ctx.stop_reason = ctx.stop_reason or "interrupted (Ctrl-C)"
    finally:
        _restore_sigint(prev_handler)
    export_dir = None
    decision = decide_for_search(ctx)  # the winner, the baseline and why: tuner.search.winner
    best, base, note, parsimony = decision.best, decision.baseline, decision.note, decision.parsimony
    if note:  # the result carries it: the CLI prints it once, after the search
        _logger.info("%s", note)
    if parsimony is not None and parsimony.switched:
        _logger.info("%s", parsimony.reason())
        if progress:
            progress.message(parsimony.reason())
    if base is not None:  # every "x baseline" (status, best, the API, the export) uses the baseline's median
        ctx.repo.set_baseline(ctx.run.id, base.value)
    if best is not None:  # status, best, the API and the export all report the decided choice
        ctx.repo.set_best(ctx.run.id, best.number, best.value)
    infeasible = ""
    if best is not None and ctx.resolved.space.objective.is_goodput:
        rec = ctx.repo.get_trial(ctx.run.id, best.number)
        infeasible = (
            nothing_met_the_slo(
                ctx.run, rec, f"nothing exported; all {len(ctx.trials)} trials are stored (`tuner status`)"
            )
            if rec is not None
            else ""
        )
    if options.export and best is not None and not infeasible:
        try:
            export_dir = str(
                export_run(
                    ctx.repo, ctx.run.study_name, options.out_dir, target=ctx.target, note=note, parsimony=parsimony
                )
            )
        except Exception as exc:  # noqa: BLE001 - the trials are stored; say what failed
            _logger.error("export failed: %s", exc)
            if progress:
                progress.message(f"export failed: {exc}")
    if ctx.stages is not None and ctx.stages.done and state == "finished":
        left = max(0.0, options.budget_s - ctx.deadline.elapsed())
        ctx.stop_reason = (
            f"{ctx.stages.converged_line}; ended early with {format_seconds(left)} of the "
            f"{format_seconds(options.budget_s)} budget left"
        )
    ctx.repo.end_run(ctx.run.id, state, export_dir=export_dir, reason=ctx.stop_reason or "")
    if ctx.target.persistent_worker:
        close_workers()
    return SearchResult(
        ctx.run.study_name,
        options.storage_url,
        state,
        ctx.trials,
        ctx.baseline,
        TrialSummary(best.number, best.params, "ok", best.value, "", 0.0, best.is_baseline) if best else None,
        best.params if best else None,
        best.value if best else None,
        base.value if base else None,
        export_dir,
        ctx.target.preflight(),
        ctx.deadline.elapsed(),
        ctx.stop_reason,
        best_runs=best.runs if best else [],
        best_spread=best.spread if best else 0.0,
        baseline_runs=base.runs if base else [],
        note=note,
        infeasible=infeasible,
        budget_s=ctx.deadline.budget_s,
    )


PLUGIN_TIMEOUT_S = 300.0
"""The most one side-by-side measurement of the plug-in's kernels may take (SGLang's JIT builds on its first run)."""
PLUGIN_KEEP_S = 90.0
"""Seconds the trials leave, per plug-in measurement, for the plug-in phase to run inside the budget (at most
:data:`PLUGIN_KEEP_SHARE` of it); a phase that takes less ends the search that much before its budget."""
PLUGIN_KEEP_SHARE = 0.1
PLUGIN_MIN_S = 20.0
"""Less time than this left before the export: the plug-in phase is skipped, with a line saying so."""


def _keep_time_for_plugin(ctx: SearchContext) -> None:
    """Where this search will time an SGLang plug-in after its trials (the target measures one for its defaults'
    deployment), end the trials early enough for it: a ``--budget`` is the search's whole time, not its trials'."""
    keep = plugin_keep_s(ctx.options.budget_s, ctx.options.n_trials, ctx.target, ctx.resolved)
    if keep:
        ctx.deadline = ctx.deadline.keep(keep)


def plugin_keep_s(budget_s: float | None, n_trials: int | None, target, resolved) -> float:
    """Seconds a search's trials end early for its plug-in phase (``tuner worker`` processes of the study end theirs
    then too, so that the phase's timings share the GPUs with no trial)."""
    if n_trials is not None or not budget_s:
        return 0.0
    cases = target.plugin_measurements(resolved.defaults())
    return min(PLUGIN_KEEP_S * len(cases), PLUGIN_KEEP_SHARE * budget_s) if cases else 0.0


def _plugin_phase(ctx: SearchContext, progress: Progress | None) -> None:
    """After the trials, on the GPU the search ran on: the SGLang plug-in's kernels timed beside SGLang's own at the
    shapes the best's deployment runs (:meth:`Target.plugin_measurements`, in a child process), the records kept in
    the study, where the export ships only the faster ones. A failed measurement is a line, never the search's end."""
    from tuner.export.sglang_plugin import SideBySide, store_records
    from tuner.fingerprint import git_sha

    best = ctx.best
    cases = ctx.target.plugin_measurements(best.params) if best is not None else []
    if not cases:
        return
    env = dict(os.environ)
    if ctx.options.gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(ctx.options.gpus[0])
    commit = os.environ.get("TUNER_COMMIT") or git_sha() or ""
    records: list[SideBySide] = []
    started = time.time()
    for args in cases:
        left = ctx.deadline.remaining_before_export()
        if left < PLUGIN_MIN_S:
            line = (
                f"the plug-in's side by side was not run: {max(0.0, left):.0f} s of the budget left before the "
                f"export (it needs up to {PLUGIN_TIMEOUT_S:.0f} s); the export ships no plug-in kernel; a longer "
                "--budget runs it"
            )
            _logger.warning("%s", line)
            if progress:
                progress.message(line)
            break
        if progress:
            progress.message("timing the SGLang plug-in's kernels beside SGLang's own at the deployment's shapes")
        argv = [sys.executable, "-m", "tuner.export.sglang_plugin_measure", *args, "--commit", commit]
        t0 = time.time()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=min(PLUGIN_TIMEOUT_S, left), env=env)
            got = json_output(done, "the measurement")
            records += [SideBySide.from_dict(dict(r, source="search")) for r in got["records"]]
            _logger.info("the plug-in's side by side took %.1f s", time.time() - t0)
        except (subprocess.TimeoutExpired, ValueError, KeyError) as exc:
            _logger.warning("the plug-in's side by side failed (%s); the export ships no plug-in kernel for it", exc)
            if progress:
                progress.message(f"the plug-in's side by side failed: {exc}")
    if records:
        store_records(ctx.repo, ctx.run.study_name, records, "search")
        if progress:  # what the phase took beside what the trials left it: the keep is a guess until measured
            progress.message(
                f"the plug-in's side by side took {time.time() - started:.0f} s "
                f"({ctx.deadline.kept_s:.0f} s kept for it): {len(records)} record(s)"
            )


def _side_by_side(ctx: SearchContext, progress: Progress | None, runs: int = SIDE_BY_SIDE_RUNS) -> None:
    """Before the confirmation round, run what the target asks to see beside the best so far
    (:meth:`Target.side_by_side`; the workload twin: the exported command's configuration) ``runs`` times, each
    measured whole, while time allows; the confirmation round then re-runs the best beside them."""
    best = ctx.best
    if best is None or ctx.options.n_trials is not None:
        return
    durations = [t.duration_s for t in ctx.trials if t.outcome == "ok" and t.repeat_of is None]
    need = 1.5 * (sorted(durations)[len(durations) // 2] if durations else 1.0)
    for label, params in ctx.target.side_by_side(best.params):
        for _ in range(runs):
            if ctx.stop.is_set() or ctx.deadline.remaining_for_trials() < need:
                return
            ctx.study.enqueue_trial(suggestable(ctx.resolved, params), user_attrs={CONFIRM_ATTR: -1})
            if progress:
                progress.message(f"measuring {label} beside the best (trial {best.number})")
            run_one(ctx, ctx.study.ask(), progress)


def _maybe_kernel_phase(ctx: SearchContext, progress: Progress | None) -> None:
    """With ``--set kernel_phase=true`` on a GPU, tune the kernels for exactly the shapes this space's
    configurations produce before the first trial, from a share of the budget (``kernel_phase_share``, 0.2)."""
    if not (ctx.target.config.kernel_phase and "triton" in ctx.hardware.capabilities):
        return
    shapes = ctx.target.kernel_shapes()
    if not shapes:
        if progress:
            progress.message("kernel phase: this space names no kernel shape to tune (for SGLang: setting `moe`)")
        return
    share = ctx.target.config.kernel_phase_share
    res = kernel_phase(ctx, shapes, budget_s=share * ctx.deadline.remaining_for_trials(), progress=progress)
    added = ctx.target.use_kernel_configs(res.config_dir) if res.config_dir else {}
    if added:
        # every later trial's worker rebuilds the target from the options' settings, and so does the export
        ctx.options = dataclasses.replace(ctx.options, settings={**ctx.options.settings, **added})
        ctx.target = type(ctx.target)(ctx.resolved, ctx.options.settings)
    if progress:
        for line in res.summary_lines():
            progress.message(line)


def _install_sigint(ctx: SearchContext):
    """First Ctrl-C (or SIGINT from the API): stop the running trial, end cleanly, export. Second: the default."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if ctx.stop.is_set():
            raise KeyboardInterrupt
        ctx.stop.set()
        ctx.stop_reason = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "stopped (SIGTERM)"
        if ctx.current is not None:
            ctx.current.kill(Outcome.TIMEOUT)

    prev = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return prev


def _restore_sigint(prev) -> None:
    if prev is not None:
        signal.signal(signal.SIGINT, prev[0])
        signal.signal(signal.SIGTERM, prev[1])
