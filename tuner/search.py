"""The search: an Optuna study in a real database, trials run for real in subprocesses, by a wall-clock deadline.

Flow (one way): load the space -> resolve it for this machine -> preflight the target -> create the schema and the
study once -> baseline first -> ask / check / run in a subprocess / store / tell, until the deadline -> re-run the
top few (when time allows) -> export the best. The last share of the time for trials goes to one-change moves
from the best so far (``tuner.refine``). A failed trial is data: it is stored with its outcome class and told
to Optuna as a bad, infeasible result, so the sampler learns; the search never dies of one.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from search_spaces import Hardware, ResolvedSpace, SpaceError, detect_hardware, load_space, resolve
from storage import Repo, StorageError
from storage.models import Run
from storage.names import check_study_name
from tuner import refine
from tuner.budget import Deadline
from tuner.fingerprint import fingerprint
from tuner.isolation import TrialJob, TrialProcess
from tuner.measurement import Measurement, Outcome
from tuner.sampling import REPEAT_MARK, is_repeat, params_key, suggest, suggestable
from tuner.targets import PreflightReport, Target, TargetError, get_target_class

_logger = logging.getLogger(__name__)

BASELINE_ATTR = "tuner_baseline"
CONFIRM_ATTR = "tuner_confirm_of"
MAX_REPEATS_IN_A_ROW = 25
_HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5; constraints_func before


class SearchError(RuntimeError):
    """The search cannot start (bad input, unreachable storage, study conflict). The message says the fix."""


@dataclass
class SearchOptions:
    budget_s: float
    storage_url: str = "sqlite:///tuner.db"
    study: str | None = None
    space_path: str | None = None
    """A YAML file or a built-in name; ``None`` picks ``dsv4_flash`` on a GPU and ``dsv4_flash_tiny`` on a CPU."""
    target: str | None = None
    resume: bool = False
    seed: int | None = None
    out_dir: str = "tuner-out"
    settings: dict[str, Any] = field(default_factory=dict)
    n_trials: int | None = None
    dry_run: bool = False
    confirm_top: int = 3
    refine_share: float = 0.25
    """Share of the time for trials spent last on one-change moves from the best so far (``tuner.refine``)."""
    export: bool = True
    trial_timeout_s: float | None = None
    hardware: Hardware | None = None
    workers: int = 1
    """Local worker threads, each running its trials in its own subprocess (see ``tuner.workers``)."""
    gpus: list[int] | None = None
    """GPU ids the local workers lease from (``None``: every visible GPU, or none on a CPU machine)."""


@dataclass
class TrialSummary:
    number: int
    params: dict[str, Any]
    outcome: str
    value: float | None
    reason: str = ""
    duration_s: float = 0.0
    is_baseline: bool = False


@dataclass
class SearchResult:
    study: str
    storage_url: str
    state: str
    trials: list[TrialSummary]
    baseline: TrialSummary | None
    best: TrialSummary | None
    best_params: dict[str, Any] | None
    best_value: float | None
    baseline_value: float | None
    export_dir: str | None
    preflight: PreflightReport
    elapsed_s: float
    stop_reason: str = ""

    @property
    def speedup(self) -> float | None:
        if self.best_value and self.baseline_value:
            return self.best_value / self.baseline_value
        return None


class Progress:
    """Receives what the search does; the CLI draws it, tests record it. Every method is optional."""

    def started(self, ctx: SearchContext) -> None: ...
    def trial_started(self, number: int, params: dict[str, Any]) -> None: ...
    def trial_finished(self, summary: TrialSummary, ctx: SearchContext) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class SearchContext:
    """Everything one search (or one worker) holds while it runs."""

    options: SearchOptions
    resolved: ResolvedSpace
    space_yaml: str
    target: Target
    repo: Repo
    study: optuna.Study
    run: Run
    deadline: Deadline
    hardware: Hardware
    counts: dict[str, int] = field(default_factory=dict)
    trials: list[TrialSummary] = field(default_factory=list)
    seen: dict[str, TrialSummary] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    current: TrialProcess | None = None

    @property
    def direction(self) -> str:
        return self.resolved.space.objective.direction

    def better(self, a: float, b: float) -> bool:
        return a > b if self.direction == "maximize" else a < b

    @property
    def baseline(self) -> TrialSummary | None:
        return next((t for t in self.trials if t.is_baseline and t.outcome == "ok"), None)

    @property
    def best(self) -> TrialSummary | None:
        best = None
        for t in self.trials:
            if t.outcome == "ok" and t.value is not None and (best is None or self.better(t.value, best.value)):
                best = t
        return best


# -- set-up ----------------------------------------------------------------------------------------------------
def default_space_path(hardware: Hardware) -> str:
    return "dsv4_flash" if hardware.gpu_count else "dsv4_flash_tiny"


def prepare(options: SearchOptions) -> tuple[ResolvedSpace, str, Target, PreflightReport, Hardware]:
    """Load, validate and resolve the space and build the target; nothing touches the storage yet."""
    hardware = options.hardware or detect_hardware()
    space_path = options.space_path or default_space_path(hardware)
    space = load_space(space_path)
    space_yaml = Path(space.source).read_text() if Path(space.source).exists() else ""
    target_name = options.target or space.target
    if options.target and options.target != space.target:
        raise SearchError(f"--target {options.target!r} does not match the space's target {space.target!r} "
                          f"({space.source}); pass a space written for {options.target!r}")
    resolved = resolve(space, hardware)
    try:
        target = get_target_class(target_name)(resolved, options.settings)
    except (TargetError, ValueError) as exc:
        raise SearchError(str(exc)) from None
    report = target.preflight()
    return resolved, space_yaml, target, report, hardware


def study_name_for(options: SearchOptions, resolved: ResolvedSpace) -> str:
    return options.study or f"{resolved.space.name}-{options.target or resolved.space.target}"


def _pick_study_name(options: SearchOptions, resolved: ResolvedSpace, repo: Repo) -> str:
    """A named study is used as named (a second search on it needs ``--resume``). Without a name, a new search gets
    the first free ``<space>-<target>[-N]`` and ``--resume`` continues the newest of them, so the same command
    can be run again."""
    base = study_name_for(options, resolved)
    if options.study:
        return base
    taken = {r.study_name: r for r in repo.list_runs()}
    ours = [base] + [f"{base}-{i}" for i in range(2, len(taken) + 3)]
    if options.resume:
        existing = [taken[n] for n in ours if n in taken]
        return max(existing, key=lambda r: r.started_at).study_name if existing else base
    return next(n for n in ours if n not in taken)


def open_optuna_storage(url: str, *, heartbeat: bool = False) -> optuna.storages.RDBStorage:
    from storage.engine import normalize_url

    kwargs: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
    if heartbeat:
        kwargs.update(heartbeat_interval=5, grace_period=20,
                      failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=1))
    try:
        return optuna.storages.RDBStorage(normalize_url(url), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any driver error means the same thing to the user
        raise StorageError(f"Optuna cannot open storage {url!r}: {str(exc).splitlines()[0]}") from None


def _check_out_dir(out_dir: str) -> None:
    p = Path(out_dir)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".tuner-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SearchError(f"output folder {out_dir!r} is not writable ({exc.strerror}); pass -o/--out DIR with "
                          "a folder you can write") from None


def open_context(options: SearchOptions, progress: Progress | None = None) -> SearchContext:
    """Create (or, with ``resume``, load) the run and its Optuna study. The only place schema is created."""
    resolved, space_yaml, target, report, hardware = prepare(options)
    if not report.ok:
        raise SearchError("preflight failed: " + "; ".join(report.errors))
    if options.export:
        _check_out_dir(options.out_dir)
    repo = Repo(options.storage_url)
    repo.create_schema()
    ostorage = open_optuna_storage(options.storage_url)
    name = check_study_name(_pick_study_name(options, resolved, repo))  # before Optuna creates anything
    space = resolved.space
    run = repo.get_run(name)
    env = fingerprint()
    deadline = Deadline.start_now(options.budget_s)
    parallel = options.workers > 1 or len(options.gpus or []) > 1
    sampler, pruner = make_sampler(resolved, options.seed, parallel=parallel), make_pruner()
    if run is not None and not options.resume:
        raise SearchError(f"study {name!r} already exists in {options.storage_url}; pass --resume to continue it "
                          "or --study NEW_NAME to start another")
    if run is None and options.resume:
        raise SearchError(f"--resume: no study {name!r} in {options.storage_url}; drop --resume to start it")
    settings = {**target.settings, "pid": os.getpid(), "host": socket.gethostname(),
                "hardware": hardware.to_json(), "out_dir": str(Path(options.out_dir).resolve()),
                "space_path": space.source}
    if run is None:
        study = optuna.create_study(study_name=name, storage=ostorage, direction=space.objective.direction,
                                    sampler=sampler, pruner=pruner, load_if_exists=False)
        study.set_user_attr("target", target.name)
        study.set_user_attr("space", space.name)
        _name_metric(study, space.objective)
        run = repo.create_run(name, target=target.name, budget_s=options.budget_s,
                              direction=space.objective.direction, objective=space.objective.describe(),
                              unit=space.objective.unit, space_name=space.name, space_yaml=space_yaml,
                              environment=env, settings=settings)
    else:
        study = optuna.load_study(study_name=name, storage=ostorage, sampler=sampler, pruner=pruner)
        stale = repo.mark_stale_running(run.id, reason="left running by an earlier process; marked on resume")
        for num in stale:
            _fail_stale_optuna_trial(study, num)
        repo.restart_run(run.id, budget_s=options.budget_s, environment=env)
        run = repo.get_run(name)
    ctx = SearchContext(options=options, resolved=resolved, space_yaml=space_yaml, target=target, repo=repo,
                        study=study, run=run, deadline=deadline, hardware=hardware)
    load_history(ctx)
    if ctx.baseline is None and not any(t.is_baseline for t in ctx.trials):
        defaults = resolved.defaults()
        study.enqueue_trial(suggestable(resolved, defaults), user_attrs={BASELINE_ATTR: True})
    return ctx


def _name_metric(study: optuna.Study, objective) -> None:
    """The objective's name for optuna-dashboard and Optuna's own plots (else they say "Objective 0")."""
    name = objective.describe() + (f" ({objective.unit})" if objective.unit else "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name])


def make_sampler(resolved: ResolvedSpace, seed: int | None, *,
                 parallel: bool = True) -> optuna.samplers.BaseSampler:
    """The sampler every process of a study uses: multivariate TPE grouped for conditional parameters, learning
    from failures through constraints; with several workers (``parallel``) a constant liar keeps them apart (it
    costs about a third more sampling time, so a single worker goes without)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=parallel,
        n_startup_trials=max(5, min(10, len(resolved.params) + 2)),
        **({} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_of}),
    )


