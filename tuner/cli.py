"""The ``tuner`` command line: search, status, best, export, serve, verify, explain.

Library code logs; this module prints. Bad input ends with one line on stderr naming the thing, the value and
the fix, and exit code 2.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the fastest launch configuration and kernels for LLM serving, by measuring.",
)
# piped or logged output gets wide lines (tables are not folded at 80 columns); a terminal keeps its own width
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)

StorageOpt = Annotated[
    str, typer.Option("--storage", help="SQLAlchemy URL of the study database.", envvar="TUNER_STORAGE")
]
StudyOpt = Annotated[Optional[str], typer.Option("--study", help="Study name (default: the only or newest one).")]


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(code)


def reported(command):
    """Wrap a command: a :class:`TunerError` (a space or storage error too, through ``tuner_errors``) ends it with
    one ``error:`` line and exit code 2."""
    from tuner.errors import TunerError, tuner_errors

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            with tuner_errors():
                return command(*args, **kwargs)
        except TunerError as exc:
            fail(str(exc))

    return run


def _parse_sets(items: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            fail(f"--set {item!r} must be KEY=VALUE, e.g. --set live_context=1024")
        k, _, v = item.partition("=")
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


class HeldWarnings(logging.Handler):
    """Holds the warnings logged during a search, each message once, to be said at its end (:meth:`lines`) as
    sentences, not as timestamped records among the trial lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        kind = "warning" if record.levelno < logging.ERROR else "error"
        self.messages.setdefault(record.getMessage().strip(), kind)

    def lines(self) -> list[str]:
        return [f"{kind}: {m[:1].upper()}{m[1:]}{'' if m.endswith('.') else '.'}" for m, kind in self.messages.items()]


