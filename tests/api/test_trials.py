"""GET /api/studies/{name}/trials (page, filters, sort) and /trials/{number}."""

from __future__ import annotations

import pytest
from api_search_data import MIXED, STUDY
from fastapi.testclient import TestClient


def url(study: str = STUDY) -> str:
    return f"/api/studies/{study}/trials"


def test_page_and_total(client: TestClient) -> None:
    first = client.get(url(), params={"limit": 4}).json()
    second = client.get(url(), params={"limit": 4, "offset": 4}).json()
    assert first["total"] == second["total"] == 5
    assert [t["number"] for t in first["items"]] == [0, 1, 2, 3]
    assert [t["number"] for t in second["items"]] == [4]
    assert client.get(url(), params={"offset": 100}).json()["items"] == []


def test_filter_by_state_and_outcome(client: TestClient) -> None:
    pruned = client.get(url(MIXED), params={"state": "pruned"}).json()
    assert pruned["total"] == 1 and pruned["items"][0]["outcome"] == "pruned"
    failed = client.get(url(MIXED), params={"outcome": "out_of_resources"}).json()
    assert failed["total"] == 1 and all(t["state"] == "failed" and t["value"] is None for t in failed["items"])
    assert "shared memory" in failed["items"][0]["reason"]
    ok = client.get(url(), params={"state": "complete", "outcome": "ok"}).json()
    assert ok["total"] == 5 and all(t["value"] > 0 for t in ok["items"])


@pytest.mark.parametrize("study", [STUDY, MIXED])
@pytest.mark.parametrize("sort", ["value", "duration", "number"])
def test_sort_both_orders(client: TestClient, study: str, sort: str) -> None:
    key = {"value": "value", "duration": "duration_s", "number": "number"}[sort]
    for order in ("asc", "desc"):
        items = client.get(url(study), params={"sort": sort, "order": order, "limit": 100}).json()["items"]
        values = [t[key] for t in items if t[key] is not None]
        assert values == sorted(values, reverse=order == "desc")
        assert all(t[key] is None for t in items[len(values) :])  # missing values last


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"state": "bogus"}, {"outcome": "exploded"}, {"sort": "params"},
     {"order": "up"}, {"offset": "x"}, {"limit": 10**30}, {"offset": 10**10}],
)  # fmt: skip
def test_bad_query_is_422(client: TestClient, params: dict) -> None:
    r = client.get(url(), params=params)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "query"


def test_trial_detail(client: TestClient) -> None:
    r = client.get(f"{url()}/0")
    assert r.status_code == 200
    t = r.json()
    assert t["is_baseline"] and t["outcome"] == "ok" and t["params"]
    assert {(m["metric"], m["level"]) for m in t["measurements"]} >= {("tok_s", "c=1"), ("step_ms", "c=1")}
    assert t["started_at"] and t["finished_at"] and t["duration_s"] > 0


def test_failed_trial_detail_has_reason_and_log(client: TestClient) -> None:
    failed = client.get(url(MIXED), params={"state": "failed"}).json()["items"][0]
    t = client.get(f"{url(MIXED)}/{failed['number']}").json()
    assert t["outcome"] == "out_of_resources" and t["reason"] and t["log_excerpt"] and t["value"] is None


def test_unknown_trial_is_404_and_bad_number_422(client: TestClient) -> None:
    r = client.get(f"{url()}/999")
    assert r.status_code == 404 and "999" in r.json()["detail"] and STUDY in r.json()["detail"]
    assert client.get(f"{url()}/-1").status_code == 422
    assert client.get(f"{url()}/abc").status_code == 422
    assert client.get(f"{url()}/{2**70}").status_code == 422
