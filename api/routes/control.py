"""Control, guarded by the bearer token: start a search (``tuner search`` subprocess) and stop one (SIGINT)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess

from fastapi import APIRouter, HTTPException, status

from api.deps import ControlDep, RunDep, StateDep
from api.schemas import (
    NOT_FOUND,
    UNAVAILABLE,
    ErrorOut,
    SearchRequest,
    SearchStarted,
    StopResult,
)
from api.settings import ApiSettings

router = APIRouter(tags=["control"], dependencies=[ControlDep])
_logger = logging.getLogger(__name__)

_GUARDED = {
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "control disabled: no TUNER_API_CONTROL_TOKEN configured"},
    409: {"description": "the study is in a state that does not allow it"},
    **UNAVAILABLE,
}
_START = {**_GUARDED, 400: {"model": ErrorOut, "description": "the body is not JSON"}}
_STOP = {**_GUARDED, **NOT_FOUND}


def search_argv(settings: ApiSettings, req: SearchRequest, *, resume: bool = False) -> list[str]:
    """The ``tuner search`` command line for a request (an argv list: no shell ever sees it)."""
    argv = [
        *settings.search_command,
        "search",
        "--storage", settings.storage_url,
        "--study", req.study,
        "--space", req.space,
        "--target", req.target,
        "--budget", f"{req.budget_s:g}s",
        "--out", str(settings.search_out_dir),  # the export adds <study>/ itself
    ]  # fmt: skip
    if resume:
        argv.append("--resume")
    if req.n_trials is not None:
        argv += ["--n-trials", str(req.n_trials)]
    if req.seed is not None:
        argv += ["--seed", str(req.seed)]
    return argv


@router.post("/api/searches", response_model=SearchStarted, status_code=status.HTTP_202_ACCEPTED, responses=_START)
def start_search(req: SearchRequest, state: StateDep) -> SearchStarted:
    """Start ``tuner search`` in its own process (``--resume`` when the study exists and has ended); watch it
    through the study's endpoints and events."""
    state.reap_searches()
    if req.study in state.searches:
        raise HTTPException(status.HTTP_409_CONFLICT, f"study {req.study!r} is already being searched by this API")
    run = state.repo().get_run(req.study) if state.database_exists() and state.schema_ready() else None
    if run is not None and run.state == "running":
        raise HTTPException(status.HTTP_409_CONFLICT, f"study {req.study!r} is running already")
    argv = search_argv(state.settings, req, resume=run is not None)
    out_dir = state.settings.search_out_dir / req.study
    log_path = out_dir / "search.log"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
    except OSError as exc:
        _logger.error("cannot start search %r with %s: %s", req.study, argv, exc)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"cannot start {argv[0]!r}: {exc.strerror or exc}; set TUNER_API_SEARCH_COMMAND",
        ) from None
    state.watch_search(req.study, proc)
    _logger.info("started search %r as pid %d: %s (log %s)", req.study, proc.pid, argv, log_path)
    return SearchStarted(study=req.study, pid=proc.pid, argv=argv, log_path=str(log_path))


@router.post("/api/studies/{name}/stop", response_model=StopResult, status_code=status.HTTP_202_ACCEPTED,
             responses=_STOP)  # fmt: skip
def stop_search(run: RunDep, state: StateDep) -> StopResult:
    """Send SIGINT to the search process (it ends cleanly and exports the best so far); same host only."""
    name = run.study_name
    if run.state != "running":
        raise HTTPException(status.HTTP_409_CONFLICT, f"study {name!r} is not running (state {run.state!r})")
    settings = run.settings or {}
    # the search records itself as run_pid/run_host (pid/host in runs before 2026-11-30)
    pid = settings.get("run_pid", settings.get("pid"))
    host, here = settings.get("run_host", settings.get("host")), socket.gethostname()
    if not isinstance(pid, int) or pid <= 1:
        raise HTTPException(status.HTTP_409_CONFLICT, f"study {name!r} recorded no process id to signal")
    if host != here:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"study {name!r} runs on host {host!r}, this API on {here!r}; stop it there"
        )
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        raise HTTPException(status.HTTP_409_CONFLICT, f"process {pid} of study {name!r} no longer exists") from None
    except PermissionError:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"not allowed to signal process {pid} of study {name!r}"
        ) from None
    _logger.info("sent SIGINT to search %r (pid %d)", name, pid)
    state.reap_searches()
    return StopResult(study=name, pid=pid, signal="SIGINT")
