"""What one app instance holds between requests: settings, the lazily opened storages, caches, child searches."""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import optuna
from sqlalchemy.exc import SQLAlchemyError

from api import optuna_views
from api.derived import DerivedViews
from api.schemas import ImportancesOut
from api.settings import ApiSettings
from storage import Repo, Run
from storage.engine import sqlite_file
from storage.queries import last_event_id

_logger = logging.getLogger(__name__)


class ApiState:
    """Opens the database once, on first use, so that ``create_app`` itself never touches it. It never creates
    one: a missing SQLite file answers 503 until a search creates it."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.derived = DerivedViews(settings.derived_refresh_s)
        """Importances and plot figures, computed once and refreshed on an interval (see :mod:`api.derived`)."""
        self.searches: dict[str, subprocess.Popen] = {}
        """Searches started by this process, by study name (reaped on the next control call)."""
        self._lock = threading.Lock()
        self._repo: Repo | None = None
        self._schema_ready = False
        self._optuna: optuna.storages.RDBStorage | None = None
        self._pool: ProcessPoolExecutor | None = None

    def repo(self) -> Repo:
        if self._repo is None:
            with self._lock:
                if self._repo is None:
                    self._repo = Repo(self.settings.storage_url, pool_size=20, create=False)
        return self._repo

    def opened_repo(self) -> Repo | None:
        """The repo when it is open already (no I/O), else None."""
        return self._repo

    def database_exists(self) -> bool:
        """False only for a SQLite file that is not there yet (a search started through the API creates it)."""
        path = sqlite_file(self.settings.storage_url)
        return path is None or path.is_file()

    def schema_ready(self) -> bool:
        """True once the ``tuner_`` tables exist (a fresh database has none until the first search)."""
        if not self._schema_ready:
            self._schema_ready = self.repo().has_schema()
        return self._schema_ready

    def optuna_storage(self) -> optuna.storages.RDBStorage:
        """Optuna's storage on the same URL, read-only in spirit: it never creates Optuna's tables."""
        if self._optuna is None:
            with self._lock:
                if self._optuna is None:
                    try:
                        self._optuna = optuna.storages.RDBStorage(
                            self.settings.storage_url, skip_table_creation=True, skip_compatibility_check=True
                        )
                    except SQLAlchemyError as exc:  # pragma: no cover - depends on the database server
                        raise LookupError(f"Optuna's storage cannot be opened: {exc}") from None
        return self._optuna

    def load_study(self, name: str) -> optuna.Study | None:
        """The Optuna study of that name, or None when Optuna holds none (yet)."""
        try:
            return optuna.load_study(study_name=name, storage=self.optuna_storage())
        except (KeyError, LookupError, SQLAlchemyError, optuna.exceptions.OptunaError) as exc:
            _logger.info("optuna study %r not loadable: %s", name, exc)
            return None

    def watch_search(self, name: str, proc: subprocess.Popen) -> None:
        """Keep ``proc`` under ``name`` and reap it as soon as it exits (a thread waits on it), so a finished search
        never lingers as a zombie process; :meth:`reap_searches` drops it from :attr:`searches` later."""
        self.searches[name] = proc

        def reap() -> None:
            code = proc.wait()
            _logger.info("search %r (pid %d) exited with %s", name, proc.pid, code)

        threading.Thread(target=reap, name=f"reap-{proc.pid}", daemon=True).start()

    # -- derived views: one computation per study, refreshed on an interval (api.derived) --------------------
    def in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(storage_url, *args)`` in this app's worker process (started on first use, spawned: no fork of a
        threaded server), so a computation of seconds never holds the server's GIL; a broken worker is replaced."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            pool = self._pool
        try:
            return pool.submit(fn, self.settings.storage_url, *args).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise

    def importances(self, run: Run) -> ImportancesOut:
        """The study's importances as held; ``/importances`` and ``/plots/importances`` share this one."""
        return self.derived.get(
            ("importances", run.study_name),
            last_event_id(self.repo(), run.id),
            lambda: self.in_worker(optuna_views.importances_in_worker, run.study_name),
        )

    def importances_figure(self, run: Run) -> str:
        imp = self.importances(run)
        version = (imp.n_complete, imp.reason, tuple((i.param, i.importance) for i in imp.importances))
        return self.derived.get(
            ("importances-figure", run.study_name),
            version,
            lambda: optuna_views.importances_figure_json(imp, run.objective or "objective"),
        )

    def history_figure(self, run: Run) -> str:
        return self.derived.get(
            ("history", run.study_name),
            last_event_id(self.repo(), run.id),
            lambda: self.in_worker(optuna_views.history_in_worker, run.study_name),
        )

    def reap_searches(self) -> None:
        for name, proc in list(self.searches.items()):
            if proc.poll() is not None:
                _logger.info("search %r (pid %d) exited with %s", name, proc.pid, proc.returncode)
                del self.searches[name]

    def close(self) -> None:
        """End the worker and the connections; the state stays usable (an app served again starts them afresh)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self._repo is not None:
            self._repo.engine.dispose()
        if self._optuna is not None:
            self._optuna.engine.dispose()
