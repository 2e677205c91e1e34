"""Worker processes on one PostgreSQL study: nothing duplicated, lost or left RUNNING, through a SIGKILL and
a database restart. The fake target's trials take ~10 ms; the cost per trial is its subprocess (~0.5 s)."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from optuna.trial import TrialState
from workerkit import assert_consistent, spawn_worker, start_study, study_state, wait_all, write_space

from tuner.search.heartbeat import GRACE_PERIOD_S

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _count_done(url, study, run_id) -> int:
    trials, _ = study_state(url, study, run_id)
    return sum(t.state == TrialState.COMPLETE for t in trials)


@pytest.mark.timeout(240)
def test_four_workers_run_200_trials_exactly_once(pg_url, tmp_path):
    n = 200
    study, run_id = start_study(pg_url, write_space(tmp_path))
    # no worker dies here: the product's grace period (20 s), not the 4 s the kill tests use to see a loss fast; on
    # a loaded 2-core CI box a live worker's heartbeat thread once went 4 s unscheduled and its two trials were failed
    # as lost while it finished them (CI, stop 54)
    procs = [
        spawn_worker(
            pg_url, study, name=f"w{i}", max_trials=n, seed=i, log=tmp_path / f"w{i}.log", grace=GRACE_PERIOD_S
        )
        for i in range(4)
    ]
    codes = wait_all(procs, timeout=220)
    logs = "\n".join((tmp_path / f"w{i}.log").read_text()[-2000:] for i in range(4))
    assert codes == [0, 0, 0, 0], logs
    trials, recs = assert_consistent(pg_url, study, run_id, n)
    assert all(t.state == TrialState.COMPLETE for t in trials), "no trial should fail in a clean run"
    assert len({r.worker for r in recs}) == 4, "every worker ran trials"


@pytest.mark.timeout(150)
def test_killed_worker_trial_is_failed_by_heartbeat_and_retried_once(pg_url, tmp_path):
    n = 30
    stall = tmp_path / "stall"
    env = {"TUNER_FAKE_STALL_FILE": str(stall)}
    study, run_id = start_study(pg_url, write_space(tmp_path))
    procs = [
        spawn_worker(pg_url, study, name=f"w{i}", max_trials=n, seed=i, log=tmp_path / f"w{i}.log", env=env)
        for i in range(3)
    ]
    end = time.time() + 90
    while _count_done(pg_url, study, run_id) < 8 and time.time() < end:
        time.sleep(0.3)
    stall.touch()  # every trial that reaches the check now hangs until the file goes
    entered = Path(str(stall) + ".entered")
    victim_trial = None
    while victim_trial is None and time.time() < end:
        _, recs = study_state(pg_url, study, run_id)
        # a trial of w0 that is hanging at the check (one that passed it just before may be finishing right now)
        stalled = set(entered.read_text().splitlines()) if entered.exists() else set()
        victim_trial = next(
            (
                r.number
                for r in recs
                if r.state == "running" and r.worker == "w0" and json.dumps(r.params, sort_keys=True) in stalled
            ),
            None,
        )
        time.sleep(0.2)
    assert victim_trial is not None, "worker w0 never started a trial"
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].wait()
    stall.unlink()
    codes = wait_all(procs[1:], timeout=100)
    assert codes == [0, 0], "\n".join((tmp_path / f"w{i}.log").read_text()[-2000:] for i in (1, 2))
    trials, recs = assert_consistent(pg_url, study, run_id, n)
    lost = next(t for t in trials if t.number == victim_trial)
    assert lost.state == TrialState.FAIL
    rec = next(r for r in recs if r.number == victim_trial)
    assert rec.outcome == "crash" and "heartbeat" in rec.reason and "retried once" in rec.reason
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim_trial]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == lost.params
    assert sum(t.state == TrialState.FAIL for t in trials) == 1


@pytest.mark.timeout(150)
def test_workers_reconnect_after_a_database_restart(private_pg, tmp_path):
    n = 30
    url = private_pg.url
    study, run_id = start_study(url, write_space(tmp_path))
    procs = [
        spawn_worker(url, study, name=f"w{i}", max_trials=n, seed=i, log=tmp_path / f"w{i}.log", grace=8)
        for i in range(3)
    ]
    end = time.time() + 90
    while _count_done(url, study, run_id) < 8 and time.time() < end:
        time.sleep(0.3)
    before = _count_done(url, study, run_id)
    asked = datetime.now(timezone.utc)
    private_pg.restart()
    codes = wait_all(procs, timeout=110)
    logs = "\n".join((tmp_path / f"w{i}.log").read_text()[-3000:] for i in range(3))
    assert codes == [0, 0, 0], logs
    assert before < n, "the restart should happen in the middle of the study"
    _, recs = assert_consistent(url, study, run_id, n)
    # saw it: the server the workers finished on started after the restart was asked for, so every connection
    # they held before was cut; survived it: every worker finished trials on the restarted server
    started = _server_started_at(url)
    assert started > asked, f"the server was not restarted (started {started}, restart asked {asked})"
    after = {r.worker for r in recs if r.finished_at and r.finished_at.replace(tzinfo=timezone.utc) > started}
    assert after == {"w0", "w1", "w2"}, f"workers that finished trials after the restart: {sorted(after)}\n{logs}"


def _server_started_at(url: str) -> datetime:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0].astimezone(timezone.utc)
