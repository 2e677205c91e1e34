"""storage.queries, the one trial page of the API and the CLI (``Repo.list_trials`` is it too), against a plain
sort in Python, on every backend; and outcome counts of every run in one grouped query."""

from __future__ import annotations

import pytest

from storage.queries import outcome_counts_by_run, trial_page

VALUES = [3.0, None, 1.0, 2.0, None, 5.0, 2.0, 4.0]
OUTCOMES = ["ok", "crash", "ok", "ok", "pruned", "ok", "ok", "ok"]


@pytest.fixture
def run_id(repo):
    run = repo.create_run("paged", target="workload", budget_s=60)
    for i, (v, o) in enumerate(zip(VALUES, OUTCOMES)):
        repo.start_trial(run.id, i, {"i": i})
        repo.finish_trial(run.id, i, outcome=o, value=v, duration_s=None if i == 3 else float(10 - i % 4))
    return run.id


def _reference(repo, run_id, state, sort, descending) -> list:
    key = {"number": "number", "value": "value", "duration": "duration_s"}[sort]
    rows = [t for t in repo.list_trials(run_id, limit=None) if state is None or t.state == state]
    present = sorted((t for t in rows if getattr(t, key) is not None), key=lambda t: getattr(t, key),
                     reverse=descending)  # fmt: skip
    return [getattr(t, key) for t in present] + [None] * (len(rows) - len(present))  # missing values last


@pytest.mark.parametrize("sort", ["number", "value", "duration"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("state", [None, "complete", "failed"])
def test_trial_page_sorts_filters_and_pages_like_a_plain_sort(repo, run_id, sort, descending, state) -> None:
    key = {"number": "number", "value": "value", "duration": "duration_s"}[sort]
    ref = _reference(repo, run_id, state, sort, descending)
    for offset, limit in ((0, 3), (2, 4), (0, 100), (5, None), (50, 10)):
        total, page = trial_page(repo, run_id, state=state, sort=sort, descending=descending, offset=offset,
                                 limit=limit)  # fmt: skip
        assert total == len(ref)
        assert [getattr(t, key) for t in page] == ref[offset : None if limit is None else offset + limit]


def test_trial_page_loads_measurements_when_asked_and_refuses_unknown_sorts(repo, run_id) -> None:
    from storage.types import MetricRow

    repo.start_trial(run_id, 99, {})
    repo.finish_trial(run_id, 99, outcome="ok", value=1.0, metrics=[MetricRow("tok_s", "c=1", 1.0)])
    _, page = trial_page(repo, run_id, offset=8, limit=1, with_measurements=True)
    assert [(m.metric, m.level) for m in page[0].measurements] == [("tok_s", "c=1")]
    with pytest.raises(ValueError, match="`sort` must be one of"):
        trial_page(repo, run_id, sort="params")


def test_outcome_counts_by_run(repo, run_id) -> None:
    other = repo.create_run("other", target="workload", budget_s=60)
    repo.start_trial(other.id, 0, {})
    counts = outcome_counts_by_run(repo)
    assert counts[run_id] == repo.outcome_counts(run_id) == {"ok": 6, "crash": 1, "pruned": 1}
    assert counts[other.id] == {"running": 1}