def _setup_logging(verbose: bool, held: HeldWarnings | None = None) -> None:
    """Verbose: every record on stderr with its time. Otherwise the warnings go to ``held`` (said at the end) when
    given, else to stderr as records."""
    if held is not None and not verbose:
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        root.addHandler(held)
    else:
        logging.basicConfig(
            level=logging.INFO if verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    if not verbose:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if held is not None:  # Optuna's own handler prints its records; they are held too
            optuna.logging.disable_default_handler()
            optuna.logging.enable_propagation()


@app.command()
@reported
def search(
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock budget, export included: 90s, 10m, 2h, 1h30m.")],
    space: Annotated[
        Optional[str],
        typer.Option("--space", help="Search space YAML (default: dsv4_flash on a GPU, dsv4_flash_tiny on a CPU)."),
    ] = None,
    target: Annotated[Optional[str], typer.Option("--target", help="workload | sglang | kernels | command")] = None,
    storage: StorageOpt = "sqlite:///tuner.db",
    study: StudyOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an existing study.")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampler seed.")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Folder for the exported launch script.")] = "tuner-out",
    model: Annotated[Optional[str], typer.Option("--model", help="Model path (server targets).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Target setting KEY=VALUE (repeatable).")] = [],
    n_trials: Annotated[Optional[int], typer.Option("--n-trials", help="Stop after this many trials.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Run the preflight only and print its report.")] = False,
    confirm_top: Annotated[int, typer.Option("--confirm-top", help="Re-run the best K configurations at the end.")] = 3,
    refine_share: Annotated[
        float,
        typer.Option(
            "--refine-share",
            help="Share of the time for trials spent last on one-change moves from the best so far (0 turns it off).",
        ),
    ] = 0.25,
    converge_after: Annotated[
        int,
        typer.Option(
            "--converge-after",
            help="A stage has converged when this many of its "
            "trials that ran (at least a fifth of them; one refused before "
            "running is not counted) found nothing better beyond the "
            "noise: the next stage starts, or the last ends the search early "
            "(0: never).",
        ),
    ] = 40,
    workers: Annotated[int, typer.Option("--workers", help="Local workers running trials in parallel.")] = 1,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="GPU ids the workers lease from, e.g. 0,1,2,3.")] = None,
    warm_start: Annotated[
        Optional[str],
        typer.Option(
            "--warm-start",
            help="URL#STUDY of a twin (workload) study: "
            "its best configurations, translated to this space's flags, "
            "run first.",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Search for the fastest configuration within a wall-clock budget, then export it."""
    held = HeldWarnings()
    _setup_logging(verbose, held)
    from tuner.budget import parse_budget, process_start
    from tuner.progress import RichProgress
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    if study is not None:
        from storage.names import StudyNameError, check_study_name

        try:
            check_study_name(study)
        except StudyNameError as exc:
            fail(str(exc))
    settings = _parse_sets(set_)
    if model is not None:
        settings["model"] = model
    progress = RichProgress(console)
    if workers < 1:
        fail(f"--workers must be >= 1, but got {workers}")
    if not 0.0 <= refine_share < 1.0:
        fail(
            f"--refine-share must be in [0, 1), but got {refine_share}: 0.25 spends the last quarter on refining, 0 "
            "turns it off"
        )
    if converge_after < 0:
        fail(
            f"--converge-after must be >= 0, but got {converge_after}: 40 ends a stage after 40 trials without a "
            "gain beyond the noise, 0 turns it off"
        )
    gpu_ids = None
    if gpus is not None:
        from tuner.search.leases import parse_gpu_ids

        try:
            gpu_ids = parse_gpu_ids(gpus)
        except ValueError as exc:
            fail(str(exc))
    try:
        opts = SearchOptions(
            budget_s=parse_budget(budget),
            started_at=process_start(),  # the user's clock: the imports and setup count against --budget
            storage_url=storage,
            study=study,
            space_path=space,
            target=target,
            resume=resume,
            seed=seed,
            out_dir=out,
            settings=settings,
            n_trials=n_trials,
            dry_run=dry_run,
            confirm_top=confirm_top,
            refine_share=refine_share,
            converge_after=converge_after,
            workers=workers,
            gpus=gpu_ids,
            warm_start=warm_start,
        )
        result = run_search(opts, progress)
    except BaseException:
        _say(held)
        raise
    finally:
        progress.stop()
    if dry_run:
        for line in result.preflight.lines():
            console.print(line, highlight=False, markup=False)
        _say(held)
        raise typer.Exit(0 if result.preflight.ok else 2)
    _print_result(result)
    _say(held)
    if not hasattr(result, "summary_lines") and result.infeasible:  # stored, not exported: say so, exit 1
        err_console.print(f"error: {result.infeasible}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not hasattr(result, "summary_lines") and (result.best is None or result.state == "failed"):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(_count(result.trials).items())) or "no trial"
        err_console.print(
            f"error: {'the search gave up' if result.state == 'failed' else 'no trial succeeded'} "
            f"({counts}); `tuner status` lists each trial's reason",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(1)


def _say(held: HeldWarnings) -> None:
    """The warnings held during a search, once each, after its trial lines and result."""
    for line in held.lines():
        err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    held.messages.clear()


def stop_reason(result) -> str:
    """Why the search stopped, as the user reads it: "budget used" only when it was (the search stopped asking for
    trials when the time left was kept for the re-runs at the end, which may not have fitted)."""
    from tuner.budget import Deadline, format_seconds

    left = result.budget_s - result.elapsed_s
    kept = Deadline.start_now(result.budget_s).reserve_s if result.budget_s else 0.0  # for the export
    if result.stop_reason == "budget used" and result.budget_s and left > kept + 1.0:
        return (
            f"ended {format_seconds(left)} before its {format_seconds(result.budget_s)} budget: the time left was "
            "kept for re-runs at the end and none more fitted"
        )
    return result.stop_reason


def _print_result(result) -> None:
    from tuner.search.results import trial_tally

    if hasattr(result, "summary_lines"):  # a kernel search: one line per kernel x shape case
        for line in result.summary_lines():
            console.print(line, highlight=False, markup=False)
        return
    console.print(
        f"\nsearch {result.state} after {result.elapsed_s:.0f}s"
        + (f" ({stop_reason(result)})" if result.stop_reason else "")
        + f": {trial_tally(result.trials)}"
    )
    if result.note:
        console.print(f"note: {result.note}", highlight=False)
    if result.best is None:
        return
    ratio = (
        f" = {result.speedup:.2f}x the baseline's median ({result.baseline_value:.2f}, "
        f"{len(result.baseline_runs)} run(s))"
        if result.speedup
        else ""
    )
    if result.baseline_value == 0:  # a ratio over 0 is no figure (it was inf)
        ratio = f"; the baseline met nothing (median 0 over {len(result.baseline_runs)} run(s)): no ratio"
    values = {t.number: t.value for t in result.trials}
    runs = [values[n] for n in result.best_runs if values.get(n) is not None]
    spread = (
        f" (median of {len(runs)} runs, {min(runs):.2f}-{max(runs):.2f}, spread {result.best_spread:.1%})"
        if len(runs) > 1
        else " (one run)"
    )
    console.print(f"best: trial {result.best.number}, {result.best_value:.2f}{spread}{ratio}")
    for k, v in result.best_params.items():
        console.print(f"  {k} = {v}", highlight=False)
    if result.export_dir:
        console.print(f"launch script: {Path(result.export_dir) / 'launch.sh'}")


def _count(trials) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        out[t.outcome] = out.get(t.outcome, 0) + 1
    return out


def _open(storage: str, study: str | None):
    from storage import Repo

    repo = Repo(storage, create=False)  # a read-only command never creates a database
    if not repo.has_schema():
        fail(f"storage {storage!r} holds no tuner studies; run `tuner search` first or pass --storage")
    if study is None:
        runs = repo.list_runs()
        if not runs:
            fail(f"storage {storage!r} holds no studies; run `tuner search` first")
        return repo, runs[0]
    run = repo.get_run(study)
    if run is None:
        names = [r.study_name for r in repo.list_runs()]
        fail(f"no study {study!r} in {storage}; known studies: {names}")
    return repo, run


@app.command()
@reported
def status(
    storage: StorageOpt = "sqlite:///tuner.db",
    study: StudyOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="List every study.")] = False,
    sort: Annotated[str, typer.Option("--sort", help="number | value | duration (missing values last).")] = "number",
    desc: Annotated[bool, typer.Option("--desc", help="Largest first.")] = False,
    limit: Annotated[int | None, typer.Option("--limit", help="Show this many trials (default: all).")] = None,
    offset: Annotated[int, typer.Option("--offset", help="Skip this many trials first.")] = 0,
    repeats: Annotated[
        bool,
        typer.Option(
            "--repeats", help="List each repeat (a configuration asked again and not run again) in its own row."
        ),
    ] = False,
) -> None:
    """Show the studies, or one study's trials with their outcomes (the API's trial page: same sort and paging)."""
    from storage.queries import SORT_KEYS, trial_page
    from storage.repo import elapsed_s
    from tuner.measurement import served_shortfall

    if sort not in SORT_KEYS:
        fail(f"--sort {sort!r} is not one of {', '.join(SORT_KEYS)}; e.g. --sort value --desc")
    if (limit is not None and limit < 1) or offset < 0:
        fail(f"--limit must be >= 1 and --offset >= 0, but got --limit {limit} --offset {offset}")
    if all_ or study is None:
        from storage import Repo

        repo = Repo(storage, create=False)  # a read-only command never creates a database
        runs = repo.list_runs() if repo.has_schema() else []
        table = Table("study", "target", "state", "elapsed", "trials", "best", "x baseline")
        for r in runs:
            n = repo.count_trials(r.id)
            ratio = f"{r.best_value / r.baseline_value:.2f}" if r.best_value and r.baseline_value else "-"
            table.add_row(
                r.study_name,
                r.target,
                r.state,
                f"{elapsed_s(r):.0f}s",
                str(n),
                f"{r.best_value:.2f}" if r.best_value is not None else "-",
                ratio,
            )
        console.print(table)
        if not (all_ or study is None) or not runs:
            return
        if study is None and len(runs) > 1:
            return
    repo, run = _open(storage, study)
    counts = repo.outcome_counts(run.id)
    console.print(
        f"study {run.study_name}: {run.state}, target {run.target}, objective {run.objective}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    ended = repo.end_reason(run.id) if run.state != "running" else ""
    if ended:
        console.print(f"stopped: {ended}", highlight=False, markup=False)
    every = repo.list_trials(run.id)
    asked_again: dict[int, list[int]] = {}
    for t in every:
        if t.repeat_of is not None:
            asked_again.setdefault(t.repeat_of, []).append(t.number)
    base_line = _baseline_line(run, every)
    if base_line:
        console.print(base_line, highlight=False, markup=False)
    total, trials = trial_page(
        repo, run.id, sort=sort, descending=desc, offset=offset, limit=limit, with_measurements=True
    )
    shown = [t for t in trials if repeats or t.repeat_of is None]
    num = {t.number: m.value for t in shown for m in t.measurements if m.metric == "numerics_rel_err"}
    agree = {t.number: m.value for t in shown for m in t.measurements if m.metric == "greedy_agreement"}
    phases = {t.number: _trial_phases(t.measurements) for t in shown}
    phased = any(phases.values())
    served = {t.number: served_shortfall(t.measurements) for t in shown}
    split = {t.number: _time_split(t.measurements) for t in shown}
    base_key = _baseline_key(every)
    caption = f"trials {offset + 1}-{offset + len(trials)} of {total}" if len(trials) < total else None
    folded = sum(t.repeat_of is not None for t in trials) if not repeats else 0
    if folded:
        caption = (caption + "; " if caption else "") + (
            f"{folded} repeats (a configuration asked again, not run again) folded into their configuration's row; "
            "--repeats lists them"
        )
    table = Table(
        "#",
        "outcome",
        "value",
        "x baseline",
        "s",
        *(["start/warm/measure s"] if any(split.values()) else []),
        *(["spawn/build/num/compile/capture/measure s"] if phased else []),
        *(["num. err"] if num else []),
        *(["greedy agr."] if agree else []),
        *(["not served in full"] if any(served.values()) else []),
        "params / reason",
        caption=caption,
    )
    for t in shown:
        is_base_config = base_key is not None and t.outcome == "ok" and _key(t.params) == base_key
        if is_base_config:
            ratio = "baseline"
        else:
            ratio = f"{t.value / run.baseline_value:.2f}" if t.value and run.baseline_value else ""
        detail = ", ".join(f"{k}={v}" for k, v in t.params.items())
        if t.outcome not in ("ok", None) and t.reason:
            detail += f" — {t.reason[:300]}"
        if t.repeat_of is not None and repeats:
            detail = f"same configuration as trial {t.repeat_of}: not run again"
        if asked_again.get(t.number) and not repeats:
            again = asked_again[t.number]
            detail += f" (asked again {len(again)}x: trial{'s' if len(again) > 1 else ''} " + _numbers(again) + ")"
        table.add_row(
            str(t.number) + (" b" if t.is_baseline else ""),
            t.outcome or t.state,
            f"{t.value:.2f}" if t.value is not None else "",
            ratio,
            f"{t.duration_s:.1f}" if t.duration_s else "",
            *([split[t.number]] if any(split.values()) else []),
            *([_phase_split(phases[t.number])] if phased else []),
            *([f"{num[t.number]:.2g}" if t.number in num else ""] if num else []),
            *([f"{agree[t.number]:.3f}" if t.number in agree else ""] if agree else []),
            *([served[t.number]] if any(served.values()) else []),
            Text(detail),
        )  # no markup: `x[y]`
    console.print(table)
    if phased:
        console.print(trial_time_line([phases[t.number] for t in shown]), highlight=False)


TRIAL_PHASES = ("spawn", "build", "numerics", "compile", "capture", "measure")
"""Where a trial's time went (the ``trial_time_s`` rows a workload trial stores, ``spawn`` for any trial run in a
trial process): the process start and imports (~0 in a reused worker), the model build, the numerics gate, the first
steps' compile, CUDA-graph capture, and the measurement itself."""


