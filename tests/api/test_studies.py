"""GET /api/studies, /api/studies/{name}, /best, /importances, /environment."""

from __future__ import annotations

import pytest
from api_search_data import MIXED, STUDY, fake_search
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings


def test_list_studies_summarises_each_run(client: TestClient) -> None:
    r = client.get("/api/studies")
    assert r.status_code == 200
    by_name = {s["name"]: s for s in r.json()}
    assert set(by_name) == {STUDY, MIXED}
    for s in by_name.values():
        assert s["state"] == "finished" and s["target"] == "workload" and s["budget_s"] > 0
        assert s["elapsed_s"] >= 0 and s["n_trials"] == sum(s["trials_by_outcome"].values())
        assert s["best_value"] >= s["baseline_value"] > 0
        assert s["speedup_vs_baseline"] == pytest.approx(s["best_value"] / s["baseline_value"])
    assert by_name[STUDY]["n_trials"] == 5 and by_name[STUDY]["space"]
    assert by_name[MIXED]["trials_by_outcome"] == {"ok": 10, "out_of_resources": 1, "pruned": 1}


def test_get_study_has_detail(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}")
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == STUDY and body["space_yaml"] and body["settings"]["run_host"]
    assert body["best_trial_number"] is not None and body["export_dir"]


def test_unknown_study_is_404_naming_it(client: TestClient) -> None:
    for path in ("", "/best", "/importances", "/environment", "/trials", "/trials/0", "/artifacts",
                 "/artifacts/launch.sh", "/events", "/plots/history", "/plots/importances"):  # fmt: skip
        r = client.get(f"/api/studies/no-such-study{path}")
        assert r.status_code == 404, path
        assert "no-such-study" in r.json()["detail"]


def test_best_has_trial_measurements_and_launch_script(client: TestClient) -> None:
    study = client.get(f"/api/studies/{STUDY}").json()
    r = client.get(f"/api/studies/{STUDY}/best")
    assert r.status_code == 200
    best = r.json()
    assert best["value"] == study["best_value"] and best["trial"]["number"] == study["best_trial_number"]
    assert best["trial"]["outcome"] == "ok" and best["trial"]["params"]
    assert {m["metric"] for m in best["trial"]["measurements"]} >= {"tok_s", "step_ms"}
    assert best["launch_script"] and best["launch_script"].startswith("#!")
    assert best["speedup_vs_baseline"] >= 1


def test_best_of_a_study_without_complete_trial_is_404(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'none.db'}"
    from storage import Repo

    repo = Repo(url)
    repo.create_schema()
    repo.create_run("empty", target="workload", budget_s=10)
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        r = c.get("/api/studies/empty/best")
        assert r.status_code == 404 and "no complete trial" in r.json()["detail"]
        imp = c.get("/api/studies/empty/importances").json()
        assert imp["importances"] == [] and imp["reason"]
        assert c.get("/api/studies/empty/plots/history").status_code == 200


def test_importances_rank_params(client: TestClient) -> None:
    for name in (STUDY, MIXED):
        r = client.get(f"/api/studies/{name}/importances")
        assert r.status_code == 200
        body = r.json()
        assert body["n_complete"] >= 2
        if body["importances"]:
            values = [i["importance"] for i in body["importances"]]
            assert values == sorted(values, reverse=True) and body["reason"] == ""
        else:
            assert body["reason"]
    mixed = client.get(f"/api/studies/{MIXED}/importances").json()
    assert {i["param"] for i in mixed["importances"]} == {"split_k", "block_n", "context_cap"}


def test_importances_empty_with_reason_when_too_few_trials(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'few.db'}"
    fake_search(url, "few", n_trials=1)
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        body = c.get("/api/studies/few/importances").json()
        assert body["importances"] == [] and "at least 2 complete trials" in body["reason"]
        assert c.get("/api/studies/few/plots/importances").status_code == 200


