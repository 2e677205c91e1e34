"""Read queries the API needs beyond ``storage.Repo``: aggregates in one statement, not one per study."""

from __future__ import annotations

from sqlalchemy import func, select

from storage import Event, Repo, TrialRecord


def outcome_counts_by_run(repo: Repo) -> dict[int, dict[str, int]]:
    """``{run_id: {outcome: n}}`` for every run in one grouped query (served by the run/outcome index)."""
    q = select(TrialRecord.run_id, TrialRecord.outcome, func.count()).group_by(
        TrialRecord.run_id, TrialRecord.outcome
    )
    out: dict[int, dict[str, int]] = {}
    with repo.session() as s:
        for run_id, outcome, n in s.execute(q):
            out.setdefault(run_id, {})[outcome or "running"] = int(n)
    return out


def last_event_id(repo: Repo, run_id: int) -> int:
    """The newest event id of a run: a cheap version number for caches of derived views (plots, importances)."""
    with repo.session() as s:
        return int(s.scalar(select(func.max(Event.id)).where(Event.run_id == run_id)) or 0)

