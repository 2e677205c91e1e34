"""The GPU benchmark scripts bring a study's database back whole: a plain copy of an SQLite file in WAL mode while the
search's engine is open leaves the trials behind (an H200 goodput run came back with an empty database so)."""

from __future__ import annotations

import shutil
import sqlite3

from benchmark_scripts import benchmark_script


def _serve_bench():
    with benchmark_script("serve_bench") as mod:
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