def make_pruner() -> optuna.pruners.BasePruner:
    # keep the top 90% at each level: prune only a clearly bad trial, after the first level (c=1 says little)
    return optuna.pruners.PercentilePruner(90.0, n_startup_trials=5, n_warmup_steps=1)


def _fail_stale_optuna_trial(study: optuna.Study, number: int) -> None:
    for ft in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if ft.number == number:
            try:
                study._storage.set_trial_state_values(ft._trial_id, optuna.trial.TrialState.FAIL)
            except Exception:  # noqa: BLE001 - another process may have finished it meanwhile
                _logger.warning("could not fail stale trial %d", number)


def load_history(ctx: SearchContext) -> None:
    for rec in ctx.repo.list_trials(ctx.run.id):
        if rec.state == "running":
            continue
        s = TrialSummary(rec.number, rec.params, rec.outcome or "crash", rec.value, rec.reason,
                         rec.duration_s or 0.0, rec.is_baseline)
        ctx.trials.append(s)
        ctx.counts[s.outcome] = ctx.counts.get(s.outcome, 0) + 1
        ctx.seen.setdefault(params_key(rec.params), s)


def _constraints_of(frozen: optuna.trial.FrozenTrial) -> list[float]:
    return list(frozen.user_attrs.get("constraints", [0.0]))