def _key(params: dict) -> str:
    from tuner.search.winner import params_json  # the stored decision's own key of a configuration

    return params_json(params)


def _baseline_key(trials) -> str | None:
    """The baseline configuration's parameters, as a key (None before it ran)."""
    base = next((t for t in trials if t.is_baseline), None)
    return _key(base.params) if base is not None else None


def _baseline_line(run, trials) -> str:
    """The figure every "x baseline" divides by (the stored run's baseline: the baseline's median), with its runs'
    range and spread, read from the same trials."""
    if not run.baseline_value:
        return ""
    key = _baseline_key(trials)
    runs = [
        t.value
        for t in trials
        if t.outcome == "ok" and t.value is not None and t.repeat_of is None and _key(t.params) == key
    ]
    unit = f" {run.unit}" if run.unit else ""
    if len(runs) < 2:
        return f"baseline (the space's defaults): {run.baseline_value:.2f}{unit}, one run (its spread is unknown)"
    from tuner.search.winner import spread_of

    return (
        f"baseline (the space's defaults): {run.baseline_value:.2f}{unit}, the median of {len(runs)} runs "
        f'({min(runs):.2f}-{max(runs):.2f}, spread {spread_of(runs):.1%}); "x baseline" divides by it'
    )


def _numbers(numbers: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, numbers[:most]))
    return shown + (f" and {len(numbers) - most} more" if len(numbers) > most else "")


