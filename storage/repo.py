"""Queries over the ``tuner_`` tables. One :class:`Repo` per process; it is thread-safe (one session per call)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, selectinload, sessionmaker

from storage.engine import make_engine
from storage.models import OUTCOMES, Artifact, Base, Event, FailedFlagSet, Measurement, Run, TrialRecord, utcnow
from storage.names import check_study_name
from storage.queries import trial_page
from storage.segments import (
    EARLIER_SEGMENTS,
    Segment,
    elapsed_s,  # noqa: F401 - re-exported: the CLI and the API import it from here
)
from storage.types import MetricRow

_logger = logging.getLogger(__name__)
_UPGRADED: set[str] = set()
"""Database URLs this process already brought up to the current tables (see ``storage.migrate``)."""


def _newest_event(s, run_id: int, kind: str, after_id: int = 0) -> Event | None:
    """The run's newest event of ``kind`` with an id above ``after_id`` (in session ``s``)."""
    return s.scalars(
        select(Event)
        .where(Event.run_id == run_id, Event.kind == kind, Event.id > after_id)
        .order_by(Event.id.desc())
        .limit(1)
    ).first()


class Repo:
    """The project's own tables on one database URL (the same URL Optuna's ``RDBStorage`` uses)."""

    def __init__(
        self, url: str | None = None, *, engine: Engine | None = None, pool_size: int = 5, create: bool = True
    ) -> None:
        """``create=False`` for readers (``tuner status``, the API): a missing SQLite file is a
        :class:`StorageError`, never a new empty database."""
        if engine is None:
            if url is None:
                raise ValueError("Repo needs a `url` or an `engine`, got neither.")
            engine = make_engine(url, pool_size=pool_size, create=create)
        self.engine = engine
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._upgrade_once()

    # -- schema -------------------------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create the ``tuner_`` tables if missing. Called once by the process that starts a search."""
        Base.metadata.create_all(self.engine)
        self._upgrade_once(force=True)

    def _upgrade_once(self, force: bool = False) -> None:
        """An existing database from an older ``tuner`` gets the columns added since (once per URL and process)."""
        key = str(self.engine.url)
        if key in _UPGRADED and not force:
            return
        from storage.migrate import missing_columns, upgrade

        try:
            if missing_columns(self.engine):
                upgrade(self.engine)
        except Exception as exc:  # noqa: BLE001 - e.g. a read-only file: reads of the old columns still work
            _logger.warning("storage %s could not be upgraded: %s", self.engine.url, str(exc).splitlines()[0])
            return
        _UPGRADED.add(key)

    def has_schema(self) -> bool:
        from sqlalchemy import inspect

        return inspect(self.engine).has_table(Run.__tablename__)

    def session(self) -> Session:
        return self._session()

    # -- runs ---------------------------------------------------------------------------------------------
    def create_run(
        self,
        study_name: str,
        *,
        target: str,
        budget_s: float,
        direction: str = "maximize",
        objective: str = "",
        unit: str = "",
        space_name: str = "",
        space_yaml: str = "",
        environment: dict | None = None,
        settings: dict | None = None,
    ) -> Run:
        """A new run; ``study_name`` must follow :func:`storage.names.check_study_name` (else StudyNameError)."""
        check_study_name(study_name)
        with self.session() as s, s.begin():
            run = Run(
                study_name=study_name,
                target=target,
                budget_s=budget_s,
                direction=direction,
                objective=objective,
                unit=unit,
                space_name=space_name,
                space_yaml=space_yaml,
                environment=environment or {},
                settings=settings or {},
            )
            s.add(run)
        return run

    def get_run(self, study_name: str) -> Run | None:
        with self.session() as s:
            return s.scalar(select(Run).where(Run.study_name == study_name))

    def list_runs(self) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).order_by(Run.started_at.desc(), Run.id.desc())))

    def restart_run(
        self, run_id: int, *, budget_s: float, environment: dict | None = None, settings: dict | None = None
    ) -> None:
        """Mark a resumed run as running again: a new segment with the new budget (see :mod:`storage.segments`).

        The segment that ended is kept in ``settings["earlier_segments"]``; one left running by a process that died
        ends at its last event. ``settings`` (the new process's pid and host) are merged over the old ones.
        """
        with self.session() as s, s.begin():
            run = s.get(Run, run_id)
            if run is None:
                raise ValueError(f"`run_id` {run_id} names no run in this storage.")
            ended = run.ended_at or s.scalar(select(func.max(Event.created_at)).where(Event.run_id == run_id))
            done = Segment(run.started_at, max(ended or run.started_at, run.started_at), run.budget_s)
            old = dict(run.settings or {})
            earlier = [*(old.get(EARLIER_SEGMENTS) or []), done.to_json()]
            run.settings = {**old, **(settings or {}), EARLIER_SEGMENTS: earlier}
            run.state, run.ended_at, run.budget_s, run.started_at = "running", None, budget_s, utcnow()
            if environment is not None:
                run.environment = environment

    def set_baseline(self, run_id: int, value: float) -> None:
        """Record the baseline's value every ratio uses (the median over its runs, once it was re-run)."""
        with self.session() as s, s.begin():
            s.execute(update(Run).where(Run.id == run_id).values(baseline_value=value))

    def set_best(self, run_id: int, number: int, value: float) -> None:
        """Record the run's chosen best (e.g. the best median over confirmation re-runs, not the luckiest timing)."""
        with self.session() as s, s.begin():
            s.execute(update(Run).where(Run.id == run_id).values(best_trial_number=number, best_value=value))

    def end_run(self, run_id: int, state: str, *, export_dir: str | None = None, reason: str = "") -> None:
        """End the run; ``reason`` (why the search stopped, e.g. that its last stage converged and how much budget
        it left) goes into the ``search_ended`` event, where :meth:`end_reason`, ``tuner status`` and the API's
        event feed read it."""
        with self.session() as s, s.begin():
            values: dict = {"state": state, "ended_at": utcnow()}
            if export_dir is not None:
                values["export_dir"] = export_dir
            s.execute(update(Run).where(Run.id == run_id).values(**values))
            payload = {"state": state, **({"reason": reason} if reason else {})}
            s.add(Event(run_id=run_id, kind="search_ended", payload=payload))

    def add_stage(self, run_id: int, index: int, name: str, line: str) -> None:
        """The search moved to stage ``index`` (``tuner.search.stages``): a ``stage_started`` event, which the
        ``tuner worker`` processes of the study follow (:meth:`current_stage`) and the API's feed carries."""
        with self.session() as s, s.begin():
            s.add(Event(run_id=run_id, kind="stage_started", payload={"index": index, "name": name, "line": line}))

    def current_stage(self, run_id: int) -> int:
        """The stage the run's current search is in: the newest ``stage_started`` since its last ``search_ended``
        (a resumed study starts its stages again), 0 when none."""
        with self.session() as s:
            ended = _newest_event(s, run_id, "search_ended")
            ev = _newest_event(s, run_id, "stage_started", after_id=ended.id if ended is not None else 0)
        return int((ev.payload or {}).get("index", 0)) if ev is not None else 0

    def end_reason(self, run_id: int) -> str:
        """Why the run's last search stopped (its newest ``search_ended`` event), or "" when it did not say."""
        with self.session() as s:
            ev = _newest_event(s, run_id, "search_ended")
        return str((ev.payload or {}).get("reason", "")) if ev is not None else ""

    # -- trials -------------------------------------------------------------------------------------------
    def start_trial(
        self, run_id: int, number: int, params: dict, *, worker: str = "", is_baseline: bool = False
    ) -> int:
        with self.session() as s, s.begin():
            rec = s.scalar(select(TrialRecord).where(TrialRecord.run_id == run_id, TrialRecord.number == number))
            if rec is None:
                rec = TrialRecord(run_id=run_id, number=number)
                s.add(rec)
            rec.params = dict(params)
            rec.state = "running"
            rec.worker = worker
            rec.is_baseline = is_baseline
            rec.started_at = utcnow()
            s.add(Event(run_id=run_id, kind="trial_started", trial_number=number, payload={"params": params}))
            s.flush()
            return rec.id

    def finish_trial(
        self,
        run_id: int,
        number: int,
        *,
        outcome: str,
        value: float | None,
        reason: str = "",
        log_excerpt: str = "",
        metrics: Iterable[MetricRow] = (),
        duration_s: float | None = None,
        repeat_of: int | None = None,
    ) -> bool:
        """Record how a trial ended; return True when it is the run's new best (``ok`` outcomes only).
        ``repeat_of``: the earlier trial whose timing this one copies (the configuration was not run again)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"`outcome` must be one of {OUTCOMES}, but got {outcome!r}.")
        state = "complete" if outcome == "ok" else ("pruned" if outcome == "pruned" else "failed")
        with self.session() as s, s.begin():
            run = s.get(Run, run_id, with_for_update=False)
            rec = s.scalar(select(TrialRecord).where(TrialRecord.run_id == run_id, TrialRecord.number == number))
            if rec is None:
                rec = TrialRecord(run_id=run_id, number=number, params={})
                s.add(rec)
            rec.state = state
            rec.outcome = outcome
            rec.value = value if outcome == "ok" else None
            rec.reason = reason[:4000]
            rec.log_excerpt = log_excerpt[-8000:]
            rec.finished_at = utcnow()
            rec.duration_s = duration_s
            rec.repeat_of = repeat_of
            s.flush()
            for m in metrics:
                s.add(Measurement(trial_id=rec.id, metric=m.metric, level=m.level, value=m.value, unit=m.unit))
            kind = {"complete": "trial_finished", "pruned": "trial_pruned"}.get(state, "trial_failed")
            payload = {"outcome": outcome, "value": rec.value, "reason": reason[:300], "duration_s": duration_s}
            s.add(Event(run_id=run_id, kind=kind, trial_number=number, payload=payload))
            new_best = False
            if outcome == "ok" and value is not None:
                if rec.is_baseline and run.baseline_value is None:
                    run.baseline_value = value
                better = (
                    run.best_value is None
                    or (run.direction == "maximize" and value > run.best_value)
                    or (run.direction == "minimize" and value < run.best_value)
                )
                if better:
                    run.best_value = value
                    run.best_trial_number = number
                    new_best = True
                    s.add(
                        Event(
                            run_id=run_id,
                            kind="new_best",
                            trial_number=number,
                            payload={"value": value, "params": rec.params},
                        )
                    )
            return new_best

    def get_trial(self, run_id: int, number: int) -> TrialRecord | None:
        with self.session() as s:
            return s.scalar(
                select(TrialRecord)
                .options(selectinload(TrialRecord.measurements))
                .where(TrialRecord.run_id == run_id, TrialRecord.number == number)
            )

    def list_trials(
        self,
        run_id: int,
        *,
        state: str | None = None,
        outcome: str | None = None,
        sort: str = "number",
        descending: bool = False,
        offset: int = 0,
        limit: int | None = None,
        with_measurements: bool = False,
    ) -> list[TrialRecord]:
        """The trials of a run, filtered, sorted and paged by :func:`storage.queries.trial_page` (missing values
        last in either order); every trial by default."""
        return trial_page(
            self,
            run_id,
            state=state,
            outcome=outcome,
            sort=sort,
            descending=descending,
            offset=offset,
            limit=limit,
            with_measurements=with_measurements,
        )[1]

    def trials_from(self, run_id: int, above: int, also: Iterable[int] = ()) -> list[TrialRecord]:
        """The trials numbered above ``above`` and those numbered in ``also``, by number: what changed since a
        reader last saw the run, when it keeps the finished ones it read (they do not change)."""
        also = sorted(set(also))
        cond = TrialRecord.number > above
        if also:
            cond = cond | TrialRecord.number.in_(also)
        with self.session() as s:
            return list(
                s.scalars(select(TrialRecord).where(TrialRecord.run_id == run_id, cond).order_by(TrialRecord.number))
            )

    def count_trials(self, run_id: int, *, state: str | None = None, outcome: str | None = None) -> int:
        q = select(func.count()).select_from(TrialRecord).where(TrialRecord.run_id == run_id)
        if state:
            q = q.where(TrialRecord.state == state)
        if outcome:
            q = q.where(TrialRecord.outcome == outcome)
        with self.session() as s:
            return int(s.scalar(q) or 0)

    def outcome_counts(self, run_id: int) -> dict[str, int]:
        q = select(TrialRecord.outcome, func.count()).where(TrialRecord.run_id == run_id).group_by(TrialRecord.outcome)
        with self.session() as s:
            return {(o or "running"): int(n) for o, n in s.execute(q)}

    def baseline_trial(self, run_id: int) -> TrialRecord | None:
        with self.session() as s:
            return s.scalar(
                select(TrialRecord)
                .options(selectinload(TrialRecord.measurements))
                .where(TrialRecord.run_id == run_id, TrialRecord.is_baseline.is_(True))
                .order_by(TrialRecord.number)
                .limit(1)
            )

    # -- failed flag sets ---------------------------------------------------------------------------------
    def remember_failed_flags(
        self,
        run_id: int,
        trial_number: int,
        *,
        key: str,
        outcome: str,
        reason: str,
        args: Sequence[str],
        server_version: str = "",
    ) -> None:
        """Keep a launch that failed (``key`` names the server, command, environment and flags)."""
        with self.session() as s:
            s.add(
                FailedFlagSet(
                    key=key,
                    run_id=run_id,
                    trial_number=trial_number,
                    outcome=outcome,
                    reason=reason[:2000],
                    args=list(args),
                    server_version=server_version,
                )
            )
            s.commit()

    def failed_flags(self, key: str) -> FailedFlagSet | None:
        """The latest failure of the launch ``key`` in this database (any study), or ``None``."""
        with self.session() as s:
            q = select(FailedFlagSet).where(FailedFlagSet.key == key).order_by(FailedFlagSet.id.desc()).limit(1)
            return s.scalars(q).first()

    def failed_flag_history(self, key: str, run_id: int | None = None) -> list[FailedFlagSet]:
        """Every kept failure of the launch ``key``, oldest first: of study run ``run_id``, or of every study."""
        with self.session() as s:
            q = select(FailedFlagSet).where(FailedFlagSet.key == key)
            if run_id is not None:
                q = q.where(FailedFlagSet.run_id == run_id)
            return list(s.scalars(q.order_by(FailedFlagSet.id)))

    def mark_stale_running(self, run_id: int, *, reason: str) -> list[int]:
        """Turn trials left ``running`` by a dead process into ``crash`` failures; return their numbers."""
        with self.session() as s, s.begin():
            recs = list(
                s.scalars(select(TrialRecord).where(TrialRecord.run_id == run_id, TrialRecord.state == "running"))
            )
            for rec in recs:
                rec.state, rec.outcome, rec.reason, rec.finished_at = "failed", "crash", reason, utcnow()
                s.add(
                    Event(
                        run_id=run_id,
                        kind="trial_failed",
                        trial_number=rec.number,
                        payload={"outcome": "crash", "reason": reason},
                    )
                )
            return [r.number for r in recs]

    # -- events -------------------------------------------------------------------------------------------
    def events_after(self, run_id: int, after_id: int = 0, limit: int = 500) -> list[Event]:
        with self.session() as s:
            return list(
                s.scalars(
                    select(Event).where(Event.run_id == run_id, Event.id > after_id).order_by(Event.id).limit(limit)
                )
            )

    # -- artifacts ----------------------------------------------------------------------------------------
    def add_artifacts(self, run_id: int, items: Sequence[tuple[str, str, str, bytes]]) -> None:
        """Store ``(kind, name, path, content)`` items, replacing earlier ones of the same name."""
        with self.session() as s, s.begin():
            names = [name for _, name, _, _ in items]
            for old in s.scalars(select(Artifact).where(Artifact.run_id == run_id, Artifact.name.in_(names))):
                s.delete(old)
            for kind, name, path, content in items:
                s.add(Artifact(run_id=run_id, kind=kind, name=name, path=path, content=content))

    def list_artifacts(self, run_id: int) -> list[Artifact]:
        with self.session() as s:
            return list(s.scalars(select(Artifact).where(Artifact.run_id == run_id).order_by(Artifact.id)))

    def get_artifact(self, run_id: int, name: str) -> Artifact | None:
        with self.session() as s:
            return s.scalar(select(Artifact).where(Artifact.run_id == run_id, Artifact.name == name))
