"""The dashboard page, its static files (plotly.js from the installed ``plotly`` package, never a CDN) and
the plot endpoints it renders (figures made by Optuna's visualization functions, as plotly JSON)."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Annotated

import plotly
from fastapi import APIRouter, Header, Response
from fastapi.responses import FileResponse, HTMLResponse

from api.deps import RepoDep, RunDep, StateDep
from api.schemas import NOT_FOUND, UNAVAILABLE

router = APIRouter(tags=["dashboard"])

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
_FIGURE = {
    200: {"content": {"application/json": {}}, "description": "a plotly figure (`fig.to_json()`)"},
    **NOT_FOUND,
    **UNAVAILABLE,
}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    return HTMLResponse((STATIC_DIR / "dashboard.html").read_text(encoding="utf-8"))


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    return FileResponse(
        STATIC_DIR / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
    )


@functools.cache
def _plotly_gzip() -> bytes:
    """plotly.min.js gzipped once (4.8 MB -> about 1.4 MB), kept for every later request."""
    return gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=6, mtime=0)


@router.get("/vendor/plotly.min.js", include_in_schema=False)
def plotly_js(accept_encoding: Annotated[str, Header()] = "") -> Response:
    headers = {"Cache-Control": "max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" in accept_encoding.lower():
        return Response(_plotly_gzip(), media_type="text/javascript", headers={**headers, "Content-Encoding": "gzip"})
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers=headers)


@router.get("/api/studies/{name}/plots/history", response_class=Response, responses=_FIGURE)
def plot_history(run: RunDep, state: StateDep) -> Response:
    """Optuna's optimization history, best so far against searched seconds, with the baseline as a line
    (refreshed at most every ``derived_refresh_s`` while the study changes)."""
    return Response(state.history_figure(run), media_type="application/json")


@router.get("/api/studies/{name}/plots/importances", response_class=Response, responses=_FIGURE)
def plot_importances(run: RunDep, state: StateDep) -> Response:
    """The importances of ``/importances`` as a bar chart (the same computation, not a second one)."""
    return Response(state.importances_figure(run), media_type="application/json")


@router.get("/api/studies/{name}/plots/front", response_class=Response, responses=_FIGURE)
def plot_front(run: RunDep, repo: RepoDep) -> Response:
    """A goodput study's throughput–latency front (tok/s per GPU against tok/s per user, every load measured) with
    the SLO region marked (:mod:`api.front`); 404 for a study that measured no load of a goodput objective."""
    from fastapi import HTTPException, status

    from api.front import front_figure

    doc = front_figure(run, repo.list_trials(run.id, with_measurements=True))
    if doc is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"study {run.study_name!r} measured no load of a goodput "
            "objective (objective: {metric: goodput_tok_s_per_gpu, slo: {...}}): no front",
        )
    return Response(doc, media_type="application/json")
