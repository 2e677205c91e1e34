"""The API's derived views on a 5,000-trial study built by benchmarks/api_large_study.py answer while a search writes
to it. How fast is the benchmark's figure (benchmarks/api_large_study.py, its WARM_TARGET_S column), not an assertion
here: under load the timing failed while nothing was wrong."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from benchmarks.api_large_study import STUDY, build_study
from storage import Repo

VIEWS = ("/importances", "/plots/history", "/plots/importances")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_views_of_a_5000_trial_study_answer_while_a_search_writes(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'large.db'}"
    build_study(url, 5000)
    stop = threading.Event()
    written: list[int] = []

    def search() -> None:  # one trial every 0.25 s, as tuner search writes it: Optuna's trial, tuner_ rows, events
        study, repo = optuna.load_study(study_name=STUDY, storage=url), Repo(url)
        run_id = repo.get_run(STUDY).id
        while not stop.is_set():
            t = study.ask()
            params = {
                "split_k": t.suggest_categorical("split_k", [1, 2, 4, 8]),
                "block_n": t.suggest_categorical("block_n", [32, 64, 128]),
                "context_length": t.suggest_categorical("context_length", [4096, 131072, 1048576]),
            }
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
            for _ in range(15):
                for v in VIEWS:
                    assert c.get(f"/api/studies/{STUDY}{v}").status_code == 200
                time.sleep(1.0)
        finally:
            stop.set()
            writer.join(timeout=30)
    assert len(written) >= 20, "the search wrote too few trials for the test to mean anything"
