"""The full launch/watch/load/teardown cycle against the stand-in server, through the `command` target.

Every case ends with the right outcome and nothing left running: the process group is gone, the port is free.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.server.conftest import SPACE_YAML, assert_gone
from tuner.measurement import Outcome
from tuner.targets.server import launch as ln

DEFAULTS = {"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:8", "fast_path": False}


@pytest.fixture
def spy(monkeypatch):
    """Record every ServerProcess the target starts, to check its group and port afterwards."""
    started: list[ln.ServerProcess] = []
    orig = ln.ServerProcess.__init__

    def init(self, *a, **kw):
        orig(self, *a, **kw)
        started.append(self)

    monkeypatch.setattr(ln.ServerProcess, "__init__", init)
    yield started
    for s in started:
        assert_gone(s.pgid, s.port)


def test_ok_trial_measures_levels_and_constraints(make_target, spy):
    target = make_target(["--tokens-per-second", "100"])
    reported = []
    m = target.evaluate(DEFAULTS, time.time() + 60, lambda step, v: reported.append((step, v)) and False)
    assert m.outcome is Outcome.OK, m.reason + "\n" + m.log
    assert sorted(m.by_level) == [1, 4]
    assert [s for s, _ in reported] == [0, 1]
    # one request streams 20 tokens at 100 tok/s: 10 ms between tokens, 100 tok/s per request
    assert m.metric("itl_ms_mean", "c=1") == pytest.approx(10.0, rel=0.15)
    assert m.metric("tok_s_per_request", "c=4") == pytest.approx(100.0, rel=0.15)
    assert m.metric("tok_s", "c=4") > 2.5 * m.metric("tok_s", "c=1")
    assert m.metric("errors", "c=4") == 0
    assert m.metric("constraint", "ttft_ms_p99@c=4<=500") < 0
    assert m.value == pytest.approx((m.by_level[1] * m.by_level[4]) ** 0.5)
    # the flags reached the server as separate argv items
    argv = spy[0].argv
    i = argv.index("--cuda-graph-bs-decode")
    assert argv[i + 1 : i + 5] == ["1", "2", "4", "8"]
    assert "The server is fired up" in m.log


def test_flags_change_the_measured_rate(make_target, spy):
    target = make_target(["--tokens-per-second", "100"], levels=[2], min_requests=2)
    slow = target.evaluate({**DEFAULTS, "context_length": 131072}, time.time() + 60)
    fast = target.evaluate({**DEFAULTS, "fast_path": True}, time.time() + 60)
    assert slow.outcome is fast.outcome is Outcome.OK
    assert slow.metric("tok_s_per_request", "c=2") == pytest.approx(50, rel=0.15)
    assert fast.metric("tok_s_per_request", "c=2") == pytest.approx(150, rel=0.15)


def test_refused_flag_is_invalid_config_and_remembered_in_the_storage(make_target, spy, tmp_path):
    from storage import Repo

    repo = Repo(f"sqlite:///{tmp_path / 'memory.db'}")
    repo.create_schema()
    run = repo.create_run("s", target="command", budget_s=60)
    target = make_target(["--no-such-flag", "1"])
    m = target.evaluate(DEFAULTS, time.time() + 30)
    assert m.outcome is Outcome.INVALID_CONFIG, m.reason
    assert "unrecognized arguments" in m.reason
    target.remember_failure(repo, run.id, 3, DEFAULTS, m)
    # the identical flag set is refused before any launch next time; allow_retry lets it run
    reason = target.known_failure(repo, DEFAULTS)
    assert reason and "already failed" in reason and "trial 3, invalid_config" in reason
    assert target.known_failure(repo, {**DEFAULTS, "fast_path": True}) is None
    assert make_target(["--no-such-flag", "1"], allow_retry=True).known_failure(repo, DEFAULTS) is None
    # another storage (another team's database) knows nothing of it
    other = Repo(f"sqlite:///{tmp_path / 'other.db'}")
    other.create_schema()
    assert target.known_failure(other, DEFAULTS) is None


def test_crash_after_start(make_target, spy):
    target = make_target(["--tokens-per-second", "20", "--crash-after", "0.3"], output_len=50)
    m = target.evaluate(DEFAULTS, time.time() + 30)
    assert m.outcome is Outcome.CRASH, m.reason
    assert "after becoming ready" in m.reason and "crashed on purpose" in m.reason


def test_hang_never_ready_is_timeout(make_target, spy):
    target = make_target(["--hang"], ready_timeout_s=1.5)
    t0 = time.time()
    m = target.evaluate(DEFAULTS, time.time() + 30)
    assert m.outcome is Outcome.TIMEOUT, m.reason
    assert "not ready after" in m.reason
    assert time.time() - t0 < 10


def test_oom_at_start(make_target, spy):
    m = make_target(["--oom-at-start"]).evaluate(DEFAULTS, time.time() + 30)
    assert m.outcome is Outcome.OOM, m.reason
    assert "CUDA out of memory" in m.log


def test_oom_under_load_while_process_lingers(make_target, spy):
    target = make_target(["--tokens-per-second", "10", "--oom-under-load"], output_len=100, warmup_requests=0)
    t0 = time.time()
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OOM, m.reason
    assert "fatal line" in m.reason
    assert time.time() - t0 < 8  # detected within seconds, not at the end of a 10 s stream


def test_slow_stream_hits_the_deadline(make_target, spy):
    target = make_target(["--tokens-per-second", "5"], output_len=200, warmup_requests=0, teardown_reserve_s=1)
    t0 = time.time()
    m = target.evaluate(DEFAULTS, time.time() + 4)
    assert m.outcome is Outcome.TIMEOUT, m.reason
    assert time.time() - t0 < 6


def test_pruned_after_first_level(make_target, spy):
    target = make_target(["--tokens-per-second", "500"])
    m = target.evaluate(DEFAULTS, time.time() + 30, lambda step, v: True)
    assert m.outcome is Outcome.PRUNED
    assert list(m.by_level) == [1]


def test_isolated_trial_killed_at_deadline_leaves_no_server(make_target, tmp_path):
    """The per-trial subprocess is killed from outside (timeout): its server, in its own group, dies too."""
    from tuner.execution.isolation import TrialJob, TrialProcess

    target = make_target(["--hang"])
    marker = tmp_path / "argv.json"
    settings = {
        **target.settings,
        "extra_args": ["--hang", "--print-argv", str(marker)],
        "ready_timeout_s": 600,
        "teardown_reserve_s": 0,
    }
    job = TrialJob(
        target="command",
        space_yaml=SPACE_YAML,
        space_source="standin.yaml",
        params=DEFAULTS,
        deadline=time.time() + 600,
        settings=settings,
        hardware={"gpu_name": "cpu", "gpu_count": 0},
    )
    proc = TrialProcess(job)
    end = time.time() + 20
    while not marker.exists() and time.time() < end:
        time.sleep(0.05)
    assert marker.exists(), "the stand-in never started"
    argv = _written_json(marker)
    port = int(argv[argv.index("--port") + 1])
    server_pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, str(marker))]
    assert server_pids
    m = proc.wait(hard_deadline=time.time() + 0.5)
    assert m.outcome is Outcome.TIMEOUT
    end = time.time() + 5
    while time.time() < end and any(_alive(p) for p in server_pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in server_pids), "the server outlived its killed trial"
    end = time.time() + 5
    while time.time() < end and not ln.port_is_free(port):
        time.sleep(0.05)
    assert ln.port_is_free(port)


def _written_json(path, timeout_s: float = 10.0):
    """``path``'s JSON once its writer has written all of it (the file appears before its content does)."""
    end = time.time() + timeout_s
    while True:
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            assert time.time() < end, f"{path} never held whole JSON"
            time.sleep(0.02)


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_server_process_refuses_a_shell_string():
    with pytest.raises(TypeError, match="never one shell string"):
        ln.ServerProcess("python -m x; rm -rf /", port=1)


