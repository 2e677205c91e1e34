"""The persistent trial worker: many trials in one process; a crash, hang, OOM or prune costs that process only."""

import os
import time

import pytest
from spaces import FAKE_SPACE

from tuner.execution.isolation import TrialJob
from tuner.execution.persistent import PersistentWorker, close_workers, persistent_worker
from tuner.measurement import Outcome


def _job(mode="ok", x=1, timeout=20.0):
    return TrialJob(
        target="fake_targets:FakeTarget",
        space_yaml=FAKE_SPACE,
        space_source="fake.yaml",
        params={"mode": mode, "x": x},
        deadline=time.time() + timeout,
    )


@pytest.fixture
def worker():
    w = PersistentWorker()
    yield w
    w.stop()


def test_trials_share_one_process_until_one_fails(worker):
    a = worker.start(_job(x=1))
    first_pid = a.pid
    m1 = a.wait()
    b = worker.start(_job(x=2))
    assert b.pid == first_pid  # the same process ran both
    m2 = b.wait()
    assert m1.outcome is Outcome.OK and m2.outcome is Outcome.OK and m2.value > m1.value
    assert worker.started_processes == 1 and worker.alive()

    crash = worker.start(_job("crash"))
    assert crash.pid == first_pid
    m = crash.wait()
    assert m.outcome is Outcome.CRASH and "SIGSEGV" in m.reason
    assert not worker.alive()
    after = worker.start(_job(x=3))
    assert after.pid != first_pid and after.wait().outcome is Outcome.OK  # a fresh process took over
    assert worker.started_processes == 2


@pytest.mark.parametrize("mode,outcome", [("oom", Outcome.OOM), ("raise", Outcome.CRASH)])
def test_a_failure_that_may_break_the_cuda_context_retires_the_process(worker, mode, outcome):
    t = worker.start(_job(mode))
    pid = t.pid
    m = t.wait()
    assert m.outcome is outcome
    assert not worker.alive()  # not trusted with the next trial
    nxt = worker.start(_job())
    assert nxt.pid != pid and nxt.wait().outcome is Outcome.OK


def test_a_hang_is_killed_at_the_deadline_and_the_next_trial_runs(worker):
    t0 = time.time()
    m = worker.start(_job("hang", timeout=3.0)).wait()
    assert m.outcome is Outcome.TIMEOUT and time.time() - t0 < 10
    assert worker.start(_job()).wait().outcome is Outcome.OK


def test_a_pruned_trial_stops_at_the_verdict_and_its_process_runs_the_next(worker):
    """The pruner's verdict goes back to the worker, whose target stops at that level: the trial is pruned and the
    same process (its imports and CUDA context) runs the next trial. Before, every prune killed the process, and on
    an H200 the next trial paid 15-20 s of a fresh interpreter, torch, SGLang's and DeepGEMM's imports."""
    seen = []

    def reporter(step, value):
        seen.append(step)
        return True  # prune at the first intermediate value

    t = worker.start(_job(x=5), reporter)
    pid = t.pid
    m = t.wait()
    assert m.outcome is Outcome.PRUNED and m.value is None and seen == [0]  # no level after the verdict
    assert worker.alive()
    nxt = worker.start(_job(x=2), lambda step, value: False)
    assert nxt.pid == pid
    m2 = nxt.wait()
    assert m2.outcome is Outcome.OK and m2.value > 0 and worker.started_processes == 1


def test_a_pruned_target_that_does_not_stop_is_killed_after_the_grace(worker, monkeypatch):
    import tuner.execution.persistent as persistent

    monkeypatch.setattr(persistent, "PRUNE_GRACE_S", 0.5)
    t = worker.start(_job("deaf", x=5), lambda step, value: True)
    pid = t.pid
    t0 = time.time()
    m = t.wait()
    assert m.outcome is Outcome.PRUNED and time.time() - t0 < 10
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
    assert worker.start(_job(x=3)).wait().outcome is Outcome.OK  # a fresh process took over
    assert worker.started_processes == 2


def test_pool_gives_one_worker_per_gpu_set_and_closes_them():
    a, b = persistent_worker([0]), persistent_worker([1])
    assert a is persistent_worker([0]) and a is not b
    m = a.start(TrialJob(**{**_job().__dict__, "gpus": [0]})).wait()
    assert m.outcome is Outcome.OK and a.alive()
    close_workers()
    assert not a.alive() and persistent_worker([0]) is not a
    close_workers()
    with pytest.raises(ValueError, match="gpus"):
        PersistentWorker([1]).start(_job())  # a job for another GPU set


def test_a_fresh_trial_process_is_pruned_the_same_way():
    from tuner.execution.isolation import run_trial

    steps = []
    m = run_trial(_job(x=5), lambda step, value: steps.append(step) or True)
    assert m.outcome is Outcome.PRUNED and steps == [0]


def test_report_lines_and_a_failing_pruner():
    from tuner.execution.isolation import ask_pruner, parse_report

    assert parse_report('@@tuner {"step": 2, "value": 1.5}') == (2, 1.5)
    assert parse_report("@@tuner {not json") is None and parse_report("plain log line") is None
    assert parse_report('@@tuner {"step": 1}') is None

    def broken(step, value):
        raise RuntimeError("pruner bug")

    assert ask_pruner(broken, 0, 1.0) is False  # the trial goes on
