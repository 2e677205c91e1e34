"""``tuner worker``: join a study that ``tuner search`` started, from this or any machine, and run its trials.

The worker never creates schema or a study. It loads the run (space YAML, target, settings, budget) from the
``tuner_`` tables, builds the same target, and loops ask -> lease GPUs -> run_one -> tell until the run's
deadline (``started_at + budget_s``, or ``--budget`` from now if sooner), until the run is no longer
``running``, until the study holds ``--max-trials`` trials, or until Ctrl-C / SIGTERM. It never exports.

Registered in ``tuner/cli.py`` as ``app.command("worker")(worker_command)``.
"""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timezone
from typing import Annotated, Any, Optional

import typer

_logger = logging.getLogger(__name__)


def open_worker_context(
    storage_url: str,
    study_name: str,
    *,
    budget_s: float | None = None,
    heartbeat_interval: int = 5,
    grace_period: int = 20,
    pool_size: int = 4,
    seed: int | None = None,
):
    """Load ``study_name`` from ``storage_url`` into a ``SearchContext`` for one worker process.

    Returns ``(ctx, storage)``. Raises ``tuner.search.parallel.WorkerError`` (no such study, SQLite) or
    ``storage.StorageError`` (unreachable database) with the fix in the message.
    """

    from search_spaces import detect_hardware, load_space, load_space_text, resolve
    from storage import Repo
    from tuner.budget import Deadline
    from tuner.errors import WorkerError
    from tuner.search.context import (
        SearchContext,
        SearchOptions,
        load_history,
        make_pruner,
        make_sampler,
    )
    from tuner.search.driver import plugin_keep_s
    from tuner.search.parallel import (
        RetryingRepo,
        StaleTrialHandler,
        is_sqlite,
        load_worker_study,
        open_worker_storage,
    )
    from tuner.search.stages import StagePlan, follow_stage
    from tuner.search.stages import plan as plan_stages
    from tuner.settings import target_settings
    from tuner.targets import get_target_class

    if is_sqlite(storage_url):
        raise WorkerError(
            f"--storage {storage_url!r} is SQLite, which one process only may write; several "
            "worker processes need PostgreSQL: --storage postgresql://user@host/db (or use "
            "`tuner search --workers N` for threads in one process)"
        )
    repo = RetryingRepo(Repo(storage_url, pool_size=pool_size))
    run = repo.get_run(study_name) if repo.has_schema() else None
    if run is None:
        raise WorkerError(
            f"no study {study_name!r} in {storage_url}; start it with `tuner search --storage "
            f"{storage_url} --study {study_name} ...` first, then add workers"
        )
    settings_all: dict[str, Any] = dict(run.settings or {})
    space_source = settings_all.get("space_path") or run.space_name
    if run.space_yaml:
        space = load_space_text(run.space_yaml, source=space_source)
    else:
        space = load_space(space_source)
    hardware = detect_hardware()
    settings = target_settings(settings_all)
    resolved = resolve(space, hardware, deployable_only=bool(settings.get("deployable_only")))  # as the search did
    target = get_target_class(run.target)(resolved, settings)
    started = run.started_at.replace(tzinfo=timezone.utc).timestamp()
    deadline = Deadline(started, run.budget_s, min(60.0, max(2.0, 0.03 * run.budget_s)))
    deadline = deadline.keep(plugin_keep_s(run.budget_s, None, target, resolved))  # as the search keeps it
    if budget_s is not None:
        own = Deadline.start_now(budget_s)
        if own.trials_end < deadline.trials_end:
            deadline = own
    stale = StaleTrialHandler(repo, run.id, grace_period_s=grace_period)
    storage = open_worker_storage(
        storage_url,
        pool_size=pool_size,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        on_stale=stale,
    )
    study = load_worker_study(storage, study_name, make_sampler(resolved, seed), make_pruner())
    options = SearchOptions(
        budget_s=run.budget_s,
        storage_url=storage_url,
        study=study_name,
        space_path=space_source,
        target=run.target,
        settings=settings,
        export=False,
        confirm_top=0,
        hardware=hardware,
    )
    ctx = SearchContext(
        options=options,
        resolved=resolved,
        space_yaml=run.space_yaml,
        target=target,
        repo=repo,
        study=study,
        run=run,
        deadline=deadline,
        hardware=hardware,
        # the search's stages, followed: it samples the stage the search is in (``_watch_run`` keeps it in step)
        stages=StagePlan(plan_stages(resolved, deployable_only=bool(settings.get("deployable_only"))), follower=True),
    )
    load_history(ctx)
    follow_stage(ctx)
    return ctx, storage


