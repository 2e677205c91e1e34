"""Helpers for the worker tests: the fast fake target on PYTHONPATH, fresh PostgreSQL databases, a private
PostgreSQL server that a test may restart, and helpers to start a study and worker processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import fake_target  # noqa: E402

PG_ENV = "TUNER_TEST_POSTGRES_URL"


def _admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def fresh_database(base_url: str) -> tuple[str, str]:
    """Create an empty database on ``base_url``'s server; return its URL and name."""
    name = f"tuner_w_{uuid.uuid4().hex[:10]}"
    _admin(base_url, f'CREATE DATABASE "{name}"')
    return base_url.rsplit("/", 1)[0] + "/" + name, name


def drop_database(base_url: str, name: str) -> None:
    try:
        _admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception:  # noqa: BLE001 - best effort
        pass


@pytest.fixture
def pg_url():
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"needs PostgreSQL: set {PG_ENV}=postgresql://user@host:port/db (CI's .ci/run does)")
    url, name = fresh_database(base)
    yield url
    drop_database(base, name)


def _pg_bindir() -> str | None:
    for cand in [os.environ.get("TUNER_TEST_PG_BINDIR")] + sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), reverse=True
    ):
        if cand and (Path(cand) / "initdb").exists():
            return str(cand)
    initdb = shutil.which("initdb")
    return str(Path(initdb).parent) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway PostgreSQL server in a temp folder, so a test can restart it without disturbing others."""

    def __init__(self, bindir: str, root: Path) -> None:
        self.bindir, self.data, self.port = bindir, root / "pgdata", _free_port()
        self.data.mkdir(parents=True)
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(root, "postgres")
            shutil.chown(self.data, "postgres")
        self._sh(f"{bindir}/initdb -D {self.data} -A trust -U postgres")
        self.ctl("start")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _sh(self, cmd: str) -> None:
        full = ["su", "postgres", "-c", cmd] if self.as_root else ["bash", "-c", cmd]
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def ctl(self, action: str, *extra: str) -> None:
        opts = f"-p {self.port} -k /tmp -c max_connections=200"
        self._sh(f"{self.bindir}/pg_ctl -D {self.data} -l {self.data}/log -o '{opts}' -w {action} {' '.join(extra)}")

    def restart(self) -> None:
        self.ctl("restart", "-m", "fast")

    def stop(self) -> None:
        try:
            self.ctl("stop", "-m", "immediate")
        except subprocess.SubprocessError:
            pass


@pytest.fixture
def private_pg(tmp_path_factory):
    if not os.environ.get(PG_ENV):
        pytest.skip(f"needs PostgreSQL: set {PG_ENV} (the restart test also starts its own server)")
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("needs the PostgreSQL server binaries (initdb, pg_ctl) to start a server it may restart")
    root = Path("/tmp") / f"tuner-pg-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    server = PrivatePostgres(bindir, root)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


def write_space(tmp_path: Path, *, sleep_ms: int = 10, tp: list[int] | None = None) -> str:
    p = tmp_path / "fake.yaml"
    p.write_text(fake_target.space_yaml(sleep_ms, tp))
    return str(p)


def start_study(url: str, space: str, *, budget_s: float = 240, settings: dict | None = None, name: str | None = None):
    """What `tuner search` does first: schema, study, run, baseline enqueued. Returns (study name, run id)."""
    from tuner.search.context import SearchOptions, open_context

    name = name or f"w-{uuid.uuid4().hex[:8]}"
    ctx = open_context(
        SearchOptions(
            budget_s=budget_s,
            storage_url=url,
            study=name,
            space_path=space,
            export=False,
            confirm_top=0,
            settings=settings or {},
        )
    )
    ctx.repo.engine.dispose()
    return name, ctx.run.id


def spawn_worker(
    url: str,
    study: str,
    *,
    name: str,
    max_trials: int,
    seed: int,
    log: Path,
    heartbeat: int = 1,
    grace: int = 4,
    env: dict | None = None,
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "tuner.worker_cli",
        "--storage",
        url,
        "--study",
        study,
        "--name",
        name,
        "--max-trials",
        str(max_trials),
        "--seed",
        str(seed),
        "--heartbeat-interval",
        str(heartbeat),
        "--grace-period",
        str(grace),
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    end = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, end - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def study_state(url: str, study: str, run_id: int):
    """(optuna trials, tuner_ records) of one study."""
    import optuna

    from storage import Repo

    s = optuna.load_study(study_name=study, storage=url.replace("postgresql://", "postgresql+psycopg://"))
    trials = s.get_trials(deepcopy=False)
    repo = Repo(url)
    recs = repo.list_trials(run_id)
    repo.engine.dispose()
    return trials, recs


def assert_consistent(url: str, study: str, run_id: int, n: int) -> tuple[list, list]:
    """Exactly ``n`` finished trials; none RUNNING or WAITING; Optuna and the tuner_ tables agree 1:1."""
    from optuna.trial import TrialState

    trials, recs = study_state(url, study, run_id)
    states = [t.state for t in trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states, states
    complete = sorted(t.number for t in trials if t.state == TrialState.COMPLETE)
    assert len(complete) == n, (len(complete), n)
    assert len({t.number for t in trials}) == len(trials)
    by_number = {r.number: r for r in recs}
    assert len(by_number) == len(recs), "a trial recorded twice"
    assert not [r for r in recs if r.state == "running"], "a trial left running in tuner_trials"
    ok = sorted(r.number for r in recs if r.outcome == "ok")
    assert ok == complete, {
        n: (
            [t.state.name for t in trials if t.number == n],
            by_number.get(n) and (by_number[n].outcome, by_number[n].reason[:200]),
        )
        for n in set(ok) ^ set(complete)
    }
    for t in trials:
        assert t.number in by_number, f"trial {t.number} ({t.state}) missing from tuner_trials"
        if t.state == TrialState.FAIL:
            assert by_number[t.number].outcome in ("crash", "timeout"), by_number[t.number].outcome
    return trials, recs
