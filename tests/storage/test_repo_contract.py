"""The ``storage.Repo`` contract, written once and run over every backend (see conftest)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.exc import IntegrityError

from storage import Repo
from storage.repo import MetricRow, elapsed_s


def _run(repo: Repo, name: str = "s1", direction: str = "maximize", **kw):
    return repo.create_run(
        name,
        target="workload",
        budget_s=60,
        direction=direction,
        objective="tok/s",
        unit="tok/s",
        space_name="tiny",
        space_yaml="name: tiny\n",
        environment={"gpu": "cpu"},
        settings={"k": 1},
        **kw,
    )


def test_schema_is_created_once_and_detected(repo, storage_url):
    assert repo.has_schema()
    repo.create_schema()  # idempotent
    assert Repo(storage_url).has_schema()


def test_create_and_get_run_round_trips_every_field(repo):
    run = _run(repo)
    got = repo.get_run("s1")
    assert got.id == run.id and got.state == "running" and got.target == "workload"
    assert got.space_yaml == "name: tiny\n" and got.environment == {"gpu": "cpu"} and got.settings == {"k": 1}
    assert got.budget_s == 60 and got.started_at is not None and got.ended_at is None
    assert (got.direction, got.objective, got.unit, got.space_name) == ("maximize", "tok/s", "tok/s", "tiny")
    assert repo.get_run("nope") is None


def test_study_names_are_unique(repo):
    _run(repo)
    with pytest.raises(IntegrityError):
        _run(repo)
    assert [r.study_name for r in repo.list_runs()] == ["s1"]


def test_trial_lifecycle_outcomes_best_and_baseline(repo):
    run = _run(repo)
    repo.start_trial(run.id, 0, {"a": 1}, worker="w0", is_baseline=True)
    assert repo.get_trial(run.id, 0).state == "running"
    assert (
        repo.finish_trial(
            run.id, 0, outcome="ok", value=10.0, duration_s=1.5, metrics=[MetricRow("tok_s", "c=1", 10.0, "tok/s")]
        )
        is True
    )
    repo.start_trial(run.id, 1, {"a": 2})
    assert repo.finish_trial(run.id, 1, outcome="ok", value=5.0) is False  # worse: not a new best
    repo.start_trial(run.id, 2, {"a": 3})
    assert repo.finish_trial(run.id, 2, outcome="ok", value=20.0) is True
    repo.start_trial(run.id, 3, {"a": 4})
    repo.finish_trial(run.id, 3, outcome="oom", value=99.0, reason="CUDA out of memory")
    repo.start_trial(run.id, 4, {"a": 5})
    repo.finish_trial(run.id, 4, outcome="pruned", value=None)
    got = repo.get_run("s1")
    assert got.best_value == 20.0 and got.best_trial_number == 2 and got.baseline_value == 10.0
    t0 = repo.get_trial(run.id, 0)
    assert t0.state == "complete" and t0.worker == "w0" and t0.is_baseline
    assert [(m.metric, m.level, m.value) for m in t0.measurements] == [("tok_s", "c=1", 10.0)]
    oom = repo.get_trial(run.id, 3)
    assert oom.state == "failed" and oom.value is None and "out of memory" in oom.reason
    assert repo.get_trial(run.id, 4).state == "pruned"
    assert repo.outcome_counts(run.id) == {"ok": 3, "oom": 1, "pruned": 1}
    assert repo.count_trials(run.id, state="complete") == 3 and repo.count_trials(run.id, outcome="oom") == 1
    assert repo.baseline_trial(run.id).number == 0
    with pytest.raises(ValueError, match="outcome"):
        repo.finish_trial(run.id, 0, outcome="exploded", value=None)


def test_minimize_runs_pick_the_lowest(repo):
    run = _run(repo, "m", direction="minimize")
    for i, v in enumerate([5.0, 3.0, 4.0]):
        repo.start_trial(run.id, i, {})
        repo.finish_trial(run.id, i, outcome="ok", value=v)
    assert repo.get_run("m").best_trial_number == 1


def test_list_trials_sorts_filters_and_pages(repo):
    run = _run(repo)
    values = [3.0, None, 1.0, 2.0, None, 5.0]
    for i, v in enumerate(values):
        repo.start_trial(run.id, i, {"i": i})
        repo.finish_trial(run.id, i, outcome="ok" if v is not None else "crash", value=v, duration_s=float(10 - i))
    assert [t.number for t in repo.list_trials(run.id)] == [0, 1, 2, 3, 4, 5]
    assert [t.number for t in repo.list_trials(run.id, sort="value")] == [2, 3, 0, 5, 1, 4]  # nulls last
    assert [t.number for t in repo.list_trials(run.id, sort="value", descending=True)] == [5, 0, 3, 2, 1, 4]
    assert [t.number for t in repo.list_trials(run.id, sort="duration")][:2] == [5, 4]
    assert [t.number for t in repo.list_trials(run.id, outcome="crash")] == [1, 4]
    assert [t.number for t in repo.list_trials(run.id, state="complete")] == [0, 2, 3, 5]
    pages = [repo.list_trials(run.id, offset=o, limit=2) for o in (0, 2, 4, 6)]
    assert [[t.number for t in p] for p in pages] == [[0, 1], [2, 3], [4, 5], []]


def test_list_runs_newest_first_and_end_restart(repo):
    a = _run(repo, "a")
    time.sleep(0.01)
    b = _run(repo, "b")
    assert [r.study_name for r in repo.list_runs()] == ["b", "a"]
    repo.end_run(a.id, "finished", export_dir="/x")
    got = repo.get_run("a")
    assert got.state == "finished" and got.ended_at is not None and got.export_dir == "/x"
    assert elapsed_s(got) >= 0
    repo.restart_run(a.id, budget_s=120, environment={"gpu": "h200"})
    got = repo.get_run("a")
    assert got.state == "running" and got.ended_at is None and got.budget_s == 120
    assert got.environment == {"gpu": "h200"} and repo.get_run("b").id == b.id


def test_events_are_ordered_and_paged_by_id(repo):
    run = _run(repo)
    repo.start_trial(run.id, 0, {"a": 1})
    repo.finish_trial(run.id, 0, outcome="ok", value=1.0)
    repo.end_run(run.id, "finished")
    kinds = [e.kind for e in repo.events_after(run.id)]
    assert kinds == ["trial_started", "trial_finished", "new_best", "search_ended"]
    first = repo.events_after(run.id, limit=2)
    rest = repo.events_after(run.id, after_id=first[-1].id)
    assert [e.kind for e in first + rest] == kinds


def test_artifacts_replace_by_name(repo):
    run = _run(repo)
    repo.add_artifacts(
        run.id,
        [("launch_script", "launch.sh", "/o/launch.sh", b"v1"), ("best_params", "best.json", "/o/best.json", b"{}")],
    )
    repo.add_artifacts(run.id, [("launch_script", "launch.sh", "/o/launch.sh", b"v2")])
    assert sorted(a.name for a in repo.list_artifacts(run.id)) == ["best.json", "launch.sh"]
    assert repo.get_artifact(run.id, "launch.sh").content == b"v2"
    assert repo.get_artifact(run.id, "missing") is None


def test_mark_stale_running_fails_only_running_trials(repo):
    run = _run(repo)
    for i in range(3):
        repo.start_trial(run.id, i, {})
    repo.finish_trial(run.id, 0, outcome="ok", value=1.0)
    assert sorted(repo.mark_stale_running(run.id, reason="left running")) == [1, 2]
    t = repo.get_trial(run.id, 1)
    assert (t.state, t.outcome, t.reason) == ("failed", "crash", "left running")
    assert repo.get_trial(run.id, 0).outcome == "ok"
    assert repo.mark_stale_running(run.id, reason="again") == []


def test_mark_trial_crashed_is_per_trial(repo):
    from tuner.search.parallel import mark_trial_crashed

    run = _run(repo)
    repo.start_trial(run.id, 0, {"a": 1})
    repo.start_trial(run.id, 1, {"a": 2})
    assert mark_trial_crashed(repo, run.id, 0, reason="lost: no heartbeat")
    assert not mark_trial_crashed(repo, run.id, 0, reason="twice")
    assert mark_trial_crashed(repo, run.id, 7, reason="died before recording", params={"a": 9})
    assert repo.get_trial(run.id, 0).outcome == "crash" and repo.get_trial(run.id, 1).state == "running"
    assert repo.get_trial(run.id, 7).params == {"a": 9}


def test_resume_keeps_the_first_start_and_counts_every_segment(repo):
    from datetime import timedelta

    from storage.segments import (
        active_seconds,
        first_started_at,
        segments,
        total_budget_s,
    )

    run = _run(repo, "twice")  # budget 60 s
    first_start = repo.get_run("twice").started_at
    repo.start_trial(run.id, 0, {"a": 1})
    repo.finish_trial(run.id, 0, outcome="ok", value=1.0)
    time.sleep(0.2)
    repo.end_run(run.id, "finished")
    time.sleep(0.3)  # a gap between the two searches: not searched time
    repo.restart_run(run.id, budget_s=30, settings={"pid": 4242})
    time.sleep(0.2)
    repo.end_run(run.id, "finished")
    got = repo.get_run("twice")
    segs = segments(got)
    assert len(segs) == 2 and first_started_at(got) == first_start and total_budget_s(got) == 90
    assert got.budget_s == 30 and got.started_at > first_start  # the columns: the current segment (workers read it)
    assert got.settings["pid"] == 4242 and got.settings["k"] == 1
    # both segments, without the gap: the sum of the stored segments' lengths (each at least its 0.2 s of sleep), and
    # short of the wall time from the first start to the last end by at least the 0.3 s gap (however slow the machine)
    wall = (segs[1].ended_at - first_start).total_seconds()
    assert elapsed_s(got) == pytest.approx(segs[0].seconds() + segs[1].seconds(), abs=1e-3)
    assert segs[0].seconds() >= 0.2 and segs[1].seconds() >= 0.2
    assert elapsed_s(got) <= wall - 0.3 + 1e-3
    # the history plot's x: a time in the second segment counts the first segment's length, not the gap
    assert active_seconds(got, segs[1].started_at + timedelta(seconds=0.1)) == pytest.approx(
        segs[0].seconds() + 0.1, abs=1e-3
    )
    assert active_seconds(got, first_start) == 0.0


def test_restart_of_a_run_left_running_ends_its_segment_at_the_last_event(repo):
    from storage.segments import segments

    run = _run(repo, "crashed")
    repo.start_trial(run.id, 0, {"a": 1})
    last = repo.events_after(run.id)[-1].created_at
    time.sleep(0.2)
    repo.restart_run(run.id, budget_s=60)
    first = segments(repo.get_run("crashed"))[0]
    assert first.ended_at == last


@pytest.mark.parametrize("name", ["team/run1", "", "-rf", "a b", "x" * 201, "ü", "run\n1", "a?b", "%2F"])
def test_study_names_outside_the_rule_are_refused_with_the_fix(repo, name):
    from storage import StudyNameError

    with pytest.raises(StudyNameError, match=r"study name .* is not allowed: .*e\.g\. --study "):
        _run(repo, name)
    assert repo.list_runs() == []


@pytest.mark.parametrize(
    "name", ["s1", "dsv4-flash-tiny-workload-2", "w10b.kernels.moe.E=256,N=512", "A_b+c", "x" * 200]
)
def test_study_names_within_the_rule_are_accepted(repo, name):
    assert _run(repo, name).study_name == name
