"""Trials of a study: a filtered, sorted page, and one trial with every measurement."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from api import convert
from api.deps import RepoDep, RunDep
from api.schemas import (
    NOT_FOUND,
    UNAVAILABLE,
    Order,
    Outcome,
    SortKey,
    TrialDetail,
    TrialPage,
    TrialState,
)
from storage.queries import trial_page

router = APIRouter(prefix="/api/studies", tags=["trials"], responses=UNAVAILABLE)

MAX_PAGE = 1000


@router.get("/{name}/trials", responses=NOT_FOUND, response_model=TrialPage)
def list_trials(
    run: RunDep,
    repo: RepoDep,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    state: Annotated[TrialState | None, Query()] = None,
    outcome: Annotated[Outcome | None, Query()] = None,
    sort: Annotated[SortKey, Query()] = "number",
    order: Annotated[Order, Query()] = "asc",
) -> TrialPage:
    """One page of trials; trials without a value (or duration) sort last in either order."""
    total, items = trial_page(
        repo, run.id, state=state, outcome=outcome, sort=sort, descending=order == "desc", offset=offset, limit=limit
    )
    return TrialPage(total=total, offset=offset, limit=limit, items=[convert.trial_summary(r) for r in items])


@router.get("/{name}/trials/{number}", responses=NOT_FOUND, response_model=TrialDetail)
def get_trial(run: RunDep, repo: RepoDep, number: Annotated[int, Path(ge=0, le=2**31 - 1)]) -> TrialDetail:
    """Params, every measurement, outcome, reason, log excerpt and timings of one trial."""
    rec = repo.get_trial(run.id, number)
    if rec is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {number} of study {run.study_name!r} not found")
    return convert.trial_detail(rec)
