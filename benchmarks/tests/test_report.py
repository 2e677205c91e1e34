"""benchmarks/report.py: results tables read from a study database, checked against figures worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from storage import Repo
from storage.types import MetricRow

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import report


def _trial(repo, run_id, number, params, levels, *, baseline=False, repeat_of=None):
    repo.start_trial(run_id, number, params, is_baseline=baseline)
    geo = (levels[0] * levels[1]) ** 0.5
    repo.finish_trial(
        run_id,
        number,
        outcome="ok",
        value=geo,
        repeat_of=repeat_of,
        metrics=[MetricRow("tok_s", "c=1", levels[0]), MetricRow("tok_s", "c=16", levels[1])],
    )
    return geo


@pytest.fixture
def study_db(tmp_path) -> Path:
    path = tmp_path / "t1_cpu.db"
    repo = Repo(f"sqlite:///{path}")
    repo.create_schema()
    run = repo.create_run(
        "t1",
        target="workload",
        budget_s=60,
        objective="geomean of tok_s at c=1,16",
        unit="tok/s",
        environment={"git_sha": "abc123-dirty", "gpus": [{"name": "NVIDIA H200"}]},
    )
    _trial(repo, run.id, 0, {"a": 0}, (10.0, 20.0), baseline=True)
    _trial(repo, run.id, 1, {"a": 1}, (30.0, 80.0))  # the best configuration, first run
    _trial(repo, run.id, 2, {"a": 2}, (40.0, 100.0))  # a single lucky timing: Optuna's best, not the recorded one
    _trial(repo, run.id, 3, {"a": 1}, (34.0, 100.0))  # the best configuration's re-run
    _trial(repo, run.id, 4, {"a": 1}, (34.0, 100.0), repeat_of=3)  # a copy of trial 3's timing, not a run
    med = ((30 * 80) ** 0.5 + (34 * 100) ** 0.5) / 2
    repo.set_best(run.id, 3, med)
    repo.end_run(run.id, "finished")
    repo.engine.dispose()
    return path


def test_report_tables_are_read_from_the_database(study_db, tmp_path) -> None:
    out = tmp_path / "results"
    assert report.main([str(study_db), "--out-dir", str(out)]) == 0
    text = (out / "study_t1_cpu.md").read_text()
    assert str(study_db) in text and "`abc123-dirty`" in text and "1x NVIDIA H200" in text
    # best at each level: the median of its configuration's two runs (the repeat is not a run): 32, 90
    assert "| recorded best (median of its runs) | 32.00 | 90.00 |" in text
    assert "| best × baseline | 3.20x | 4.50x |" in text  # 32/10, 90/20
    assert "| 1, 3 | 48.99, 58.31 | 53.65 | 3.79x |" in text  # the re-run table: values, median, x baseline
    assert "Optuna's best trial (the single best timing) is trial 2" in text and "another configuration" in text
    summary = (out / "studies.md").read_text()
    assert (
        "| `t1` | `t1_cpu.db` | 1x NVIDIA H200 | 5 | ok 5 | c=1: 3.20x, c=16: 4.50x | 3.79x | 1 | `abc123-dirty` |"
        in summary
    )


def test_report_refuses_a_missing_database_in_one_line(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"^error: no database file .*nope\.db.*give the path"):
        report.main([str(tmp_path / "nope.db"), "--out-dir", str(tmp_path)])
    assert not (tmp_path / "nope.db").exists()