def _set_constraints(trial: optuna.Trial, values: list[float]) -> None:
    """Feasibility for the sampler: every value <= 0 is feasible. Kept in user attrs for the API as well."""
    trial.set_user_attr("constraints", values)
    if _HAS_SET_CONSTRAINT:
        for i, v in enumerate(values):
            trial.set_constraint(f"c{i}", v)


# -- one trial -------------------------------------------------------------------------------------------------
def penalty_value(direction: str) -> float:
    """What a failed trial is told as: worse than any real result, so TPE puts it in the bad group."""
    return 0.0 if direction == "maximize" else 1e30


def run_one(ctx: SearchContext, trial: optuna.Trial, progress: Progress | None, *, gpus: list[int] | None = None,
            worker: str = "") -> TrialSummary:
    """Sample, check, run (in a subprocess), store and tell one trial. Never raises for the trial's failure."""
    resolved = ctx.resolved
    params = suggest(trial, resolved)
    is_baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
    confirm_of = trial.user_attrs.get(CONFIRM_ATTR)
    ctx.repo.start_trial(ctx.run.id, trial.number, params, worker=worker or socket.gethostname(),
                         is_baseline=is_baseline)
    if progress:
        progress.trial_started(trial.number, params)
    key = params_key(params)
    earlier = ctx.seen.get(key)
    t0 = time.time()
    if earlier is not None and confirm_of is None and not is_baseline:
        m = Measurement(outcome=Outcome(earlier.outcome), value=earlier.value,
                        reason=f"same configuration as trial {earlier.number}: {REPEAT_MARK} "
                               f"({earlier.outcome}{'' if earlier.reason == '' else ': ' + earlier.reason[:200]})")
        repeated = True
    else:
        repeated = False
        reason = ctx.target.check(params)
        if reason:
            m = Measurement.failed(Outcome.INVALID_CONFIG, reason)
            _logger.info("trial %d refused before running: %s", trial.number, reason)
        else:
            m = _run_isolated(ctx, trial, params, gpus)
    cut = m.outcome is Outcome.TIMEOUT and (ctx.stop.is_set() or time.time() >= ctx.deadline.trials_end - 0.5)
    if cut:
        m.reason = ("stopped when the search was interrupted" if ctx.stop.is_set()
                    else "stopped at the search's deadline") + f" after {time.time() - t0:.1f}s"
    m.duration_s = m.duration_s or (time.time() - t0)
    return _record(ctx, trial, params, m, progress, is_baseline=is_baseline, repeated=repeated,
                   cut_by_deadline=cut)


