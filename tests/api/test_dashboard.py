"""The dashboard: page, local plotly.js, Optuna figures as plotly JSON, and the page in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from api_search_data import MIXED, STUDY
from fastapi.testclient import TestClient

from api.settings import ApiSettings

CHROMIUM = shutil.which("chromium") or (Path("/usr/bin/chromium") if Path("/usr/bin/chromium").exists() else None)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_page_uses_local_plotly_and_the_event_stream(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script src="/vendor/plotly.min.js">' in r.text and "cdn" not in r.text.lower()
    assert 'id="trials"' in r.text and 'id="plot-history"' in r.text and 'id="launch-script"' in r.text
    js = client.get("/static/dashboard.js")
    assert js.status_code == 200 and "new EventSource(" in js.text and "Plotly.react" in js.text
    lib = client.get("/vendor/plotly.min.js")
    assert lib.status_code == 200 and lib.headers["content-type"].startswith("text/javascript")
    assert len(lib.content) > 1_000_000
    assert client.get("/static/dashboard.css").status_code == 200


def test_favicon_is_served_not_404(client: TestClient) -> None:
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml" and b"<svg" in r.content
    assert 'rel="icon"' in client.get("/").text


def test_plotly_bundle_is_sent_gzipped_to_clients_that_accept_it(client: TestClient) -> None:

    plain = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and len(plain.content) > 4_000_000
    r = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip, deflate"})
    assert r.headers["content-encoding"] == "gzip" and r.headers["vary"] == "Accept-Encoding"
    sent = int(r.headers["content-length"])
    assert sent < len(plain.content) / 2 and r.content == plain.content  # httpx decodes it: the same file


def test_best_says_why_it_differs_from_optunas_best(client: TestClient) -> None:
    best = client.get(f"/api/studies/{MIXED}/best").json()
    assert best["runs"] == [best["trial"]["number"]] and best["single_best_trial"] == best["trial"]["number"]
    assert best["why"].startswith(f"Best: trial {best['trial']['number']}, this configuration's one run")


def test_history_figure_is_optunas_against_time_with_baseline(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/plots/history")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    fig = json.loads(r.text)
    names = [t.get("name") for t in fig["data"]]
    assert "Best Value" in names  # Optuna's plot_optimization_history
    best = next(t for t in fig["data"] if t.get("name") == "Best Value")
    assert all(isinstance(x, float) for x in best["x"]) and best["x"] == sorted(best["x"])
    assert fig["layout"]["xaxis"]["title"]["text"] == "elapsed (s)"
    baseline = client.get(f"/api/studies/{STUDY}").json()["baseline_value"]
    assert any(s.get("y0") == baseline for s in fig["layout"].get("shapes", []))


def test_importances_figure(client: TestClient) -> None:
    fig = client.get(f"/api/studies/{MIXED}/plots/importances").json()
    assert fig["data"] and fig["data"][0]["type"] == "bar"
    assert set(fig["data"][0]["y"]) == {"split_k", "block_n", "context_cap"}


@pytest.mark.timeout(120)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_in_headless_chromium_shows_trials_and_plots(db_url: str, live_server, tmp_path) -> None:
    server = live_server(ApiSettings(storage_url=db_url))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    common = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--virtual-time-budget=8000"]  # fmt: skip
    url = f"{server.url}/?study={STUDY}"
    dom = subprocess.run([*common, f"--user-data-dir={tmp_path / 'profile1'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    (ARTIFACTS / "dashboard.html").write_text(html)
    assert html.count('class="trial-row') == 5, "the trial table has no rows"
    assert "(1–5 of 5, newest first)" in html and 'id="trials-older" type="button" disabled' in html
    assert "Best: trial " in html  # the word on why this row is the best
    assert html.count('class="study-row') == 2
    assert "plot-container" in html or "js-plotly-plot" in html, "no plotly plot was drawn"
    assert "#!" in html  # the launch script of the best configuration
    shot.unlink(missing_ok=True)
    subprocess.run([*common, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                    "--window-size=1280,900", url], capture_output=True, timeout=90)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.timeout(180)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize(("page", "drawn"), [("docs", 'class="opblock opblock-get"'), ("redoc", "api-content")])
def test_docs_render_offline_in_headless_chromium(db_url: str, live_server, tmp_path, page: str, drawn: str) -> None:
    server = live_server(ApiSettings(storage_url=db_url))
    offline = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"  # no name resolves: no CDN
    dom = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          "--disable-dev-shm-usage", "--virtual-time-budget=10000", offline,
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"{server.url}/{page}"],
                         check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert drawn in dom.stdout, f"/{page} drew nothing offline"
    assert "/api/studies/{name}/trials" in dom.stdout and "cdn." not in dom.stdout