def test_environment(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/environment")
    assert r.status_code == 200
    env = r.json()["environment"]
    assert env["optuna"] and "torch" in env


def test_empty_database_has_no_studies(tmp_path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").execute("CREATE TABLE other (x)").connection.close()  # a file, no tables
    with TestClient(create_app(ApiSettings(storage_url=f"sqlite:///{tmp_path / 'empty.db'}"))) as c:
        assert c.get("/api/studies").json() == []
        assert c.get("/api/studies/x").status_code == 404
        assert c.get("/health").json()["status"] == "ok"


def test_missing_database_file_is_503_and_never_created(tmp_path) -> None:
    path = tmp_path / "typo.db"
    with TestClient(create_app(ApiSettings(storage_url=f"sqlite:///{path}"))) as c:
        r = c.get("/api/studies")
        assert r.status_code == 503 and "no database file" in r.json()["detail"] and "typo.db" in r.json()["detail"]
        assert c.get("/api/studies/x").status_code == 503
        assert c.get("/health").json()["status"] == "degraded"
    assert not path.exists()


def test_times_are_utc_with_their_offset(client: TestClient) -> None:
    from datetime import datetime, timedelta

    study = client.get(f"/api/studies/{STUDY}").json()
    trial = client.get(f"/api/studies/{STUDY}/trials/0").json()
    for text in (study["started_at"], study["ended_at"], trial["started_at"], trial["finished_at"]):
        t = datetime.fromisoformat(text)
        assert t.utcoffset() == timedelta(0), text  # "+00:00" (or "Z"): no client reads it as local time


def test_resumed_study_reports_every_segment(tmp_path) -> None:
    import json
    import time

    url = f"sqlite:///{tmp_path / 'twice.db'}"
    t0 = time.monotonic()
    fake_search(url, "twice", n_trials=6, delay_s=0.05, budget_s=300)
    time.sleep(1.0)  # the gap between the two searches is not searched time
    fake_search(url, "twice", n_trials=6, delay_s=0.05, resume=True, seed=1, budget_s=300)
    wall = time.monotonic() - t0
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        s = c.get("/api/studies/twice").json()
        first = c.get("/api/studies/twice/trials", params={"limit": 1}).json()["items"][0]
        fig = json.loads(c.get("/api/studies/twice/plots/history").text)
    assert s["budget_s"] == 600 and s["segments"] == 2 and s["n_trials"] == 12
    assert s["started_at"] <= first["started_at"]  # the first search's start, not the resume's
    assert 0.6 < s["elapsed_s"] < wall - 0.9  # two segments of 6 x 0.05 s and more; the 1 s gap left out
    xs = next(t for t in fig["data"] if t.get("mode") == "markers")["x"]
    assert len(xs) >= 8 and len({round(x, 2) for x in xs}) >= 7, xs  # not bunched at x = 0
    assert max(xs) <= s["elapsed_s"] + 0.01


def test_best_of_a_rerun_configuration_names_its_runs_and_optunas_other_best(tmp_path) -> None:
    from storage import Repo

    url = f"sqlite:///{tmp_path / 'reruns.db'}"
    repo = Repo(url)
    repo.create_schema()
    run = repo.create_run("reruns", target="workload", budget_s=60)
    for number, params, value in ((0, {"a": 0}, 10.0), (1, {"a": 1}, 30.0), (2, {"a": 2}, 33.0), (3, {"a": 1}, 32.0)):
        repo.start_trial(run.id, number, params, is_baseline=number == 0)
        repo.finish_trial(run.id, number, outcome="ok", value=value)
    repo.set_best(run.id, 3, 31.0)  # the median of trials 1 and 3; trial 2 timed once, higher
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        best = c.get("/api/studies/reruns/best").json()
    assert best["value"] == 31.0 and best["runs"] == [1, 3] and best["single_best_trial"] == 2
    assert "median of 2 runs of this configuration (trials 1, 3)" in best["why"]
    assert "Optuna's best trial is 2" in best["why"] and "lucky draw" in best["why"]


def test_objective_is_named_for_optuna_dashboard(db_url: str, client: TestClient) -> None:
    import optuna

    study = client.get(f"/api/studies/{STUDY}").json()
    names = optuna.load_study(study_name=STUDY, storage=db_url).metric_names
    assert names == [f"{study['objective']} ({study['unit']})"]  # not "Objective 0"