def _run_isolated(ctx: SearchContext, trial: optuna.Trial, params: dict[str, Any], gpus: list[int] | None
                  ) -> Measurement:
    hard_end = ctx.deadline.trials_end
    per_trial = ctx.options.trial_timeout_s or float(ctx.target.settings.get("trial_timeout_s", 0) or 0)
    if per_trial <= 0:
        # the baseline is often the slowest configuration of all, and every ratio needs it: give it more room
        share = 0.5 if trial.user_attrs.get(BASELINE_ATTR) else 0.25
        per_trial = max(60.0 if share == 0.5 else 30.0, share * ctx.deadline.budget_s)
    deadline = min(hard_end, time.time() + per_trial)
    hw = ctx.hardware
    job = TrialJob(target=ctx.target.name, space_yaml=ctx.space_yaml, space_source=ctx.resolved.space.source,
                   params=params, deadline=deadline, settings=ctx.options.settings,
                   hardware=hw.to_json(), gpus=gpus)

    # the baseline (every ratio's reference) and a confirmation re-run (the winner's median) are measured whole
    prunable = not (trial.user_attrs.get(BASELINE_ATTR) or trial.user_attrs.get(CONFIRM_ATTR) is not None)

    def reporter(step: int, value: float) -> bool:
        trial.report(value, step)
        return prunable and trial.should_prune()

    if ctx.target.persistent_worker:
        from tuner.persistent_worker import persistent_worker

        proc = persistent_worker(gpus).start(job, reporter)
    else:
        proc = TrialProcess(job, reporter)
    ctx.current = proc
    try:
        return proc.wait()
    finally:
        ctx.current = None


