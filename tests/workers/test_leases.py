"""GPU leases on a CPU machine with fake GPU ids: packing, backfill without starvation, cross-process locks,
and a real threaded search whose trial subprocesses check their CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from workerkit import write_space

from tuner.errors import LeaseCancelled, LeaseError
from tuner.search.leases import FileLocks, GpuLeaser, parse_gpu_ids


def test_lease_packs_lowest_free_ids_and_releases_on_error(tmp_path):
    leaser = GpuLeaser([0, 1, 2, 3], lock_dir=str(tmp_path))
    with leaser.lease(2) as a, leaser.lease(1) as b:
        assert a == [0, 1] and b == [2]
        assert set(leaser.in_use()) == {0, 1, 2}
    with pytest.raises(RuntimeError):
        with leaser.lease(4) as c:
            assert c == [0, 1, 2, 3]
            raise RuntimeError("trial blew up")
    assert leaser.in_use() == {}
    assert leaser.lease(0).__enter__() == []


def test_too_big_a_request_is_refused_with_the_fix(tmp_path):
    with pytest.raises(LeaseError, match="needs 8 GPUs.*--gpus"):
        GpuLeaser([0, 1], lock_dir=str(tmp_path)).acquire(8)


def test_stop_cancels_a_wait(tmp_path):
    leaser = GpuLeaser([0], lock_dir=str(tmp_path))
    stop = threading.Event()
    with leaser.lease(1):
        threading.Timer(0.3, stop.set).start()
        with pytest.raises(LeaseCancelled):
            leaser.acquire(1, stop=stop)


class _Clock:
    """A clock the test moves: the leaser's waits and deadlines read it instead of the wall clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _until(condition, timeout_s: float = 10.0) -> None:
    """Wait (real time) until ``condition()`` holds: another thread's progress, not a pace."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.005)


def test_small_requests_backfill_until_the_big_one_has_waited_long_enough(tmp_path):
    """A 4-GPU request waits behind a held GPU; a 1-GPU request passes it (backfill) while it has waited less than
    the window, and may not once it has waited the window: the leaser's clock is the test's, moved by hand."""
    clock = _Clock()
    leaser = GpuLeaser([0, 1, 2, 3], lock_dir=str(tmp_path), backfill_window_s=60.0, clock=clock)
    held = leaser.acquire(1)  # GPU 0 busy: a 4-GPU request must wait
    big_got: list[list[int]] = []
    t_big = threading.Thread(target=lambda: big_got.append(leaser.acquire(4)))
    t_big.start()
    _until(lambda: leaser.waiting() == 1)  # the big request is queued
    clock.now += 59.0  # within the window: a small request backfills GPU 1
    small = leaser.acquire(1, deadline=clock.now + 1.0)
    assert small == [1]
    leaser.release(small)
    clock.now += 1.0  # the big request has now waited the whole window: nobody may pass it
    with pytest.raises(LeaseCancelled, match="deadline passed"):
        leaser.acquire(1, deadline=clock.now)
    assert not big_got
    leaser.release(held)
    t_big.join(timeout=10)
    assert big_got == [[0, 1, 2, 3]], "the big request was starved"


def test_file_locks_keep_two_processes_off_one_gpu(tmp_path):
    code = (
        "import sys,time; from tuner.search.leases import FileLocks; f=FileLocks(sys.argv[1]); "
        "assert f.try_acquire(3); print('held', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        mine = FileLocks(str(tmp_path))
        assert not mine.try_acquire(3)
        assert mine.try_acquire_many([3, 4, 5], 2) == [4, 5]
        leaser = GpuLeaser([3, 4], lock_dir=str(tmp_path))
        mine.release(4)
        with leaser.lease(1) as ids:
            assert ids == [4]
    finally:
        p.kill()  # its lock goes with it, however it dies
        p.wait()
    assert FileLocks(str(tmp_path)).try_acquire(3)


def test_parse_gpu_ids():
    assert parse_gpu_ids("0, 1,3") == [0, 1, 3]
    assert parse_gpu_ids("") is None
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpu_ids("0,a")


@pytest.mark.timeout(120)
def test_threaded_search_gives_each_trial_only_its_gpus(tmp_path, monkeypatch):
    """3 worker threads over 4 fake GPUs, trials needing 1, 2 or 4: each trial subprocess checks it sees
    exactly its ids; the trial log shows no two overlapping trials on one id."""
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    log = tmp_path / "trials.jsonl"
    monkeypatch.setenv("TUNER_FAKE_LOG", str(log))
    monkeypatch.setenv("TUNER_GPU_LOCK_DIR", str(tmp_path / "locks"))
    opts = SearchOptions(
        budget_s=90,
        storage_url=f"sqlite:///{tmp_path / 's.db'}",
        study="lease",
        space_path=write_space(tmp_path, sleep_ms=300, tp=[1, 2, 4]),
        export=False,
        confirm_top=0,
        settings={"use_gpus": True},
        n_trials=12,
        workers=3,
        gpus=[0, 1, 2, 3],
    )
    result = run_search(opts)
    outcomes = [t.outcome for t in result.trials]
    assert outcomes.count("ok") + sum("not run again" in t.reason for t in result.trials) >= 12, [
        (t.outcome, t.reason) for t in result.trials
    ]
    assert "crash" not in outcomes, [t.reason for t in result.trials if t.outcome == "crash"]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) >= 6
    for r in runs:
        assert len(r["gpus"].split(",")) == r["params"]["tp"]
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a["start"] < b["end"] and b["start"] < a["end"]:
                assert not set(a["gpus"].split(",")) & set(b["gpus"].split(",")), (a, b)
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for i, a in enumerate(runs) for b in runs[i + 1 :]), (
        "trials should have run side by side"
    )
