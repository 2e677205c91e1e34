"""Readers never create a database: ``Repo(url, create=False)`` on a missing SQLite file is a one-line error."""

from __future__ import annotations

import pytest

from storage import Repo, StorageError


def test_reader_on_a_missing_sqlite_file_refuses_and_creates_nothing(tmp_path) -> None:
    path = tmp_path / "typo.db"
    with pytest.raises(StorageError, match=r"no database file at .*typo\.db.*check the path") as info:
        Repo(f"sqlite:///{path}", create=False)
    assert "\n" not in str(info.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_reader_opens_an_existing_file_and_a_writer_still_creates_one(tmp_path) -> None:
    path = tmp_path / "new.db"
    Repo(f"sqlite:///{path}").create_schema()  # the search: creates it
    assert path.exists()
    assert Repo(f"sqlite:///{path}", create=False).has_schema()
