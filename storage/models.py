"""SQLAlchemy 2 models of the ``tuner_`` tables.

- ``tuner_runs``: one row per study: target, budget, the space as given, state, baseline, environment.
- ``tuner_trials``: one row per trial attempt: params, outcome class, objective value, timings, log excerpt.
- ``tuner_measurements``: every metric at every level (concurrency, shape) of a trial.
- ``tuner_events``: an append-only feed (trial started/finished/pruned/failed, new best, search ended) that the
  API streams without polling Optuna.
- ``tuner_artifacts``: exported files (launch script, best params, kernel configs), content kept in the database.
- ``tuner_failed_flags``: flag sets whose launch failed (the server's version, command, environment and flags
  hashed into ``key``), so a study in this database never spends a launch on one twice.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from storage.types import OUTCOMES  # noqa: F401 - re-exported

RUN_STATES = ("running", "finished", "interrupted", "failed")


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "tuner_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_name: Mapped[str] = mapped_column(String(255), unique=True, index=True)
    target: Mapped[str] = mapped_column(String(64))
    direction: Mapped[str] = mapped_column(String(16), default="maximize")
    objective: Mapped[str] = mapped_column(String(255), default="")
    unit: Mapped[str] = mapped_column(String(32), default="")
    budget_s: Mapped[float] = mapped_column(Float)
    space_name: Mapped[str] = mapped_column(String(255), default="")
    space_yaml: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    baseline_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    environment: Mapped[dict] = mapped_column(JSON, default=dict)
    settings: Mapped[dict] = mapped_column(JSON, default=dict)
    export_dir: Mapped[str | None] = mapped_column(Text, nullable=True)

    trials: Mapped[list[TrialRecord]] = relationship(back_populates="run", cascade="all, delete-orphan")


class TrialRecord(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (
        UniqueConstraint("run_id", "number", name="uq_tuner_trials_run_number"),
        Index("ix_tuner_trials_run_outcome", "run_id", "outcome"),
        Index("ix_tuner_trials_run_value", "run_id", "value"),
        Index("ix_tuner_trials_run_state", "run_id", "state"),
        Index("ix_tuner_trials_run_duration", "run_id", "duration_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    """Optuna's trial number within the study."""
    state: Mapped[str] = mapped_column(String(16), default="running")
    """running | complete | failed | pruned (mirrors Optuna's view)."""
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    log_excerpt: Mapped[str] = mapped_column(Text, default="")
    worker: Mapped[str] = mapped_column(String(255), default="")
    is_baseline: Mapped[bool] = mapped_column(default=False)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    repeat_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The earlier trial whose timing this one copies: its configuration was timed already, so it was not run."""

    run: Mapped[Run] = relationship(back_populates="trials")
    measurements: Mapped[list[Measurement]] = relationship(
        back_populates="trial", cascade="all, delete-orphan", order_by="Measurement.id"
    )


class Measurement(Base):
    __tablename__ = "tuner_measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id", ondelete="CASCADE"), index=True)
    metric: Mapped[str] = mapped_column(String(64))
    level: Mapped[str] = mapped_column(String(64), default="")
    """What the metric was measured at: ``c=16`` (concurrency), a shape key, or empty for a whole-trial figure."""
    value: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32), default="")

    trial: Mapped[TrialRecord] = relationship(back_populates="measurements")


class Event(Base):
    __tablename__ = "tuner_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    """trial_started | trial_finished | trial_pruned | trial_failed | new_best | search_ended."""
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Artifact(Base):
    __tablename__ = "tuner_artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    """launch_script | best_params | kernel_config | report."""
    name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text, default="")
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class FailedFlagSet(Base):
    """A server launch that failed in a way a rerun of the same flags would repeat (refused flags, OOM, crash)."""

    __tablename__ = "tuner_failed_flags"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), index=True)
    """A hash of everything that makes the launch what it is: server version, command, environment, flags, GPUs."""
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    args: Mapped[list] = mapped_column(JSON, default=list)
    server_version: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
