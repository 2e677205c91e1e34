"""GET /api/studies/{name}/artifacts and the download of one artifact."""

from __future__ import annotations

from api_search_data import KERNEL_CONFIG, MIXED, STUDY
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
            assert r.headers["content-disposition"].startswith(f'attachment; filename="{a["name"].rsplit("/", 1)[-1]}"')
    launch = client.get(f"/api/studies/{STUDY}/artifacts/launch.sh")
    assert launch.headers["content-type"].startswith("text/x-shellscript") and launch.text.startswith("#!")
    assert client.get(f"/api/studies/{MIXED}/artifacts/best_params.json").json() == {"split_k": 4}
    report = client.get(f"/api/studies/{MIXED}/artifacts/report.md")
    assert report.headers["content-type"] == "text/markdown; charset=utf-8" and "✓" in report.text


def test_unknown_artifact_is_404_naming_it(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/artifacts/nothing.txt")
    assert r.status_code == 404 and "nothing.txt" in r.json()["detail"]


def test_kernel_config_with_slashes_downloads_from_its_listed_url(client: TestClient) -> None:
    listed = {a["name"]: a for a in client.get(f"/api/studies/{MIXED}/artifacts").json()}
    art = listed[KERNEL_CONFIG]
    assert "%2F" in art["url"]  # one path segment per name, as listed
    r = client.get(art["url"])
    assert r.status_code == 200, r.text
    assert r.json() == {"BLOCK_N": 64} and r.headers["content-type"].startswith("application/json")
    assert r.headers["content-disposition"].startswith(
        'attachment; filename="E=256,N=512,device_name=NVIDIA_H200.json"'
    )
    plain = client.get(f"/api/studies/{MIXED}/artifacts/{KERNEL_CONFIG}")  # the name with its slashes as they are
    assert plain.status_code == 200 and plain.content == r.content
