"""GET /api/studies, /api/studies/{name}, /best, /importances, /environment."""

from __future__ import annotations

from api_search_data import STUDY, fake_search
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings


def test_list_studies_summarises_each_run(client: TestClient) -> None:
    r = client.get("/api/studies")
    assert r.status_code == 200
    (s,) = [x for x in r.json() if x["name"] == STUDY]
    assert s["state"] == "finished" and s["target"] == "workload" and s["budget_s"] == 60.0
    assert s["elapsed_s"] >= 0 and s["n_trials"] == sum(s["trials_by_outcome"].values()) == 12
    assert {"ok", "pruned"} <= set(s["trials_by_outcome"]) and s["trials_by_outcome"].get("out_of_resources", 0) >= 1
    assert s["best_value"] > s["baseline_value"] > 0
    assert abs(s["speedup_vs_baseline"] - s["best_value"] / s["baseline_value"]) < 1e-9


def test_get_study_has_detail(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}")
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == STUDY and body["space_yaml"] and body["settings"]["host"]
    assert body["best_trial_number"] is not None


def test_unknown_study_is_404_naming_it(client: TestClient) -> None:
    for path in ("", "/best", "/importances", "/environment", "/trials", "/artifacts", "/events", "/plots/history"):
        r = client.get(f"/api/studies/no-such-study{path}")
        assert r.status_code == 404, path
        assert "no-such-study" in r.json()["detail"]


def test_best_has_trial_measurements_and_launch_script(client: TestClient) -> None:
    study = client.get(f"/api/studies/{STUDY}").json()
    r = client.get(f"/api/studies/{STUDY}/best")
    assert r.status_code == 200
    best = r.json()
    assert best["value"] == study["best_value"] and best["trial"]["number"] == study["best_trial_number"]
    assert best["trial"]["outcome"] == "ok" and best["trial"]["measurements"]
    assert best["launch_script"].startswith("#!/usr/bin/env bash")
    assert best["speedup_vs_baseline"] > 1


def test_importances_rank_params(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/importances")
    assert r.status_code == 200
    body = r.json()
    assert body["reason"] == "" and body["n_complete"] >= 2
    names = [i["param"] for i in body["importances"]]
    assert set(names) == {"split_k", "block_n", "context_cap"}
    values = [i["importance"] for i in body["importances"]]
    assert values == sorted(values, reverse=True)


def test_importances_empty_with_reason_when_too_few_trials(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'few.db'}"
    fake_search(url, "few", n_trials=1)
    with TestClient(create_app(ApiSettings(storage_url=url))) as c:
        body = c.get("/api/studies/few/importances").json()
        assert body["importances"] == [] and "at least 2 complete trials" in body["reason"]
        assert c.get("/api/studies/few/plots/importances").status_code == 200


def test_environment(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/environment")
    assert r.status_code == 200 and r.json()["environment"]["gpu"] == "cpu"


def test_empty_database_has_no_studies(tmp_path) -> None:
    with TestClient(create_app(ApiSettings(storage_url=f"sqlite:///{tmp_path / 'empty.db'}"))) as c:
        assert c.get("/api/studies").json() == []
        assert c.get("/api/studies/x").status_code == 404
        assert c.get("/health").json()["status"] == "ok"
