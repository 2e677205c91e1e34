"""One parametrized ``repo`` fixture: every storage contract test runs on SQLite and on PostgreSQL
(``TUNER_TEST_POSTGRES_URL``; that case is skipped with the reason when it is unset). Each PostgreSQL test gets
a fresh database, so tests never see each other's runs."""

from __future__ import annotations

import os
import uuid

import pytest

from storage import Repo

PG_ENV = "TUNER_TEST_POSTGRES_URL"


def _admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'contract.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"needs PostgreSQL: set {PG_ENV}=postgresql://user@host:port/db (CI's .ci/run does)")
    name = f"tuner_s_{uuid.uuid4().hex[:10]}"
    _admin(base, f'CREATE DATABASE "{name}"')
    yield base.rsplit("/", 1)[0] + "/" + name
    _admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def repo(storage_url):
    r = Repo(storage_url)
    r.create_schema()
    yield r
    r.engine.dispose()
