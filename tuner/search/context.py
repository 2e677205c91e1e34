"""The state one search (or one worker) holds, and opening or resuming its study.

``open_context`` is the only place the schema and the Optuna study are created. The options
(``tuner.search.options``), the result types (``tuner.search.results``) and the sampler (``tuner.search.sampling``)
live in their own modules; their names are importable from here too, as callers have long done."""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from search_spaces import (
    Hardware,
    ResolvedSpace,
    detect_hardware,
    load_space,
    resolve,
)
from search_spaces.loader import space_text
from storage import Repo, StorageError
from storage.models import Run
from storage.names import check_study_name
from tuner.budget import Deadline
from tuner.errors import SearchError, TargetError
from tuner.execution.isolation import TrialProcess
from tuner.fingerprint import fingerprint
from tuner.search.local_trials import cached
from tuner.search.options import SearchOptions
from tuner.search.results import SearchResult, TrialSummary
from tuner.search.sampling import (
    TURNED_AWAY_ATTR,
    make_pruner,
    make_sampler,
    params_key,
    set_constraints,
    suggestable,
)
from tuner.search.stages import StagePlan
from tuner.search.stages import plan as plan_stages
from tuner.search.winner import Measured, baseline_of, group_runs
from tuner.targets import PreflightReport, Target, get_target_class

_logger = logging.getLogger(__name__)

BASELINE_ATTR = "tuner_baseline"
CONFIRM_ATTR = "tuner_confirm_of"
MAX_REPEATS_IN_A_ROW = 25


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
    failed: threading.Event = field(default_factory=threading.Event)
    """Set (with ``stop``) when the search gave up early (``tuner.search.failfast``); shared by its workers."""
    stop_reason: str = ""
    current: TrialProcess | None = None
    stored: dict[int, Any] = field(default_factory=dict)
    """The stored trial records refining reads (``tuner.search.refine.stored_trials``), by number, indexed for the
    moves (``tuner.search.refine.StoredTrials``)."""
    stages: StagePlan | None = None
    """The search's stages (``tuner.search.stages``), shared by its worker threads; None: one stage, no
    convergence (a ``tuner worker`` process, a kernel sub-study)."""
    _best_read: tuple = field(default=(None, 0, None, None), init=False, repr=False, compare=False)
    """What :attr:`best` read last: (the list, how many of its trials, the last of them, the best of them)."""
    _runs_read: tuple = field(default=(None, 0, None, None, None, None), init=False, repr=False, compare=False)
    """What :meth:`_baseline_group` read last: (the list, how many, the last, key order, runs by key, baseline keys)."""

    def space_for(self, user_attrs: dict[str, Any]) -> ResolvedSpace:
        """The space a trial with ``user_attrs`` samples from: the current stage's, except the baseline and the
        confirmation re-runs (always the whole space: they re-run configurations as they were)."""
        if self.stages is None or user_attrs.get(BASELINE_ATTR) or user_attrs.get(CONFIRM_ATTR) is not None:
            return self.resolved
        return self.stages.current.resolved

    @property
    def sampling_space(self) -> ResolvedSpace:
        """The current stage's space (the whole space without stages): what refining moves stay inside."""
        return self.stages.current.resolved if self.stages is not None else self.resolved

    def key_of(self, params: dict[str, Any]) -> str:
        """The identity of ``params`` for finding repeats: configurations the target runs as the same thing
        (``Target.canonical_params``) share one key, so the second is told the first's result and not run."""
        return params_key(self.target.canonical_params(params))

    @property
    def direction(self) -> str:
        return self.resolved.space.objective.direction

    def better(self, a: float, b: float) -> bool:
        return a > b if self.direction == "maximize" else a < b

    @property
    def baseline(self) -> TrialSummary | None:
        return next((t for t in self.trials if t.is_baseline and t.outcome == "ok"), None)

    @property
    def baseline_value(self) -> float | None:
        """The baseline configuration's median over its runs so far (:func:`tuner.search.winner.baseline_of`, the
        decision's own): the one figure every "x baseline" uses (the per-trial lines, the live panel, the final
        line, and the stored run that ``tuner status`` reads, kept equal to it after every baseline run)."""
        base = self._baseline_group()
        return base.median if base is not None else None

    @property
    def baseline_runs(self) -> int:
        """How many times the baseline is timed before the other trials (:attr:`CommonSettings.baseline_runs`)."""
        return self.target.config.baseline_runs or self.target.baseline_runs

    @property
    def baseline_spread(self) -> float | None:
        """The baseline's runs' spread so far ((max - min) / median), None before its first run."""
        base = self._baseline_group()
        return base.spread if base is not None else None

    @property
    def ratios_ready(self) -> bool:
        """True once the baseline was timed :attr:`baseline_runs` times: from then on "x baseline" is shown, on a
        figure whose spread is known. Until then (a run of it failed, say) the ratios wait; the re-run at the end
        (:func:`tuner.search.confirm.confirm_top`) times it again when it has fewer than two runs."""
        base = self._baseline_group()
        return base is not None and len(base.values) >= self.baseline_runs

    def _baseline_group(self) -> Measured | None:
        """``baseline_of(group_runs(self.trials, self.key_of))``, read on from where the last call stopped: each
        trial keyed once (the live panel and the per-trial line ask for the baseline's median and spread after every
        trial; grouping every trial again, a JSON key each, grew with the search)."""
        trials, (src, seen, last, order, runs, marked) = self.trials, self._runs_read
        if src is not trials or seen > len(trials) or (seen and trials[seen - 1] is not last):
            seen, order, runs, marked = 0, {}, {}, set()  # another list, or this one cleared and read again
        for t in trials[seen:]:
            if t.outcome == "ok" and t.value is not None and math.isfinite(t.value) and t.repeat_of is None:
                key = self.key_of(t.params)
                order.setdefault(key, len(order))
                runs.setdefault(key, []).append(t)
                if t.is_baseline:
                    marked.add(key)
            seen, last = seen + 1, t
        self._runs_read = (trials, seen, last, order, runs, marked)
        if not marked:
            return None
        return baseline_of(group_runs(runs[min(marked, key=order.__getitem__)], self.key_of))

    @property
    def best(self) -> TrialSummary | None:
        """The best ok trial so far (of equal values, the earlier), read on from where the last call stopped: the
        trials are appended to, and a goodput trial asks for it three times (it read every trial each time)."""
        trials, (src, seen, last, best) = self.trials, self._best_read
        if src is not trials or seen > len(trials) or (seen and trials[seen - 1] is not last):
            seen, best = 0, None  # another list, or this one cleared and read again: from its start
        for t in trials[seen:]:
            if t.outcome == "ok" and t.value is not None and (best is None or self.better(t.value, best.value)):
                best = t
            seen, last = seen + 1, t
        self._best_read = (trials, seen, last, best)
        return best


