"""Studies: the list, one study, its best trial, parameter importances and environment."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from api import convert
from api.deps import RepoDep, RunDep, StateDep
from api.schemas import (
    NOT_FOUND,
    UNAVAILABLE,
    BestOut,
    EnvironmentOut,
    ImportancesOut,
    StudyDetail,
    StudySummary,
)
from storage.queries import config_runs, outcome_counts_by_run, trial_page

router = APIRouter(prefix="/api/studies", tags=["studies"], responses=UNAVAILABLE)


@router.get("", response_model=list[StudySummary])
def list_studies(state: StateDep) -> list[StudySummary]:
    """Every study, newest first, with its state, budget, elapsed time, trials by outcome and best value."""
    if not state.schema_ready():
        return []
    repo = state.repo()
    counts = outcome_counts_by_run(repo)
    return [convert.study_summary(run, counts.get(run.id, {})) for run in repo.list_runs()]


@router.get("/{name}", responses=NOT_FOUND, response_model=StudyDetail)
def get_study(run: RunDep, repo: RepoDep) -> StudyDetail:
    return convert.study_detail(run, repo.outcome_counts(run.id))


@router.get("/{name}/best", responses=NOT_FOUND, response_model=BestOut)
def get_best(run: RunDep, repo: RepoDep) -> BestOut:
    """The best trial so far with every measurement, and the exported launch script when there is one."""
    if run.best_trial_number is None or run.best_value is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"study {run.study_name!r} has no complete trial yet")
    rec = repo.get_trial(run.id, run.best_trial_number)
    if rec is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"best trial {run.best_trial_number} of study {run.study_name!r} not found"
        )
    script = next((a for a in repo.list_artifacts(run.id) if a.kind == "launch_script"), None)
    runs = config_runs(repo, run.id, rec.params or {}) or [rec.number]
    _, top = trial_page(repo, run.id, outcome="ok", sort="value", descending=run.direction == "maximize", limit=1)
    single = top[0].number if top else None
    return BestOut(
        study=run.study_name,
        value=run.best_value,
        baseline_value=convert.finite(run.baseline_value),
        speedup_vs_baseline=convert.speedup(run),
        trial=convert.trial_detail(rec),
        launch_script=script.content.decode("utf-8", "replace") if script else None,
        runs=runs,
        single_best_trial=single,
        why=best_why(rec.number, runs, single),
    )


def best_why(number: int, runs: list[int], single: int | None) -> str:
    """The dashboard's word on the best row: a median over re-runs, and Optuna's best trial beside it."""
    median = (f"the median of {len(runs)} runs of this configuration (trials {', '.join(map(str, runs))})"
              if len(runs) > 1 else "this configuration's one run")  # fmt: skip
    if single is None or single == number:
        return f"Best: trial {number}, {median}; it is also Optuna's best trial."
    if single in runs:
        return f"Best: trial {number}, {median}; Optuna's best trial {single} is another run of it."
    return (
        f"Best: trial {number}, {median}. Optuna's best trial is {single}, the single best timing of another "
        "configuration: the search prefers a configuration confirmed by re-runs to one timed once, which may "
        "be a lucky draw."
    )


@router.get("/{name}/importances", responses=NOT_FOUND, response_model=ImportancesOut)
def get_importances(run: RunDep, state: StateDep) -> ImportancesOut:
    """Parameter importances (Optuna's default evaluator) over the completed trials (Optuna's); computed once,
    then refreshed at most every ``derived_refresh_s`` while the study changes."""
    return state.importances(run)


@router.get("/{name}/environment", responses=NOT_FOUND, response_model=EnvironmentOut)
def get_environment(run: RunDep) -> EnvironmentOut:
    """The hardware and software the search ran on (GPU, driver, torch, triton, server versions)."""
    return EnvironmentOut(study=run.study_name, environment=run.environment or {})
