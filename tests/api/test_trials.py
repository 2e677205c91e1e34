"""GET /api/studies/{name}/trials (page, filters, sort) and /trials/{number}."""

from __future__ import annotations

import pytest
from api_search_data import STUDY
from fastapi.testclient import TestClient

URL = f"/api/studies/{STUDY}/trials"


def test_page_and_total(client: TestClient) -> None:
    first = client.get(URL, params={"limit": 5}).json()
    second = client.get(URL, params={"limit": 5, "offset": 5}).json()
    assert first["total"] == second["total"] == 12
    assert [t["number"] for t in first["items"]] == [0, 1, 2, 3, 4]
    assert [t["number"] for t in second["items"]] == [5, 6, 7, 8, 9]
    assert client.get(URL, params={"offset": 100}).json()["items"] == []


def test_filter_by_state_and_outcome(client: TestClient) -> None:
    pruned = client.get(URL, params={"state": "pruned"}).json()
    assert pruned["total"] == 1 and pruned["items"][0]["outcome"] == "pruned"
    failed = client.get(URL, params={"outcome": "out_of_resources"}).json()
    assert failed["total"] >= 1 and all(t["state"] == "failed" and t["value"] is None for t in failed["items"])
    assert all(t["reason"] for t in failed["items"])


@pytest.mark.parametrize("sort", ["value", "duration", "number"])
def test_sort_both_orders(client: TestClient, sort: str) -> None:
    key = {"value": "value", "duration": "duration_s", "number": "number"}[sort]
    for order in ("asc", "desc"):
        items = client.get(URL, params={"sort": sort, "order": order, "limit": 100}).json()["items"]
        values = [t[key] for t in items if t[key] is not None]
        assert values == sorted(values, reverse=order == "desc")
        assert all(t[key] is None for t in items[len(values):])  # missing values last


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"state": "bogus"}, {"outcome": "exploded"}, {"sort": "params"},
     {"order": "up"}, {"offset": "x"}, {"limit": 10**30}],
)  # fmt: skip
def test_bad_query_is_422(client: TestClient, params: dict) -> None:
    assert client.get(URL, params=params).status_code == 422


def test_trial_detail(client: TestClient) -> None:
    r = client.get(f"{URL}/0")
    assert r.status_code == 200
    t = r.json()
    assert t["is_baseline"] and t["outcome"] == "ok" and t["params"]["split_k"] == 1
    assert {(m["metric"], m["level"]) for m in t["measurements"]} >= {("tok_s", "c=1"), ("tok_s", "c=64")}
    assert t["log_excerpt"] and t["started_at"] and t["finished_at"] and t["duration_s"] == 0.5


def test_unknown_trial_is_404_and_bad_number_422(client: TestClient) -> None:
    r = client.get(f"{URL}/999")
    assert r.status_code == 404 and "999" in r.json()["detail"] and STUDY in r.json()["detail"]
    assert client.get(f"{URL}/-1").status_code == 422
    assert client.get(f"{URL}/abc").status_code == 422
    assert client.get(f"{URL}/{2**70}").status_code == 422
