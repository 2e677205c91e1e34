"""Read queries shared by the API and the CLI: the one trial page (filter, sort, page) and aggregates in one
statement, not one per study. ``Repo.list_trials`` is this page too."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from storage.models import Event, TrialRecord


class HasSession(Protocol):
    """What a query needs of a store: a session (``storage.repo.Repo`` is one). A protocol, so that ``repo`` may
    import these queries and these queries never import ``repo``."""

    def session(self) -> Session: ...


SORT_KEYS = ("number", "value", "duration")


def outcome_counts_by_run(repo: HasSession) -> dict[int, dict[str, int]]:
    """``{run_id: {outcome: n}}`` for every run in one grouped query (served by the run/outcome index)."""
    q = select(TrialRecord.run_id, TrialRecord.outcome, func.count()).group_by(TrialRecord.run_id, TrialRecord.outcome)
    out: dict[int, dict[str, int]] = {}
    with repo.session() as s:
        for run_id, outcome, n in s.execute(q):
            out.setdefault(run_id, {})[outcome or "running"] = int(n)
    return out


def last_event_id(repo: HasSession, run_id: int) -> int:
    """The newest event id of a run: a cheap version number for caches of derived views (plots, importances)."""
    with repo.session() as s:
        return int(s.scalar(select(func.max(Event.id)).where(Event.run_id == run_id)) or 0)


def trial_page(
    repo: HasSession,
    run_id: int,
    *,
    state: str | None = None,
    outcome: str | None = None,
    sort: str = "number",
    descending: bool = False,
    offset: int = 0,
    limit: int | None = 50,
    with_measurements: bool = False,
) -> tuple[int, list[TrialRecord]]:
    """``(total matching, one page)`` of trials sorted by number, value or duration (missing values last, in
    either order; ties in creation order), cheaply; ``limit=None`` for every trial from ``offset`` on.

    The page's ids are chosen first on narrow rows (index-only for ``number`` and ``value``), then only those
    rows are loaded: no sort ever carries the wide columns (params, log excerpt) of every trial.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"`sort` must be one of {SORT_KEYS}, but got {sort!r}.")
    where = [TrialRecord.run_id == run_id]
    if state:
        where.append(TrialRecord.state == state)
    if outcome:
        where.append(TrialRecord.outcome == outcome)
    ids_of = select(TrialRecord.id).where(*where)
    with repo.session() as s:
        total = s.scalar(select(func.count()).select_from(TrialRecord).where(*where)) or 0
        if offset >= total:
            return total, []
        if sort == "number":
            order = TrialRecord.number.desc() if descending else TrialRecord.number.asc()
            ids = list(s.scalars(ids_of.order_by(order).offset(offset).limit(limit)))
        else:
            col = {"value": TrialRecord.value, "duration": TrialRecord.duration_s}[sort]
            present = s.scalar(select(func.count()).select_from(TrialRecord).where(*where, col.is_not(None))) or 0
            ids = []
            if offset < present:
                # ties broken by id (the index's own order, creation order), so the (run_id, value) index
                # serves the whole ORDER BY with no sort step
                order = (col.desc(), TrialRecord.id.desc()) if descending else (col.asc(), TrialRecord.id.asc())
                page = ids_of.where(col.is_not(None)).order_by(*order)
                ids = list(s.scalars(page.offset(offset).limit(limit)))
            if limit is None or len(ids) < limit:
                rest = ids_of.where(col.is_(None)).order_by(TrialRecord.number)
                room = None if limit is None else limit - len(ids)
                ids += s.scalars(rest.offset(max(0, offset - present)).limit(room))
        load = select(TrialRecord).where(TrialRecord.id.in_(ids))
        if with_measurements:
            load = load.options(selectinload(TrialRecord.measurements))
        rows = {r.id: r for r in s.scalars(load)} if ids else {}
    return total, [rows[i] for i in ids]


def config_runs(repo: HasSession, run_id: int, params: dict) -> list[int]:
    """Numbers of the ``ok`` trials that measured exactly these params (not answered from an earlier timing:
    ``repeat_of`` unset): the runs a recorded best's median is taken over."""
    q = select(TrialRecord.number, TrialRecord.params).where(
        TrialRecord.run_id == run_id,
        TrialRecord.outcome == "ok",
        TrialRecord.value.is_not(None),
        TrialRecord.repeat_of.is_(None),
    )
    with repo.session() as s:
        return sorted(n for n, p in s.execute(q) if p == params)
