"""api.queries: the cheap trial page agrees with Repo.list_trials; grouped outcome counts agree per run."""

from __future__ import annotations

import pytest
from api_search_data import MIXED, STUDY

from api.queries import outcome_counts_by_run, trial_page
from storage import Repo


@pytest.mark.parametrize("study", [STUDY, MIXED])
@pytest.mark.parametrize("sort", ["number", "value", "duration"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("state", [None, "complete", "failed"])
def test_trial_page_matches_repo(db_url: str, study: str, sort: str, descending: bool, state: str | None) -> None:
    repo = Repo(db_url)
    run = repo.get_run(study)
    key = {"number": "number", "value": "value", "duration": "duration_s"}[sort]
    for offset, limit in ((0, 3), (2, 4), (0, 100), (50, 10)):
        total, page = trial_page(repo, run.id, state=state, sort=sort, descending=descending, offset=offset,
                                 limit=limit)  # fmt: skip
        ref = repo.list_trials(run.id, state=state, sort=sort, descending=descending, offset=offset, limit=limit)
        assert total == repo.count_trials(run.id, state=state)
        # equal keys may come in another order (ties by id here, by number there): compare the keys
        assert [getattr(t, key) for t in page] == [getattr(t, key) for t in ref]


def test_outcome_counts_by_run(db_url: str) -> None:
    repo = Repo(db_url)
    counts = outcome_counts_by_run(repo)
    for run in repo.list_runs():
        assert counts[run.id] == repo.outcome_counts(run.id)