def _trial_phases(measurements) -> dict[str, float]:
    return {m.level: m.value for m in measurements if m.metric == "trial_time_s" and m.level in TRIAL_PHASES}


def _fmt_s(v: float) -> str:
    return f"{v:.1f}" if v >= 0.1 else f"{v:.2f}"


def _phase_split(phases: dict[str, float]) -> str:
    """``0.00/0.3/0.5/0.1/-/1.2``: a trial's seconds per :data:`TRIAL_PHASES` (``-``: none stored)."""
    if not phases:
        return ""
    return "/".join(_fmt_s(phases[k]) if k in phases else "-" for k in TRIAL_PHASES)


def trial_time_line(per_trial: list[dict[str, float]]) -> str:
    """One line for a study: the median seconds per phase over the trials that stored their phases."""
    import statistics

    stored = [p for p in per_trial if p]
    parts = [
        f"{k} {_fmt_s(statistics.median(vals))}" for k in TRIAL_PHASES if (vals := [p[k] for p in stored if k in p])
    ]
    return f"time per trial (median s over {len(stored)} trials): " + ", ".join(parts)


def _time_split(measurements) -> str:
    """``14.6/1.2/6.0``: a server trial's start-up, warm-up and measurement seconds (all levels); empty for others."""
    got = {m.metric: 0.0 for m in measurements if m.metric in ("startup_s", "warmup_s", "measure_s")}
    for m in measurements:
        if m.metric in got:
            got[m.metric] += m.value
    if not got:
        return ""
    # tenths, and two decimals below a tenth: a warm-up of 40 ms is not "0.0"
    return "/".join(
        (f"{got[k]:.1f}" if got[k] >= 0.1 else f"{got[k]:.2f}") if k in got else "-"
        for k in ("startup_s", "warmup_s", "measure_s")
    )


