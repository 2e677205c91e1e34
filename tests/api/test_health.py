"""GET /health and the OpenAPI document."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_health(client: TestClient) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "storage": "ok", "control_enabled": False}


def test_head_health_answers_like_get_without_a_body(client: TestClient) -> None:
    r = client.head("/health")
    assert r.status_code == 200 and r.content == b""


def test_unreachable_storage_is_degraded_503_not_500(tmp_path) -> None:
    from api.app import create_app
    from api.settings import ApiSettings

    settings = ApiSettings(storage_url=f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    with TestClient(create_app(settings)) as c:
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "degraded"  # a load balancer can tell
        assert c.head("/health").status_code == 503
        r = c.get("/api/studies")
        assert r.status_code == 503 and "storage" in r.json()["detail"]


def test_openapi_and_docs(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/api/studies", "/api/studies/{name}/trials", "/api/studies/{name}/events", "/api/searches"):
        assert path in spec["paths"]
    assert client.get("/docs").status_code == 200
