"""POST /api/searches and POST /api/studies/{name}/stop: the token guard, starting and stopping searches."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
from api_search_data import STUDY, TOKEN
from fastapi.testclient import TestClient

from storage import Repo

GOOD = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"study": "api-started", "budget_s": 30, "space": "dsv4_flash_tiny", "n_trials": 2, "seed": 1}

# A stand-in for the tuner CLI: records its argv, exits.
RECORD_ARGV = "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
# A stand-in search process: waits for SIGINT, then says it was interrupted cleanly.
WAIT_FOR_SIGINT = (  # as `tuner search` does, it installs its own SIGINT handler: a shell's background job
    # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "try:\n    print('ready', flush=True)\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
    "    print('interrupted', flush=True); sys.exit(0)\n"
    "sys.exit(3)\n"
)


@pytest.mark.parametrize("path", ["/api/searches", f"/api/studies/{STUDY}/stop", "/api/studies/unknown/stop"])
def test_no_token_configured_is_403(client: TestClient, path: str) -> None:
    r = client.post(path, json=BODY, headers=GOOD)
    assert r.status_code == 403 and r.json()["detail"] == "control disabled: set TUNER_API_CONTROL_TOKEN"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0123456789"},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"},
                                     {"Authorization": f"Bearer {TOKEN}x"}])  # fmt: skip
def test_missing_or_wrong_token_is_401(make_client, headers: dict) -> None:
    c = make_client(control_token=TOKEN)
    for path in ("/api/searches", f"/api/studies/{STUDY}/stop"):
        r = c.post(path, json=BODY, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert r.headers["www-authenticate"] == "Bearer"


def test_read_only_endpoints_need_no_token(make_client) -> None:
    c = make_client(control_token=TOKEN)
    assert c.get("/api/studies").status_code == 200 and c.get(f"/api/studies/{STUDY}").status_code == 200


def test_good_token_starts_the_search_command(make_client, tmp_path) -> None:
    record = tmp_path / "argv.json"
    c = make_client(control_token=TOKEN, search_command=[sys.executable, "-c", RECORD_ARGV, str(record)],
                    search_out_dir=tmp_path / "out")  # fmt: skip
    r = c.post("/api/searches", json=BODY, headers=GOOD)
    assert r.status_code == 202, r.text
    started = r.json()
    assert started["pid"] > 0 and started["study"] == "api-started"
    c.app.state.api.searches["api-started"].wait(timeout=30)
    argv = json.loads(record.read_text())
    assert argv[0] == "search" and argv[argv.index("--budget") + 1] == "30s"
    assert argv[argv.index("--study") + 1] == "api-started" and argv[argv.index("--space") + 1] == "dsv4_flash_tiny"
    assert argv[argv.index("--n-trials") + 1] == "2" and argv[argv.index("--seed") + 1] == "1"
    # the search exports to <out>/<study>/ itself: the API passes <out>, not <out>/<study>
    assert argv[argv.index("--out") + 1] == str(tmp_path / "out") and "--resume" not in argv
    assert (tmp_path / "out" / "api-started" / "search.log").exists()


def test_a_finished_search_is_reaped_not_left_a_zombie(make_client, tmp_path) -> None:
    from pathlib import Path

    c = make_client(control_token=TOKEN, search_command=[sys.executable, "-c", "pass"], search_out_dir=tmp_path / "o")
    r = c.post("/api/searches", json=BODY, headers=GOOD)
    assert r.status_code == 202, r.text
    proc = Path(f"/proc/{r.json()['pid']}")
    deadline = time.monotonic() + 20
    while proc.exists():  # a zombie keeps its /proc entry (state Z) until its parent waits for it
        assert time.monotonic() < deadline, f"pid {proc.name} still in /proc: {(proc / 'stat').read_text()!r}"
        time.sleep(0.05)


def test_a_search_can_be_started_on_a_database_that_does_not_exist_yet(make_client, tmp_path) -> None:
    record, db = tmp_path / "argv.json", tmp_path / "new.db"
    c = make_client(storage_url=f"sqlite:///{db}", control_token=TOKEN, search_out_dir=tmp_path / "out",
                    search_command=[sys.executable, "-c", RECORD_ARGV, str(record)])  # fmt: skip
    r = c.post("/api/searches", json=BODY, headers=GOOD)
    assert r.status_code == 202, r.text  # the search creates the database; the API itself never does
    c.app.state.api.searches["api-started"].wait(timeout=30)
    assert "--resume" not in json.loads(record.read_text()) and not db.exists()


def test_restarting_an_ended_study_resumes_it(make_client, tmp_path) -> None:
    record = tmp_path / "argv.json"
    c = make_client(control_token=TOKEN, search_command=[sys.executable, "-c", RECORD_ARGV, str(record)],
                    search_out_dir=tmp_path / "out")  # fmt: skip
    assert c.post("/api/searches", json={**BODY, "study": STUDY}, headers=GOOD).status_code == 202
    c.app.state.api.searches[STUDY].wait(timeout=30)
    assert "--resume" in json.loads(record.read_text())


@pytest.mark.parametrize(
    "body",
    [{**BODY, "study": "-rf"}, {**BODY, "study": "a b"}, {**BODY, "study": "x" * 201}, {**BODY, "study": "team/run1"},
     {**BODY, "budget_s": 0},
     {**BODY, "budget_s": -5}, {**BODY, "space": "--set=x"}, {**BODY, "target": "bogus"}, {**BODY, "n_trials": 0},
     {"study": "x"}, {}],
)  # fmt: skip
def test_bad_search_request_is_422(make_client, body: dict) -> None:
    assert make_client(control_token=TOKEN).post("/api/searches", json=body, headers=GOOD).status_code == 422


def test_missing_command_is_503_not_500(make_client, tmp_path) -> None:
    c = make_client(control_token=TOKEN, search_command=[str(tmp_path / "no-such-tuner")],
                    search_out_dir=tmp_path / "out")  # fmt: skip
    r = c.post("/api/searches", json=BODY, headers=GOOD)
    assert r.status_code == 503 and "TUNER_API_SEARCH_COMMAND" in r.json()["detail"]


def _running_study(url: str, name: str, pid: int, host: str) -> None:
    repo = Repo(url)
    repo.create_schema()
    repo.create_run(name, target="workload", budget_s=60, settings={"pid": pid, "host": host})


def test_stop_sends_sigint_to_the_recorded_process(make_client, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    proc = subprocess.Popen([sys.executable, "-c", WAIT_FOR_SIGINT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        _running_study(url, "busy", proc.pid, socket.gethostname())
        c = make_client(storage_url=url, control_token=TOKEN)
        assert c.post("/api/searches", json={**BODY, "study": "busy"}, headers=GOOD).status_code == 409
        r = c.post("/api/studies/busy/stop", headers=GOOD)
        assert r.status_code == 202 and r.json() == {"study": "busy", "pid": proc.pid, "signal": "SIGINT"}
        assert proc.wait(timeout=20) == 0 and "interrupted" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_refuses_other_hosts_ended_studies_and_gone_processes(make_client, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _running_study(url, "elsewhere", 12345, "another-host")
    _running_study(url, "gone", gone.pid, socket.gethostname())
    _running_study(url, "no-pid", 0, socket.gethostname())
    c = make_client(storage_url=url, control_token=TOKEN)
    r = c.post("/api/studies/elsewhere/stop", headers=GOOD)
    assert r.status_code == 409 and "another-host" in r.json()["detail"]
    assert c.post("/api/studies/gone/stop", headers=GOOD).status_code == 409
    assert c.post("/api/studies/no-pid/stop", headers=GOOD).status_code == 409
    main = make_client(control_token=TOKEN)
    r = main.post(f"/api/studies/{STUDY}/stop", headers=GOOD)
    assert r.status_code == 409 and "not running" in r.json()["detail"]
    assert main.post("/api/studies/unknown/stop", headers=GOOD).status_code == 404


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_start_then_stop_a_real_search(make_client, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'real.db'}"
    c = make_client(storage_url=url, control_token=TOKEN, search_out_dir=tmp_path / "out")
    body = {"study": "real", "budget_s": 600, "space": "dsv4_flash_tiny", "n_trials": 50, "seed": 0}
    r = c.post("/api/searches", json=body, headers=GOOD)
    assert r.status_code == 202, r.text
    proc = c.app.state.api.searches["real"]
    try:
        deadline = time.monotonic() + 180
        while True:  # wait for the first finished trial, so there is a best to export
            assert proc.poll() is None, (tmp_path / "out" / "real" / "search.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the search never finished a trial"
            study = c.get("/api/studies/real")
            if study.status_code == 200 and study.json()["best_value"] is not None:
                break
            time.sleep(0.5)
        assert study.json()["state"] == "running" and study.json()["settings"]["run_pid"] == proc.pid
        r = c.post("/api/studies/real/stop", headers=GOOD)
        assert r.status_code == 202 and r.json()["pid"] == proc.pid
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    study = c.get("/api/studies/real").json()
    assert study["state"] == "interrupted"
    assert any(a["kind"] == "launch_script" for a in c.get("/api/studies/real/artifacts").json())
