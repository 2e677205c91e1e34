"""The GPU benchmark scripts bring a study's database back whole: a plain copy of an SQLite file in WAL mode while the
search's engine is open leaves the trials behind (an H200 goodput run came back with an empty database so)."""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _serve_bench():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_copy_study_db_keeps_what_the_write_ahead_log_holds(tmp_path):
    src = tmp_path / "study.db"
    live = sqlite3.connect(src)  # the search's engine, still open
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("CREATE TABLE trials (number INTEGER)")
    live.executemany("INSERT INTO trials VALUES (?)", [(n,) for n in range(5)])
    live.commit()
    shutil.copyfile(src, tmp_path / "plain.db")  # what the script did
    assert sqlite3.connect(tmp_path / "plain.db").execute("SELECT name FROM sqlite_master").fetchall() == []
    _serve_bench().copy_study_db(src, tmp_path / "copy.db")
    assert sqlite3.connect(tmp_path / "copy.db").execute("SELECT count(*) FROM trials").fetchone() == (5,)
    live.close()