def _record(ctx: SearchContext, trial: optuna.Trial, params: dict[str, Any], m: Measurement,
            progress: Progress | None, *, is_baseline: bool, repeated: bool, cut_by_deadline: bool = False
            ) -> TrialSummary:
    space = ctx.resolved.space
    constraints = _level_constraints(space, m)
    if m.outcome is Outcome.OK and m.value is not None and math.isfinite(m.value):
        _set_constraints(trial, constraints or [0.0])
        state, values = optuna.trial.TrialState.COMPLETE, m.value
    elif m.outcome is Outcome.PRUNED:
        state, values = optuna.trial.TrialState.PRUNED, None
    elif m.outcome is Outcome.TIMEOUT and cut_by_deadline:
        # the search ended under it: says nothing about the configuration, so Optuna is not taught it is bad
        state, values = optuna.trial.TrialState.FAIL, None
    else:
        if m.outcome is Outcome.OK:  # ok but no finite value: treat as a crash of the measurement
            m.outcome, m.reason = Outcome.CRASH, m.reason or "the trial reported no finite objective value"
        _set_constraints(trial, [1.0] * max(1, len(space.objective.constraints)))
        state, values = optuna.trial.TrialState.COMPLETE, penalty_value(ctx.direction)
    trial.set_user_attr("outcome", m.outcome.value)
    if repeated:
        trial.set_user_attr("repeat", True)
    value = m.value if m.outcome is Outcome.OK else None
    ctx.repo.finish_trial(ctx.run.id, trial.number, outcome=m.outcome.value, value=value, reason=m.reason,
                          log_excerpt=m.log, metrics=m.metrics, duration_s=m.duration_s)
    try:
        ctx.study.tell(trial, values, state=state)
    except Exception:  # noqa: BLE001 - e.g. a heartbeat already failed it; the tuner_ tables still hold the truth
        _logger.exception("could not tell Optuna about trial %d", trial.number)
    summary = TrialSummary(trial.number, params, m.outcome.value, value, m.reason, m.duration_s, is_baseline)
    ctx.trials.append(summary)
    ctx.counts[summary.outcome] = ctx.counts.get(summary.outcome, 0) + 1
    ctx.seen.setdefault(params_key(params), summary)
    level = logging.INFO if m.outcome in (Outcome.OK, Outcome.PRUNED) else logging.WARNING
    _logger.log(level, "trial %d %s value=%s %s", trial.number, m.outcome.value, value, m.reason[:200])
    if progress:
        progress.trial_finished(summary, ctx)
    return summary


def _level_constraints(space, m: Measurement) -> list[float]:
    out = []
    for c in space.objective.constraints:
        v = m.metric(c.metric, c.level)
        out.append(1.0 if v is None else c.violation(v))
    return out


# -- the loop --------------------------------------------------------------------------------------------------
def run_search(options: SearchOptions, progress: Progress | None = None) -> SearchResult:
    """Run a whole search: set up, trials until the deadline, confirm the top few, export. See module docstring."""
    from tuner.kernel_search import is_kernel_plan, run_kernel_search

    if is_kernel_plan(options):  # one sub-study per kernel x shape; see tuner.kernel_search
        return run_kernel_search(options, progress)
    if options.dry_run:
        resolved, _, target, report, _ = prepare(options)
        return SearchResult(study_name_for(options, resolved), options.storage_url, "dry_run", [], None, None,
                            None, None, None, None, report, 0.0)
    ctx = open_context(options, progress)
    if progress:
        progress.started(ctx)
    state = "finished"
    prev_handler = _install_sigint(ctx)
    _maybe_kernel_phase(ctx, progress)
    try:
        if options.workers > 1 or options.gpus:
            from tuner.workers import run_parallel

            run_parallel(ctx, progress)
        else:
            _loop(ctx, progress)
        if not ctx.stop.is_set():
            confirm_top(ctx, progress)
        if ctx.stop.is_set():
            state = "interrupted"
    except KeyboardInterrupt:
        state = "interrupted"
        ctx.stop_reason = ctx.stop_reason or "interrupted (Ctrl-C)"
    finally:
        _restore_sigint(prev_handler)
    export_dir = None
    best = pick_best(ctx)
    if best is not None:  # status, best, the API and the export all report the confirmed choice
        ctx.repo.set_best(ctx.run.id, best.number, best.value)
    if options.export and best is not None:
        from tuner.export import export_run

        try:
            export_dir = str(export_run(ctx.repo, ctx.run.study_name, options.out_dir, target=ctx.target))
        except Exception as exc:  # noqa: BLE001 - the trials are stored; say what failed
            _logger.error("export failed: %s", exc)
            if progress:
                progress.message(f"export failed: {exc}")
    ctx.repo.end_run(ctx.run.id, state, export_dir=export_dir)
    if ctx.target.persistent_worker:
        from tuner.persistent_worker import close_workers

        close_workers()
    baseline = ctx.baseline
    return SearchResult(ctx.run.study_name, options.storage_url, state, ctx.trials, baseline, best,
                        best.params if best else None, best.value if best else None,
                        baseline.value if baseline else None, export_dir, ctx.target.preflight(),
                        ctx.deadline.elapsed(), ctx.stop_reason)


