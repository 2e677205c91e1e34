"""The app's state outlives one serving of it: after a shutdown (its lifespan's end) a new one computes again."""

from __future__ import annotations

from api_search_data import STUDY
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings


def test_importances_are_computed_again_after_the_app_was_shut_down_once(db_url: str) -> None:
    """Each `with TestClient(app)` runs the lifespan, whose end closes the worker pool: the next computation must
    start a new worker, not submit to the closed one (a fuzz run in CI got a 500 from /importances so)."""
    app = create_app(ApiSettings(storage_url=db_url))
    state = app.state.api
    with TestClient(app) as c:
        first = c.get(f"/api/studies/{STUDY}/importances")
        assert first.status_code == 200, first.text
    from api import optuna_views

    again = state.in_worker(optuna_views.importances_in_worker, STUDY)  # past the cache: the worker itself
    assert again.n_complete == first.json()["n_complete"]
    state.close()