@app.command()
@reported
def best(
    storage: StorageOpt = "sqlite:///tuner.db",
    study: StudyOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    pareto: Annotated[bool, typer.Option("--pareto", help="A goodput study's throughput-latency front.")] = False,
) -> None:
    """Print the best trial's parameters and figures (``--pareto``: the front of every load measured)."""
    repo, run = _open(storage, study)
    if pareto:
        from tuner.targets.server.front import front_lines, operating_points

        points = operating_points(repo.list_trials(run.id, with_measurements=True))
        if not points:
            fail(
                f"study {run.study_name!r} has no measured load of a goodput objective; --pareto needs "
                "`objective: {metric: goodput_tok_s_per_gpu, slo: {...}}`"
            )
        slo = run.objective.split(" within ", 1)[-1].split(" against ")[0]
        for line in front_lines(points, slo):
            console.print(line, highlight=False)
        return
    if run.best_trial_number is None:
        fail(f"study {run.study_name!r} has no successful trial yet")
    from tuner.export.script import nothing_met_the_slo

    t = repo.get_trial(run.id, run.best_trial_number)
    value = run.best_value if run.best_value is not None else t.value  # the median over confirmation re-runs
    # the search's, the export's and this one answer: a goodput best that met the SLO nowhere is no best
    infeasible = nothing_met_the_slo(run, t, "no configuration to deploy")
    doc = {
        "study": run.study_name,
        "trial": t.number,
        "value": value,
        "baseline_value": run.baseline_value,
        "speedup": (value / run.baseline_value) if run.baseline_value else None,
        "params": t.params,
        "feasible": not infeasible,
        "metrics": {f"{m.metric}@{m.level}" if m.level else m.metric: m.value for m in t.measurements},
    }
    if as_json:
        console.print_json(json.dumps(doc))
        if infeasible:
            raise typer.Exit(1)
        return
    if infeasible:
        fail(infeasible, code=1)
    console.print(
        f"study {run.study_name}: best trial {t.number}, {value:.2f} {run.unit}"
        + (f" = {doc['speedup']:.2f}x baseline ({run.baseline_value:.2f})" if doc["speedup"] else ""),
        markup=False,
    )
    for k, v in t.params.items():
        console.print(f"  {k} = {v}", highlight=False, markup=False)
    if doc["speedup"]:
        console.print(_baseline_line(run, repo.list_trials(run.id)), highlight=False, markup=False)
    err = doc["metrics"].get("numerics_rel_err")
    if err is not None:
        console.print(
            f"numerics: output differs from the precise reference's by {err:.3g} (relative norm "
            f"error; tolerance {doc['metrics'].get('numerics_tolerance', float('nan')):.3g})",
            highlight=False,
        )
    agree = doc["metrics"].get("greedy_agreement")
    if agree is not None:
        console.print(
            f"greedy check: completions agree with the baseline's on {agree:.3f} (mean common prefix "
            f"share; min_agreement {doc['metrics'].get('greedy_min_agreement', float('nan')):g})",
            highlight=False,
        )