def _watch_run(ctx, stop_watch: threading.Event) -> None:
    """Stop this worker (and kill its trial) when the run is no longer ``running`` (ended or interrupted)."""
    from tuner.measurement import Outcome
    from tuner.search.parallel import RUN_POLL_S
    from tuner.search.stages import follow_stage

    while not stop_watch.wait(RUN_POLL_S):
        try:
            run = ctx.repo._repo.get_run(ctx.run.study_name)  # one attempt; the next poll is the retry
        except Exception:  # noqa: BLE001 - a database outage is the retrying calls' business
            continue
        try:
            follow_stage(ctx, ctx.repo._repo)  # one attempt, as the run's state above
        except Exception:  # noqa: BLE001 - a database outage is the retrying calls' business
            pass
        if run is None or run.state != "running":
            ctx.stop_reason = f"the run is {run.state if run else 'gone'}"
            ctx.stop.set()
            if ctx.current is not None:
                ctx.current.kill(Outcome.TIMEOUT)
            return


def worker_command(
    storage: Annotated[
        str,
        typer.Option(
            "--storage", envvar="TUNER_STORAGE", help="PostgreSQL URL of the study, the same one `tuner search` uses."
        ),
    ],
    study: Annotated[str, typer.Option("--study", help="Name of the study to join (it must exist).")],
    gpus: Annotated[
        Optional[str],
        typer.Option(
            "--gpus",
            help="GPU ids this worker leases from, e.g. 0,1,2,3 (default: every visible GPU; none on a CPU machine).",
        ),
    ] = None,
    budget: Annotated[
        Optional[str],
        typer.Option("--budget", help="Stop this worker after this long (90s, 2h) if the run's own deadline is later."),
    ] = None,
    max_trials: Annotated[
        Optional[int],
        typer.Option(
            "--max-trials", help="Stop when the study holds this many finished trials (all workers together)."
        ),
    ] = None,
    lock_dir: Annotated[
        Optional[str],
        typer.Option("--lock-dir", help="Folder of the per-GPU lock files shared by the workers of this machine."),
    ] = None,
    name: Annotated[
        Optional[str], typer.Option("--name", help="Worker name in the trial records (default host:pid).")
    ] = None,
    heartbeat_interval: Annotated[int, typer.Option("--heartbeat-interval", help="Seconds between heartbeats.")] = 5,
    grace_period: Annotated[
        int,
        typer.Option(
            "--grace-period",
            help="Seconds without a heartbeat after which a trial counts as lost, is failed and retried once.",
        ),
    ] = 20,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampler seed (give each worker its own).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Join an existing study (PostgreSQL) and run its trials until its deadline; run one per machine or GPU set."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import optuna

    if not verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    from tuner.budget import parse_budget
    from tuner.errors import TunerError, tuner_errors
    from tuner.search.leases import GpuLeaser, parse_gpu_ids
    from tuner.search.parallel import worker_loop, worker_name

    try:
        with tuner_errors():
            gpu_ids = parse_gpu_ids(gpus)
            budget_s = parse_budget(budget) if budget else None
            if max_trials is not None and max_trials <= 0:
                raise ValueError(f"--max-trials must be positive, but got {max_trials}.")
            ctx, ostorage = open_worker_context(
                storage,
                study,
                budget_s=budget_s,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                seed=seed,
            )
    except (TunerError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if gpu_ids is None and ctx.hardware.gpu_count:
        gpu_ids = list(range(ctx.hardware.gpu_count))
    leaser = GpuLeaser(gpu_ids, lock_dir=lock_dir) if gpu_ids else None
    me = name or worker_name()

    def on_signal(signum, frame):
        if ctx.stop.is_set():
            raise KeyboardInterrupt
        ctx.stop_reason = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "stopped (SIGTERM)"
        ctx.stop.set()
        if ctx.current is not None:
            ctx.current.kill(_timeout())

    prev = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
    stop_watch = threading.Event()
    watcher = threading.Thread(target=_watch_run, args=(ctx, stop_watch), daemon=True)
    watcher.start()
    typer.echo(
        f"worker {me} joined study {study!r} (target {ctx.target.name}, "
        f"{len(ctx.resolved.params)} parameters, GPUs {gpu_ids or 'none'})",
        err=True,
    )
    try:
        report = worker_loop(
            ctx,
            None,
            name=me,
            leaser=leaser,
            max_trials=max_trials,
            storage=ostorage,
            heartbeat_interval=heartbeat_interval,
        )
    except KeyboardInterrupt:
        typer.echo(f"worker {me} interrupted", err=True)
        raise typer.Exit(130)
    finally:
        stop_watch.set()
        signal.signal(signal.SIGINT, prev[0])
        signal.signal(signal.SIGTERM, prev[1])
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "none"
    typer.echo(f"worker {me} stopped ({report.stop_reason}): {report.trials} trials: {counts}", err=True)


def _timeout():
    from tuner.measurement import Outcome

    return Outcome.TIMEOUT


def main() -> None:  # ``python -m tuner.worker_cli`` until the command is registered in tuner/cli.py
    typer.run(worker_command)


if __name__ == "__main__":
    main()


__all__ = ["open_worker_context", "worker_command"]
