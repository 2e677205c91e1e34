"""Shared fixtures. Trial subprocesses import test-only targets (``fake_targets``) through PYTHONPATH. What is costly
to build and only read (the CPU main job's study) is built once per test run (``helpers/built_once.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Each xdist worker, and every trial subprocess it starts, uses one intra-op thread: with N workers on N cores,
# torch's default of N threads each oversubscribes the machine N-fold and a CPU twin's step becomes bound by threads
# waiting on each other. Under that contention the tiny twin's 30x indexer cost difference between two caps measured
# 1.25x (and inverted in a CI run); single-threaded it measured 3.1x on the same loaded cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
_paths = [str(TESTS / "helpers"), str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    _paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
for p in _paths:
    if p not in sys.path:
        sys.path.insert(0, p)

from built_once import built_once, copy_database  # noqa: E402  (tests/helpers, put on sys.path just above)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


MAIN_JOB = ["search", "--budget", "4m", "--n-trials", "4", "--seed", "3", "-o", "out"]
"""The README's main job on a CPU (the default space, dsv4_flash_tiny, in SQLite), 4 trials of seed 3."""


@pytest.fixture(scope="session")
def cpu_main_job_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(folder: Path) -> None:
        r = subprocess.run(
            [sys.executable, "-m", "tuner", *MAIN_JOB], cwd=folder, capture_output=True, text=True, timeout=420
        )
        (folder / "result.json").write_text(
            json.dumps({"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr})
        )

    return built_once(tmp_path_factory, "cpu-main-job", build)


@pytest.fixture
def cpu_main_job(cpu_main_job_built: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``tuner search`` as :data:`MAIN_JOB` ran it in ``tmp_path`` (its tuner.db and out/ there, a copy of the one
    run per test run that the tests of the CLI and of the export share): its exit code, stdout and stderr."""
    if (cpu_main_job_built / "tuner.db").exists():
        copy_database(cpu_main_job_built / "tuner.db", tmp_path / "tuner.db")
    if (cpu_main_job_built / "out").exists():
        shutil.copytree(cpu_main_job_built / "out", tmp_path / "out")
    r = json.loads((cpu_main_job_built / "result.json").read_text())
    return subprocess.CompletedProcess(MAIN_JOB, r["returncode"], r["stdout"], r["stderr"])


@pytest.fixture(autouse=True, scope="session")
def sglang_parser_read_once():
    """SGLang's argument parser is read (``introspect_parser``: a subprocess that imports sglang, 6-15 s) once per
    test process for each Python, parser, set of candidate values and PYTHONPATH, the inputs its dump depends on;
    each caller gets its own copy. A test that replaces ``introspect_parser`` (monkeypatch) replaces this too."""
    import copy

    from tuner.targets.server import flags as fl

    real = fl.introspect_parser
    read: dict[tuple, object] = {}

    def introspect_parser(
        python: str = sys.executable, parser: str = fl.SGLANG_PARSER, checks=(), timeout_s: float = 120.0
    ):
        key = (python, parser, repr([(f, list(vals)) for f, vals in checks]), os.environ.get("PYTHONPATH"))
        if key not in read:
            read[key] = real(python, parser, checks, timeout_s)  # a failure raises, and is not kept
        return copy.deepcopy(read[key])

    fl.introspect_parser = introspect_parser
    yield
    fl.introspect_parser = real
