"""Response and request models of the API (what /openapi.json describes)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from storage.models import OUTCOMES
from storage.names import STUDY_NAME_PATTERN

TrialState = Literal["running", "complete", "failed", "pruned"]
Outcome = Literal[OUTCOMES]  # type: ignore[valid-type]
SortKey = Literal["number", "value", "duration"]
Order = Literal["asc", "desc"]
TargetName = Literal["kernels", "workload", "sglang"]


def _utc(t: datetime) -> datetime:
    """The ``tuner_`` tables store naive UTC; the API says so (``+00:00``), so no client reads it as local time."""
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


UtcDateTime = Annotated[datetime, AfterValidator(_utc)]


def _not_bool(v: Any) -> Any:
    """An integer as JSON Schema means it (``1`` or ``1.0``), never ``true``/``false`` (Python counts them ints)."""
    if isinstance(v, bool):
        raise ValueError(f"an integer is required, but got the boolean {str(v).lower()}")  # noqa: TRY004 - pydantic needs ValueError
    return v


class ErrorOut(BaseModel):
    detail: str = Field(description="what was wrong, naming the thing and its value")


_ERROR_JSON = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
# the media type is spelled out: a route whose own responses are not JSON (the event stream) still answers its
# errors in JSON
NOT_FOUND = {
    404: {
        "model": ErrorOut,
        "content": _ERROR_JSON,
        "description": "no study of that name (or no such trial, artifact, best)",
    }
}
UNAVAILABLE = {
    503: {
        "model": ErrorOut,
        "content": _ERROR_JSON,
        "description": "the storage cannot be reached, or holds no database file",
    }
}


class StudySummary(BaseModel):
    name: str
    state: str = Field(description="running | finished | interrupted | failed")
    target: str
    direction: str
    objective: str
    unit: str
    space: str
    budget_s: float = Field(description="the budgets of every search of the study together (a resume adds one)")
    elapsed_s: float = Field(description="seconds searched, every segment together, without the gaps between them")
    segments: int = Field(description="searches of this study: 1, plus 1 per resume")
    started_at: UtcDateTime
    ended_at: UtcDateTime | None
    n_trials: int
    trials_by_outcome: dict[str, int] = Field(description="outcome -> count; `running` for unfinished trials")
    best_value: float | None
    best_trial_number: int | None
    baseline_value: float | None
    speedup_vs_baseline: float | None = Field(description="best relative to the baseline config (× baseline)")


class StudyDetail(StudySummary):
    space_yaml: str
    export_dir: str | None
    settings: dict[str, Any]


class TrialSummary(BaseModel):
    number: int
    state: str
    outcome: str | None
    value: float | None
    params: dict[str, Any]
    is_baseline: bool
    worker: str
    reason: str
    started_at: UtcDateTime
    finished_at: UtcDateTime | None
    duration_s: float | None


class MeasurementOut(BaseModel):
    metric: str
    level: str
    value: float | None
    unit: str


class TrialDetail(TrialSummary):
    log_excerpt: str
    measurements: list[MeasurementOut]


class TrialPage(BaseModel):
    total: int = Field(description="trials matching the filters, all pages together")
    offset: int
    limit: int
    items: list[TrialSummary]


class BestOut(BaseModel):
    study: str
    value: float
    baseline_value: float | None
    speedup_vs_baseline: float | None
    trial: TrialDetail
    launch_script: str | None = Field(description="the exported launch script, when the search wrote one")
    runs: list[int] = Field(description="the trials that timed this configuration; `value` is their median")
    single_best_trial: int | None = Field(
        description="Optuna's best trial: the single best timing, which may be another configuration's lucky draw"
    )
    why: str = Field(description="why `trial` is the best, and how it relates to Optuna's best trial")


class ParamImportance(BaseModel):
    param: str
    importance: float


class ImportancesOut(BaseModel):
    study: str
    n_complete: int
    importances: list[ParamImportance] = Field(description="most important first; empty when `reason` is set")
    reason: str = Field(default="", description="why the list is empty")


class ArtifactOut(BaseModel):
    name: str
    kind: str
    path: str
    size: int
    created_at: UtcDateTime
    url: str


class EnvironmentOut(BaseModel):
    study: str
    environment: dict[str, Any]


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    storage: str
    control_enabled: bool


class EventOut(BaseModel):
    id: int
    kind: str
    trial_number: int | None
    payload: dict[str, Any]
    created_at: UtcDateTime


class SearchRequest(BaseModel):
    study: str = Field(
        pattern=STUDY_NAME_PATTERN,
        examples=["dsv4-tiny-1"],
        description="the study to create or resume (storage.names: the one rule for study names)",
    )
    budget_s: float = Field(gt=0, le=7 * 86400, description="wall-clock budget of the search in seconds")
    space: str = Field(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}$",
        description="a search space name (e.g. dsv4_flash_tiny) or a path to a YAML file",
        examples=["dsv4_flash_tiny"],
    )
    target: TargetName = "workload"
    # the bounds before the validator, so that the schema says minimum/maximum
    n_trials: Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_not_bool)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(_not_bool)] | None = None


class SearchStarted(BaseModel):
    study: str
    pid: int
    argv: list[str]
    log_path: str


class StopResult(BaseModel):
    study: str
    pid: int
    signal: str
