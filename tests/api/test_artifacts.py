"""GET /api/studies/{name}/artifacts and the download of one artifact."""

from __future__ import annotations

from api_search_data import MIXED, STUDY
from fastapi.testclient import TestClient


def test_list_artifacts_of_the_real_search(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/artifacts")
    assert r.status_code == 200
    by_name = {a["name"]: a for a in r.json()}
    assert "launch.sh" in by_name and by_name["launch.sh"]["kind"] == "launch_script"
    assert all(a["size"] > 0 for a in by_name.values())


def test_download_has_content_type_and_disposition(client: TestClient) -> None:
    for study in (STUDY, MIXED):
        for a in client.get(f"/api/studies/{study}/artifacts").json():
            r = client.get(a["url"])
            assert r.status_code == 200 and len(r.content) == a["size"]
            assert r.headers["content-disposition"].startswith(f'attachment; filename="{a["name"]}"')
    launch = client.get(f"/api/studies/{STUDY}/artifacts/launch.sh")
    assert launch.headers["content-type"].startswith("text/x-shellscript") and launch.text.startswith("#!")
    assert client.get(f"/api/studies/{MIXED}/artifacts/best_params.json").json() == {"split_k": 4}
    report = client.get(f"/api/studies/{MIXED}/artifacts/report.md")
    assert report.headers["content-type"] == "text/markdown; charset=utf-8" and "✓" in report.text


def test_unknown_artifact_is_404_naming_it(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/artifacts/nothing.txt")
    assert r.status_code == 404 and "nothing.txt" in r.json()["detail"]
