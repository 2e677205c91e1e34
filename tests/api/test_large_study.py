"""Derived views (importances, plots) are computed once, then served from memory and refreshed on an interval,
never per event: on a small study the computations are counted; a 5,000-trial study answers while a search writes
to it (benchmarks/tests/test_api_large_study.py), and how fast (under 1 s warm) is benchmarks/api_large_study.py's
figure, with a real server."""

from __future__ import annotations

import logging
import time

from api_search_data import fake_search
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings

VIEWS = ("/importances", "/plots/history", "/plots/importances")


def _computed(caplog) -> list[str]:
    return [str(r.args[0][0]) for r in caplog.records if r.name == "api.derived" and r.msg.startswith("computed")]


def test_each_view_is_computed_once_and_not_per_event(tmp_path, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'once.db'}"
    fake_search(url, "once", n_trials=8)
    with (
        caplog.at_level(logging.INFO, logger="api.derived"),
        TestClient(create_app(ApiSettings(storage_url=url, derived_refresh_s=3600))) as c,
    ):
        first = {v: c.get(f"/api/studies/once{v}").text for v in VIEWS}
        assert sorted(_computed(caplog)) == ["history", "importances", "importances-figure"]  # importances once
        fake_search(url, "once", n_trials=4, resume=True, seed=2)  # new trials and events
        again = {v: c.get(f"/api/studies/once{v}").text for v in VIEWS}
        assert again == first and len(_computed(caplog)) == 3, "a new event recomputed a view before its interval"


def test_a_changed_study_is_refreshed_after_the_interval(tmp_path, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    fake_search(url, "fresh", n_trials=6)
    with (
        caplog.at_level(logging.INFO, logger="api.derived"),
        TestClient(create_app(ApiSettings(storage_url=url, derived_refresh_s=0.2))) as c,
    ):
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
