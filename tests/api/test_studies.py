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
    with TestClient(create_app(ApiSettings(storage_url=f"sqlite:///{tmp_path / 'empty.db'}"))) as c:
        assert c.get("/api/studies").json() == []
        assert c.get("/api/studies/x").status_code == 404
        assert c.get("/health").json()["status"] == "ok"
