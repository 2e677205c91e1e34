"""`tuner worker` refuses what it cannot do with one line and exit 2; the deadline holds across threads."""

from __future__ import annotations

import time

import pytest
import typer
from typer.testing import CliRunner
from workerkit import start_study, write_space

from tuner.worker_cli import worker_command

app = typer.Typer()
app.command()(worker_command)


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_sqlite_is_refused_for_worker_processes(tmp_path):
    r = _invoke("--storage", f"sqlite:///{tmp_path / 'x.db'}", "--study", "s")
    assert r.exit_code == 2
    assert "PostgreSQL" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.postgres
def test_missing_study_is_one_line_and_exit_2(pg_url):
    r = _invoke("--storage", pg_url, "--study", "nope")
    assert r.exit_code == 2
    assert "no study 'nope'" in r.output and "tuner search" in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.postgres
def test_worker_exits_at_once_when_the_run_deadline_has_passed(pg_url, tmp_path):
    study, _ = start_study(pg_url, write_space(tmp_path), budget_s=3)
    time.sleep(2)
    t0 = time.time()
    r = _invoke("--storage", pg_url, "--study", study)
    assert r.exit_code == 0, r.output
    assert "budget used" in r.output and "0 trials" in r.output
    assert time.time() - t0 < 30


@pytest.mark.timeout(90)
def test_deadline_stops_every_thread_worker_and_records_timeouts(tmp_path, monkeypatch):
    from storage import Repo
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    stall = tmp_path / "stall"
    stall.touch()  # every trial hangs until the deadline kills it
    monkeypatch.setenv("TUNER_FAKE_STALL_FILE", str(stall))
    url = f"sqlite:///{tmp_path / 's.db'}"
    t0 = time.time()
    result = run_search(
        SearchOptions(
            budget_s=12,
            storage_url=url,
            study="dl",
            space_path=write_space(tmp_path),
            export=False,
            confirm_top=0,
            workers=2,
            trial_timeout_s=60,
        )
    )
    assert time.time() - t0 < 20
    assert len(result.trials) == 2 and all(t.outcome == "timeout" for t in result.trials)
    assert all("deadline" in t.reason for t in result.trials), [t.reason for t in result.trials]
    repo = Repo(url)
    run = repo.get_run("dl")
    assert repo.count_trials(run.id, state="running") == 0 and run.state == "finished"


@pytest.mark.postgres
def test_a_worker_ends_its_trials_when_the_search_does_before_its_plugin_phase(pg_url, tmp_path, monkeypatch):
    """The search keeps time at the end of its budget for timing the SGLang plug-in on the GPUs; a worker process of
    the same study stops its trials then too, so no trial shares a GPU with that measurement."""
    from fake_target import FakeTarget

    from tuner.search.driver import PLUGIN_KEEP_S
    from tuner.worker_cli import open_worker_context

    study, _ = start_study(pg_url, write_space(tmp_path), budget_s=3600)
    plain, storage = open_worker_context(pg_url, study)
    storage.engine.dispose()
    monkeypatch.setattr(FakeTarget, "plugin_measurements", lambda self, params: [["--batches", "1"]])
    ctx, storage = open_worker_context(pg_url, study)
    storage.engine.dispose()
    assert ctx.deadline.end == plain.deadline.end
    assert plain.deadline.trials_end - ctx.deadline.trials_end == pytest.approx(PLUGIN_KEEP_S)