def test_pick_free_port_skips_busy_ports():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not ln.port_is_free(busy)
        if ln.port_is_free(busy + 1):
            assert ln.pick_free_port(busy, busy + 1) == busy + 1


def test_a_killed_trial_leaves_no_process_of_its_server_group(make_target, tmp_path):
    """A server's worker that ignores SIGTERM and is no child of the trial (so no parent-death signal reaches it)
    is gone when the killed trial's wait returns: the trial announced its server's group and the runner ended it."""
    from tuner.execution.isolation import TrialJob, TrialProcess
    from tuner.processes import group_alive

    worker_pid = tmp_path / "worker.pid"
    target = make_target(["--hang"])
    settings = {
        **target.settings,
        "extra_args": ["--hang", "--spawn-worker", str(worker_pid)],
        "ready_timeout_s": 600,
        "teardown_reserve_s": 0,
    }
    job = TrialJob(
        target="command",
        space_yaml=SPACE_YAML,
        space_source="standin.yaml",
        params=DEFAULTS,
        deadline=time.time() + 600,
        settings=settings,
        hardware={"gpu_name": "cpu", "gpu_count": 0},
    )
    proc = TrialProcess(job)
    end = time.time() + 20
    while not (worker_pid.exists() and worker_pid.read_text()) and time.time() < end:
        time.sleep(0.05)
    assert worker_pid.exists(), "the stand-in never started its worker"
    pid = int(worker_pid.read_text())
    try:
        m = proc.wait(hard_deadline=time.time() + 0.5)
        assert m.outcome is Outcome.TIMEOUT
        assert proc.groups and not any(group_alive(g) for g in proc.groups), proc.groups
        assert not _alive(pid), f"the server's worker {pid} outlived its killed trial"
    finally:
        if _alive(pid):
            os.kill(pid, 9)