__all__ = [
    "BASELINE_ATTR",
    "CONFIRM_ATTR",
    "MAX_REPEATS_IN_A_ROW",
    "Progress",
    "SearchContext",
    "SearchOptions",
    "SearchResult",
    "TrialSummary",
    "load_history",
    "make_pruner",
    "make_sampler",
    "open_context",
    "open_optuna_storage",
    "prepare",
    "set_constraints",
    "study_name_for",
]


# -- set-up ----------------------------------------------------------------------------------------------------
def default_space_path(hardware: Hardware) -> str:
    return "dsv4_flash" if hardware.gpu_count else "dsv4_flash_tiny"


def prepare(options: SearchOptions) -> tuple[ResolvedSpace, str, Target, PreflightReport, Hardware]:
    """Load, validate and resolve the space and build the target; nothing touches the storage yet."""
    hardware = options.hardware or detect_hardware()
    space_path = options.space_path or default_space_path(hardware)
    space = load_space(space_path)
    space_yaml = space_text(space.source) if Path(space.source).exists() else ""
    target_name = options.target or space.target
    if options.target and options.target != space.target:
        raise SearchError(
            f"--target {options.target!r} does not match the space's target {space.target!r} "
            f"({space.source}); pass a space written for {options.target!r}"
        )
    resolved = resolve(space, hardware, deployable_only=bool((options.settings or {}).get("deployable_only")))
    try:
        target = get_target_class(target_name)(resolved, options.settings)
    except (TargetError, ValueError) as exc:
        raise SearchError(str(exc)) from None
    report = target.preflight()
    return resolved, space_yaml, target, report, hardware


def study_name_for(options: SearchOptions, resolved: ResolvedSpace) -> str:
    # a plug-in target is named module:Class; a study name keeps to letters, digits and _ . , = + -
    target = re.sub(r"[^A-Za-z0-9_.,=+-]+", "-", options.target or resolved.space.target)
    return options.study or f"{resolved.space.name}-{target}"


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
    from storage.engine import normalize_url, tune_sqlite_engine
    from tuner.search.local_trials import LocalTrialsRDBStorage

    kwargs: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
    if heartbeat:
        kwargs.update(
            heartbeat_interval=5,
            grace_period=20,
            failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=1),
        )
    try:
        storage = LocalTrialsRDBStorage(normalize_url(url), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any driver error means the same thing to the user
        raise StorageError(f"Optuna cannot open storage {url!r}: {str(exc).splitlines()[0]}") from None
    tune_sqlite_engine(storage.engine)  # Optuna's own commits as cheap as the tuner's tables' (WAL, NORMAL)
    return storage


def _check_out_dir(out_dir: str) -> None:
    p = Path(out_dir)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".tuner-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SearchError(
            f"output folder {out_dir!r} is not writable ({exc.strerror}); pass -o/--out DIR with a folder you can write"
        ) from None