@app.command()
@reported
def export(
    storage: StorageOpt = "sqlite:///tuner.db",
    study: StudyOpt = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Destination folder.")] = "tuner-out",
    point: Annotated[
        str | None,
        typer.Option(
            "--point",
            help="A goodput study's point of the front: trial@load as `tuner best --pareto` prints "
            "it (4@r=2), or a trial number (its goodput boundary).",
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help="A goodput study's best configuration under this SLO, at the highest load meeting it: "
            "'ttft_ms_p95<=500,tpot_ms_p95<=50'.",
        ),
    ] = None,
) -> None:
    """Write the best configuration's launch script, parameters and kernel configs."""
    from search_spaces import load_space_text, resolve
    from tuner.export.script import export_run
    from tuner.settings import target_settings
    from tuner.targets import get_target_class

    repo, run = _open(storage, study)
    chosen = _chosen_point(repo, run, point, slo) if point is not None or slo is not None else None
    from search_spaces import detect_hardware

    space = load_space_text(run.space_yaml, source=run.settings.get("space_path", run.space_name))
    target = get_target_class(run.target)(resolve(space, detect_hardware()), target_settings(run.settings))
    from tuner.search.winner import parsimony_for_run

    dest = export_run(repo, run.study_name, out, target=target, parsimony=parsimony_for_run(repo, run), chosen=chosen)
    console.print(f"exported study {run.study_name} to {dest}" + (f" for {chosen.line}" if chosen else ""))
    console.print(f"launch script: {dest / 'launch.sh'}")


def _chosen_point(repo, run, point: str | None, slo: str | None):
    """The point of a goodput study's front ``--point`` names or ``--slo`` picks (``tuner.targets.server.front``)."""
    from tuner.targets.server.front import operating_points, parse_slo, point_by_name, point_for_slo
    from tuner.targets.server.goodput import LEVEL

    if point is not None and slo is not None:
        fail("give --point or --slo, not both")
    limits = parse_slo(slo) if slo is not None else ()
    trials = repo.list_trials(run.id, with_measurements=True)
    points = operating_points(trials)
    if not points:
        fail(
            f"study {run.study_name!r} has no measured load of a goodput objective; --point and --slo need a "
            "goodput study (`objective: {metric: goodput_tok_s_per_gpu, slo: {...}}`)"
        )
    if slo is not None:  # every rule the study's search judged a load by, its thresholds included
        from tuner.targets.server.goodput import Rules

        return point_for_slo(points, limits, Rules.of(run.settings or {}))
    lows = {t.number: m.value for t in trials for m in t.measurements if m.metric == "goodput_low" and m.level == LEVEL}
    return point_by_name(points, point, lows)


