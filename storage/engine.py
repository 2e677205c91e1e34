"""Engine creation: one place that knows SQLite's and PostgreSQL's connection quirks."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

_logger = logging.getLogger(__name__)


class StorageError(RuntimeError):
    """The storage URL is malformed or the database cannot be reached."""


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and route it through psycopg 3, the driver this project installs."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def shown_url(typed: str) -> str:
    """``typed`` as the user typed it (``postgresql://``, not the driver's ``postgresql+psycopg://``), its password
    hidden."""
    try:
        return make_url(typed).render_as_string(hide_password=True)
    except ArgumentError:
        return typed


def make_engine(url: str, *, pool_size: int = 5, create: bool = True) -> Engine:
    """Create an engine for ``url``; raise :class:`StorageError` with the fix when it cannot be used.

    SQLite gets WAL journaling and a busy timeout so a reader (the API) never blocks the writer (the search).
    PostgreSQL gets ``pool_pre_ping`` so a restarted server costs a reconnect, not a failed trial.
    With ``create=False`` a SQLite file that does not exist is an error (SQLite would create an empty one).
    """
    typed, url = url, normalize_url(url)  # errors echo the URL as the user typed it
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageError(
            f"storage URL {typed!r} cannot be parsed ({exc}); give an SQLAlchemy URL such as "
            "sqlite:///tuner.db or postgresql://user:pass@host/db"
        ) from None
    if not create:
        _refuse_missing_sqlite_file(parsed)
    kwargs: dict = {"pool_pre_ping": True, "future": True}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)
    try:
        engine = create_engine(url, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StorageError(f"storage URL {shown_url(typed)!r} cannot be used: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StorageError(
            f"storage {shown_url(typed)!r} cannot be reached ({reason}); "
            "check the host, port, credentials and that the database exists"
        ) from None
    return engine


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for another backend or an in-memory database)."""
    try:
        parsed = make_url(normalize_url(url))
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):  # a URI filename (sqlite:///file:x.db?mode=ro&uri=true)
        return Path(parsed.database[5:].split("?", 1)[0])
    return Path(parsed.database)


def _refuse_missing_sqlite_file(parsed) -> None:
    path = sqlite_file(parsed.render_as_string(hide_password=False))
    if path is not None and not path.is_file():
        raise StorageError(
            f"storage {parsed.render_as_string(hide_password=True)!r}: no database file at {str(path.resolve())!r}; "
            "check the path (sqlite:///relative.db, sqlite:////absolute.db) or run `tuner search` to create it"
        )


def tune_sqlite_engine(engine: Engine) -> Engine:
    """Give an engine built elsewhere (Optuna's ``RDBStorage``) the same SQLite settings as :func:`make_engine`'s:
    WAL, a busy timeout, and ``synchronous=NORMAL`` (in WAL a commit then writes without waiting for the disk: an
    Optuna trial's dozen commits, one per parameter, cost ~16 ms each on a VM's disk with the default FULL). Its
    pooled connections are dropped so every connection from now on has them. Other backends: unchanged."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        engine.dispose()
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