def _maybe_kernel_phase(ctx: SearchContext, progress: Progress | None) -> None:
    """With ``--set kernel_phase=true`` on a GPU, tune the kernels for exactly the shapes this space's
    configurations produce before the first trial, from a share of the budget (``kernel_phase_share``, 0.2)."""
    shapes_of = getattr(ctx.target, "kernel_shapes", None)
    if not (ctx.target.settings.get("kernel_phase") and shapes_of and "triton" in ctx.hardware.capabilities):
        return
    shapes = shapes_of()
    if not shapes:
        if progress:
            progress.message("kernel phase: this space names no kernel shape to tune (for SGLang: setting `moe`)")
        return
    from tuner.kernel_search import kernel_phase

    share = float(ctx.target.settings.get("kernel_phase_share", 0.2))
    res = kernel_phase(ctx, shapes, budget_s=share * ctx.deadline.remaining_for_trials(), progress=progress)
    use = getattr(ctx.target, "use_kernel_configs", None)
    if use and res.config_dir:
        # settings for every later trial (their workers rebuild the target from them) and for the export
        added = use(res.config_dir)
        ctx.options.settings.update(added)
        ctx.target.settings.update(added)
    if progress:
        for line in res.summary_lines():
            progress.message(line)


def _loop(ctx: SearchContext, progress: Progress | None) -> None:
    repeats_in_a_row = 0
    failures_in_a_row = 0
    started = len(ctx.trials)
    while not ctx.stop.is_set():
        if ctx.options.n_trials is not None and len(ctx.trials) - started >= ctx.options.n_trials:
            ctx.stop_reason = f"{ctx.options.n_trials} trials done"
            return
        reserve = _confirm_reserve(ctx)
        if ctx.deadline.remaining_for_trials() <= 1.0 + reserve:
            ctx.stop_reason = "budget used"
            return
        # the last share, or TPE re-proposed a timed configuration: a move from the best, enqueued right before the
        # ask that takes it (a move left waiting would be taken by the confirmation's ask instead)
        if repeats_in_a_row or refine.in_window(ctx, reserve, len(ctx.trials) - started):
            refine.enqueue_next(ctx, progress)
        trial = ctx.study.ask()
        summary = run_one(ctx, trial, progress)
        repeats_in_a_row = repeats_in_a_row + 1 if is_repeat(summary.reason) else 0
        failures_in_a_row = failures_in_a_row + 1 if summary.outcome not in ("ok", "pruned") else 0
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            ctx.stop_reason = f"search space exhausted: {repeats_in_a_row} repeated configurations in a row"
            return
        if failures_in_a_row and failures_in_a_row % 10 == 0 and progress:
            progress.message(f"{failures_in_a_row} failed trials in a row: see `tuner status` for their reasons")


def _confirm_reserve(ctx: SearchContext) -> float:
    """Time kept back at the end to re-run the top configurations and one that may overtake them (none until there
    is something to confirm)."""
    ok = [t.duration_s for t in ctx.trials if t.outcome == "ok" and not is_repeat(t.reason)]
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
    mean_dur = statistics.median(t.duration_s for t in ok if not is_repeat(t.reason)) or 1.0

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
        if t.outcome == "ok" and t.value is not None and not is_repeat(t.reason):
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


__all__ = ["SearchContext", "SearchError", "SearchOptions", "SearchResult", "SpaceError", "StorageError",
           "TrialSummary", "open_context", "run_one", "run_search"]
