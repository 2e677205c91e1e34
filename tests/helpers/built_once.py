"""What is costly to build and only read by the tests (a study's database) is built once per test run: under
pytest-xdist in the first worker that asks, the others waiting on a lock; each test copies out what it changes."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build`` fills once per test run: under pytest-xdist in the first worker that asks (the others
    wait on a lock, then read what it built). Tests copy what they change out of it (:func:`copy_database`)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above every worker's own
    built = shared / f"{name}-built"
    with FileLock(str(shared / f"{name}.lock")):
        if not (built / "done").exists():
            shutil.rmtree(built, ignore_errors=True)
            built.mkdir()
            build(built)
            (built / "done").write_text("")
    return built


def copy_database(src: Path, dst: Path) -> None:
    """A copy of the SQLite database ``src`` with what its write-ahead log still holds, not the main file alone."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