@app.command()
@reported
def serve(
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="SQLAlchemy URL of the study database [default: TUNER_API_STORAGE_URL, else "
            "TUNER_STORAGE, else sqlite:///tuner.db].",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="[default: TUNER_API_HOST, else 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option("--port", help="[default: TUNER_API_PORT, else 8000]")] = None,
) -> None:
    """Serve the REST API and the dashboard over a study database (never creates one)."""
    import uvicorn

    try:
        from api.app import create_app
        from api.settings import ApiSettings
    except ImportError as exc:
        fail(f"the API is not available in this build ({exc})")
    from pydantic import ValidationError

    from storage import Repo

    given: dict[str, Any] = {"host": host, "port": port, "storage_url": storage}
    if storage is None and "TUNER_API_STORAGE_URL" not in os.environ and os.environ.get("TUNER_STORAGE"):
        given["storage_url"] = os.environ["TUNER_STORAGE"]
    try:
        settings = ApiSettings(**{k: v for k, v in given.items() if v is not None})  # the rest from TUNER_API_*
        Repo(settings.storage_url, create=False).engine.dispose()  # a mistyped path fails here, not on a request
        app_ = create_app(settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        fail(f"API setting {'.'.join(map(str, err.get('loc', ())))}: {err.get('msg')}; fix the TUNER_API_* variable")
    uvicorn.run(app_, host=settings.host, port=settings.port, log_level="info")


@app.command()
@reported
def explain(
    storage: StorageOpt = "sqlite:///tuner.db",
    study: StudyOpt = None,
    level: Annotated[Optional[int], typer.Option("--level", help="Only this concurrency level.")] = None,
    no_profile: Annotated[bool, typer.Option("--no-profile", help="Importances only.")] = False,
    ablate: Annotated[
        bool,
        typer.Option(
            "--ablate",
            help="Also re-run the baseline with each change alone "
            "and the best with each change undone, one trial each.",
        ),
    ] = False,
    ablate_views: Annotated[
        str, typer.Option("--ablate-views", help="With --ablate: which views, comma-separated: alone, undo.")
    ] = "alone,undo",
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Also write the report here.")] = None,
) -> None:
    """Why the best configuration won: parameter importances and baseline-vs-best op profiles."""
    _setup_logging(False)
    from tuner.explain import VIEWS
    from tuner.explain import ablate as run_ablate
    from tuner.explain import explain as run_explain

    views = tuple(v.strip() for v in ablate_views.split(",") if v.strip())
    if not views or any(v not in VIEWS for v in views):
        fail(
            f"--ablate-views {ablate_views!r} is not a comma-separated list of {', '.join(VIEWS)}; "
            f"e.g. --ablate-views {VIEWS[0]}"
        )
    try:
        _, run = _open(storage, study)
        ex = run_explain(storage, run.study_name, profile=not no_profile, level=level)
        if ablate:

            def keep(ab) -> None:  # after every re-run: the report so far, on disk when --out is given
                ex.ablation, ex.best_by_level = list(ab.ablation), dict(ab.best_by_level)
                ex.alone, ex.baseline_by_level = list(ab.alone), dict(ab.baseline_by_level)
                if out:
                    _write_report(out, ex.markdown())

            try:
                ab = run_ablate(storage, run.study_name, level=level, views=views, on_row=keep)
                ex.notes += ab.notes
            except KeyboardInterrupt:
                ex.notes.append(
                    f"the ablation was interrupted after {len(ex.alone) + len(ex.ablation)} re-runs; "
                    "the tables hold those"
                )
    except ValueError as exc:
        fail(str(exc))
    text = ex.markdown()
    console.print(text, highlight=False, markup=False)
    if out:
        _write_report(out, text)


def _write_report(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, then renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fail(f"cannot write the report to {path!r} ({exc.strerror}); pass a writable path")


@app.command()
@reported
def verify(
    script: Annotated[
        Optional[Path],
        typer.Argument(help="An exported launch.sh (default with --storage: the study's last export there)."),
    ] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Allowed shortfall, 0.15 = 15%.")] = 0.15,
    timeout: Annotated[str, typer.Option("--timeout", help="Wall-clock limit: 90s, 10m, 1h.")] = "1h",
    storage: Annotated[
        Optional[str],
        typer.Option(
            "--storage", help="The study's database: verify its export (or SCRIPT) and store the result there."
        ),
    ] = None,
    study: StudyOpt = None,
) -> None:
    """Run an exported launch script once and compare with the figures it recorded (exit 1 when off)."""
    from tuner.budget import parse_budget
    from tuner.export.verify import verify as run_verify
    from tuner.export.verify import verify_stored

    if not (0 < tolerance < 1):
        fail(f"--tolerance must be between 0 and 1, but got {tolerance}; e.g. --tolerance 0.15")
    if script is None and storage is None:
        fail("give the exported script (tuner verify out/STUDY/launch.sh) or --storage URL [--study NAME]")
    if storage is not None:
        repo, run = _open(storage, study)
        res = verify_stored(repo, run.study_name, script=script, tolerance=tolerance, timeout_s=parse_budget(timeout))
    else:
        res = run_verify(script, tolerance=tolerance, timeout_s=parse_budget(timeout))
    for line in res.lines():
        console.print(line, highlight=False, markup=False)
    raise typer.Exit(0 if res.ok else 1)


from tuner.worker_cli import worker_command  # noqa: E402 - registered with the other commands

app.command("worker", help="Join an existing study (PostgreSQL) from any machine and run its trials.")(worker_command)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
