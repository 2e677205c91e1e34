"""The read-only commands (``tuner status``, ``best``, ``export``, ``serve``) as a user runs them: real processes,
a mistyped SQLite path is a one-line error with exit 2 and no new file; ``tuner serve`` reads ``TUNER_API_*``;
``tuner search`` refuses a study name outside the rule before it writes anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from api_search_data import fake_search


def tuner(*args: str, cwd, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], check=False, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("command", [["status"], ["status", "--all"], ["best"], ["export", "-o", "out"], ["serve"]])
def test_read_only_command_on_a_missing_sqlite_file_fails_and_creates_nothing(tmp_path, command) -> None:
    r = tuner(*command, "--storage", "sqlite:///tunr.db", cwd=tmp_path)
    one_line_error(r, "no database file", "tunr.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a read-only command wrote a file"


def test_default_storage_missing_is_refused_too(tmp_path) -> None:
    one_line_error(tuner("status", cwd=tmp_path, env={"TUNER_STORAGE": ""}), "tuner.db")
    assert not (tmp_path / "tuner.db").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_serve_reads_storage_host_and_port_from_the_environment(tmp_path) -> None:
    db = tmp_path / "elsewhere" / "studies.db"
    db.parent.mkdir()
    fake_search(f"sqlite:///{db}", "from-env", n_trials=3)
    port = _free_port()
    env = {**os.environ, "TUNER_API_STORAGE_URL": f"sqlite:///{db}", "TUNER_API_HOST": "127.0.0.1",
           "TUNER_API_PORT": str(port)}  # fmt: skip
    env.pop("TUNER_STORAGE", None)
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "serve"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "tuner serve never answered on TUNER_API_PORT"
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert r.status_code == 200 and [s["name"] for s in r.json()] == ["from-env"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not (tmp_path / "tuner.db").exists()  # it served TUNER_API_STORAGE_URL, not ./tuner.db


def test_serve_flag_wins_over_the_environment(tmp_path) -> None:
    r = tuner("serve", "--storage", "sqlite:///flag.db", cwd=tmp_path,
              env={"TUNER_API_STORAGE_URL": f"sqlite:///{tmp_path / 'env.db'}"})  # fmt: skip
    one_line_error(r, "flag.db")


@pytest.mark.parametrize("name", ["team/run1", "-x", "a b"])
def test_search_refuses_a_study_name_outside_the_rule_before_writing(tmp_path, name) -> None:
    r = tuner("search", "--budget", "1m", "--study", name, cwd=tmp_path)
    one_line_error(r, "study name", "not allowed", "--study ")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_status_pages_trials_as_the_api_does(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import ApiSettings

    url = f"sqlite:///{tmp_path / 'paged.db'}"
    fake_search(url, "paged", n_trials=10)
    r = tuner("status", "--storage", url, "--study", "paged", "--sort", "value", "--desc", "--limit", "3",
              "--offset", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = [int(line.split("│")[1].split()[0]) for line in r.stdout.splitlines() if line.startswith("│")]
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        page = c.get("/api/studies/paged/trials", params={"sort": "value", "order": "desc", "limit": 3,
                                                          "offset": 1}).json()  # fmt: skip
    assert shown == [t["number"] for t in page["items"]] and len(shown) == 3
    assert f"trials 2-4 of {page['total']}" in r.stdout
    one_line_error(tuner("status", "--storage", url, "--study", "paged", "--sort", "params", cwd=tmp_path),
                   "--sort 'params'")  # fmt: skip
