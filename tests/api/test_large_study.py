"""Derived views (importances, plots) are computed once, then served from memory and refreshed on an interval,
never per event: on a small study the computations are counted; on a 5,000-trial study they stay under 1 s warm
while a search writes to it (benchmarks/api_large_study.py measures the same with a real server)."""

from __future__ import annotations

import logging
import threading
import time

import optuna
import pytest
from api_search_data import fake_search
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from benchmarks.api_large_study import STUDY, build_study
from storage import Repo

VIEWS = ("/importances", "/plots/history", "/plots/importances")


def _computed(caplog) -> list[str]:
    return [str(r.args[0][0]) for r in caplog.records if r.name == "api.derived" and r.msg.startswith("computed")]


def test_each_view_is_computed_once_and_not_per_event(tmp_path, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'once.db'}"
    fake_search(url, "once", n_trials=8)
    with caplog.at_level(logging.INFO, logger="api.derived"), \
            TestClient(create_app(ApiSettings(storage_url=url, derived_refresh_s=3600))) as c:
        first = {v: c.get(f"/api/studies/once{v}").text for v in VIEWS}
        assert sorted(_computed(caplog)) == ["history", "importances", "importances-figure"]  # importances once
        fake_search(url, "once", n_trials=4, resume=True, seed=2)  # new trials and events
        again = {v: c.get(f"/api/studies/once{v}").text for v in VIEWS}
        assert again == first and len(_computed(caplog)) == 3, "a new event recomputed a view before its interval"


def test_a_changed_study_is_refreshed_after_the_interval(tmp_path, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    fake_search(url, "fresh", n_trials=6)
    with caplog.at_level(logging.INFO, logger="api.derived"), \
            TestClient(create_app(ApiSettings(storage_url=url, derived_refresh_s=0.2))) as c:
        before = c.get("/api/studies/fresh/importances").json()["n_complete"]
        fake_search(url, "fresh", n_trials=6, resume=True, seed=3)
        time.sleep(0.3)
        deadline = time.monotonic() + 30
        while c.get("/api/studies/fresh/importances").json()["n_complete"] == before:  # held, refreshing behind
            assert time.monotonic() < deadline, "the importances were never refreshed"
            time.sleep(0.1)
        n = len(_computed(caplog))
        for _ in range(5):  # unchanged study: nothing more to compute, however often it is asked
            c.get("/api/studies/fresh/importances")
            time.sleep(0.1)
        assert len(_computed(caplog)) == n


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_views_of_a_5000_trial_study_stay_under_1s_warm_while_a_search_writes(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'large.db'}"
    build_study(url, 5000)
    stop = threading.Event()
    written: list[int] = []

    def search() -> None:  # one trial every 0.25 s, as tuner search writes it: Optuna's trial, tuner_ rows, events
        study, repo = optuna.load_study(study_name=STUDY, storage=url), Repo(url)
        run_id = repo.get_run(STUDY).id
        while not stop.is_set():
            t = study.ask()
            params = {"split_k": t.suggest_categorical("split_k", [1, 2, 4, 8]),
                      "block_n": t.suggest_categorical("block_n", [32, 64, 128]),
                      "context_length": t.suggest_categorical("context_length", [4096, 131072, 1048576])}
            repo.start_trial(run_id, t.number, params)
            repo.finish_trial(run_id, t.number, outcome="ok", value=100.0 + t.number % 7)
            study.tell(t, 100.0 + t.number % 7)
            written.append(t.number)
            time.sleep(0.25)

    with TestClient(create_app(ApiSettings(storage_url=url, derived_refresh_s=1.0))) as c:
        for v in VIEWS:  # cold: computed once each
            assert c.get(f"/api/studies/{STUDY}{v}").status_code == 200
        writer = threading.Thread(target=search, daemon=True)
        writer.start()
        try:
            slowest = {}
            for _ in range(15):
                for v in VIEWS:
                    t = time.perf_counter()
                    assert c.get(f"/api/studies/{STUDY}{v}").status_code == 200
                    slowest[v] = max(slowest.get(v, 0.0), time.perf_counter() - t)
                time.sleep(1.0)
        finally:
            stop.set()
            writer.join(timeout=30)
    assert len(written) >= 20, "the search wrote too few trials for the test to mean anything"
    assert all(s < 1.0 for s in slowest.values()), slowest
