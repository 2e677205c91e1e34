"""Rows of the ``tuner_`` tables turned into response models."""

from __future__ import annotations

import math

from api.schemas import (
    MeasurementOut,
    StudyDetail,
    StudySummary,
    TrialDetail,
    TrialSummary,
)
from storage import Run, TrialRecord
from storage.segments import elapsed_s, first_started_at, segments, total_budget_s


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def speedup(run: Run) -> float | None:
    """Best value relative to the baseline, as a factor > 1 when better (for either direction)."""
    best, base = finite(run.best_value), finite(run.baseline_value)
    if best is None or base is None or best == 0 or base == 0:
        return None
    return best / base if run.direction == "maximize" else base / best


def study_summary(run: Run, counts: dict[str, int]) -> StudySummary:
    return StudySummary(
        name=run.study_name,
        state=run.state,
        target=run.target,
        direction=run.direction,
        objective=run.objective,
        unit=run.unit,
        space=run.space_name,
        budget_s=total_budget_s(run),
        elapsed_s=round(elapsed_s(run), 3),
        segments=len(segments(run)),
        started_at=first_started_at(run),
        ended_at=run.ended_at,
        n_trials=sum(counts.values()),
        trials_by_outcome=counts,
        best_value=finite(run.best_value),
        best_trial_number=run.best_trial_number,
        baseline_value=finite(run.baseline_value),
        speedup_vs_baseline=speedup(run),
    )


def study_detail(run: Run, counts: dict[str, int]) -> StudyDetail:
    return StudyDetail(
        **study_summary(run, counts).model_dump(),
        space_yaml=run.space_yaml,
        export_dir=run.export_dir,
        settings=run.settings or {},
    )


def _trial_fields(rec: TrialRecord) -> dict:
    return dict(
        number=rec.number,
        state=rec.state,
        outcome=rec.outcome,
        value=finite(rec.value),
        params=rec.params or {},
        is_baseline=bool(rec.is_baseline),
        worker=rec.worker or "",
        reason=rec.reason or "",
        started_at=rec.started_at,
        finished_at=rec.finished_at,
        duration_s=finite(rec.duration_s),
    )


def trial_summary(rec: TrialRecord) -> TrialSummary:
    return TrialSummary(**_trial_fields(rec))


def trial_detail(rec: TrialRecord) -> TrialDetail:
    return TrialDetail(
        **_trial_fields(rec),
        log_excerpt=rec.log_excerpt or "",
        measurements=[
            MeasurementOut(metric=m.metric, level=m.level, value=finite(m.value), unit=m.unit) for m in rec.measurements
        ],
    )