def open_context(options: SearchOptions, progress: Progress | None = None) -> SearchContext:
    """Create (or, with ``resume``, load) the run and its Optuna study. The only place schema is created."""
    resolved, space_yaml, target, report, hardware = prepare(options)
    if not report.ok:
        raise SearchError("preflight failed: " + "; ".join(report.errors))
    warm = None
    if options.warm_start and not options.resume:  # read and translated before anything is written
        from tuner.search.warm_start import twin_translations

        warm = twin_translations(options.warm_start, resolved)
    if options.export:
        _check_out_dir(options.out_dir)
    repo = Repo(options.storage_url)
    repo.create_schema()
    ostorage = open_optuna_storage(options.storage_url)
    name = check_study_name(_pick_study_name(options, resolved, repo))  # before Optuna creates anything
    space = resolved.space
    run = repo.get_run(name)
    env = fingerprint()
    deadline = Deadline.start_now(options.budget_s, options.started_at)
    parallel = options.workers > 1 or len(options.gpus or []) > 1
    sampler, pruner = make_sampler(resolved, options.seed, parallel=parallel), make_pruner()
    if run is not None and not options.resume:
        raise SearchError(
            f"study {name!r} already exists in {options.storage_url}; pass --resume to continue it "
            "or --study NEW_NAME to start another"
        )
    if run is None and options.resume:
        raise SearchError(f"--resume: no study {name!r} in {options.storage_url}; drop --resume to start it")
    settings = {
        **target.settings,
        "run_pid": os.getpid(),
        "run_host": socket.gethostname(),
        "hardware": hardware.to_json(),
        "out_dir": str(Path(options.out_dir).resolve()),
        "space_path": space.source,
    }
    if run is None:
        study = optuna.create_study(
            study_name=name,
            storage=cached(ostorage),
            directions=list(space.objective.directions),
            sampler=sampler,
            pruner=pruner,
            load_if_exists=False,
        )
        study.set_user_attr("target", target.name)
        study.set_user_attr("space", space.name)
        _name_metric(study, space.objective)
        run = repo.create_run(
            name,
            target=target.name,
            budget_s=options.budget_s,
            direction=space.objective.direction,
            objective=space.objective.describe(),
            unit=space.objective.unit,
            space_name=space.name,
            space_yaml=space_yaml,
            environment=env,
            settings=settings,
        )
    else:
        study = optuna.load_study(study_name=name, storage=cached(ostorage), sampler=sampler, pruner=pruner)
        stale = repo.mark_stale_running(run.id, reason="left running by an earlier process; marked on resume")
        for num in stale:
            _fail_stale_optuna_trial(study, num)
        repo.restart_run(
            run.id,
            budget_s=options.budget_s,
            environment=env,
            settings={k: settings[k] for k in ("run_pid", "run_host")},
        )  # the live process, for stop
        run = repo.get_run(name)
    ctx = SearchContext(
        options=options,
        resolved=resolved,
        space_yaml=space_yaml,
        target=target,
        repo=repo,
        study=study,
        run=run,
        deadline=deadline,
        hardware=hardware,
        stages=StagePlan(
            plan_stages(resolved, deployable_only=bool((options.settings or {}).get("deployable_only"))),
            stretch=options.converge_after,
            n_trials=options.n_trials,
        ),
    )
    load_history(ctx)
    if ctx.baseline is None and not any(t.is_baseline for t in ctx.trials):
        defaults = resolved.defaults()
        for _ in range(ctx.baseline_runs):  # timed more than once before any other: its spread is known
            study.enqueue_trial(suggestable(resolved, defaults), user_attrs={BASELINE_ATTR: True})
        if warm is not None:  # the twin's best, translated, right after the baseline
            from tuner.search.warm_start import enqueue_warm_start

            enqueue_warm_start(study, resolved, options.warm_start, warm)
    return ctx


def _name_metric(study: optuna.Study, objective) -> None:
    """The objective's name for optuna-dashboard and Optuna's own plots (else they say "Objective 0")."""
    name = objective.describe() + (f" ({objective.unit})" if objective.unit else "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name] + ([objective.pareto] if objective.pareto else []))


def _fail_stale_optuna_trial(study: optuna.Study, number: int) -> None:
    for ft in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if ft.number == number:
            try:
                study._storage.set_trial_state_values(ft._trial_id, optuna.trial.TrialState.FAIL)
            except Exception:  # noqa: BLE001 - another process may have finished it meanwhile
                _logger.warning("could not fail stale trial %d", number)


def load_history(ctx: SearchContext) -> None:
    """The study's finished trials into ``ctx`` (its summaries, counts and the configurations seen), from the
    ``tuner_`` tables, with the repeat proposals turned away before each from its Optuna trial (no ``tuner_``
    column holds them)."""
    turned = {
        t.number: int(t.user_attrs[TURNED_AWAY_ATTR])
        for t in ctx.study.get_trials(deepcopy=False)
        if TURNED_AWAY_ATTR in t.user_attrs
    }
    for rec in ctx.repo.list_trials(ctx.run.id):
        if rec.state == "running":
            continue
        s = TrialSummary(
            rec.number,
            rec.params,
            rec.outcome or "crash",
            rec.value,
            rec.reason,
            rec.duration_s or 0.0,
            rec.is_baseline,
            rec.repeat_of,
            turned_away=turned.get(rec.number, 0),
        )
        ctx.trials.append(s)
        ctx.counts[s.outcome] = ctx.counts.get(s.outcome, 0) + 1
        ctx.seen.setdefault(ctx.key_of(rec.params), s)
