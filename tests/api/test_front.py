"""The dashboard's throughput–latency front of a goodput study: a real goodput search on the stand-in (a real
database), the figure from the API, and the study page in headless Chromium."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from api_search_data import STUDY
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings

CHROMIUM = shutil.which("chromium") or (Path("/usr/bin/chromium") if Path("/usr/bin/chromium").exists() else None)
SPACE = """
name: goodput-front
target: command
objective: {metric: goodput_tok_s_per_gpu, slo: {ttft_ms_p95: 300, tpot_ms_p95: 40}, pareto: tok_s_per_request}
params:
  slots: {type: categorical, values: [2, 4], default: 2, flag: --max-running-requests}
"""


@pytest.fixture(scope="module")
def goodput_db(tmp_path_factory) -> tuple[Path, str]:
    from tests.server.conftest import standin_command
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    tmp = tmp_path_factory.mktemp("front")
    (tmp / "g.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp / 'tuner.db'}"
    # a batch shares the decode (each of N running streams at 40 / (1 + (N - 1) / 2) tok/s): more load, more
    # throughput in all, slower users; 40 tok/s alone is a 25 ms TPOT, inside the 40 ms limit
    settings = {
        "command": standin_command(),
        "model": "standin",
        "port_range": "36000-36999",
        "prompt_len": 4,
        "output_len": 10,
        "warmup_requests": 1,
        "teardown_reserve_s": 3.0,
        "trial_timeout_s": 60,
        "extra_args": ["--tokens-per-second", "40", "--batch-slowdown", "0.5", "--ttft-ms", "20"],
        "goodput_arrivals": "constant",
        "goodput_start": 2,
        "goodput_window_s": 1.5,
        "goodput_min_requests": 8,
        "goodput_tolerance": 0.25,
        "goodput_repeats": 1,
    }
    run_search(
        SearchOptions(
            budget_s=150,
            storage_url=url,
            study="g",
            space_path=str(tmp / "g.yaml"),
            target="command",
            settings=settings,
            n_trials=2,
            confirm_top=0,
            refine_share=0.0,
            seed=3,
            out_dir=str(tmp / "out"),
        )
    )
    return tmp, url


def test_the_front_figure_has_every_load_measured_and_the_slo_region_from_the_tpot_limit(goodput_db):
    tmp, url = goodput_db
    db = sqlite3.connect(tmp / "tuner.db")
    loads = db.execute(
        "SELECT COUNT(DISTINCT t.number || m.level) FROM tuner_measurements m JOIN tuner_trials t "
        "ON t.id = m.trial_id WHERE m.level LIKE 'r=%' AND m.metric = 'tok_s_per_request' "
        "AND t.outcome IN ('ok', 'pruned')"
    ).fetchone()[0]
    with TestClient(create_app(ApiSettings(storage_url=url))) as client:
        r = client.get("/api/studies/g/plots/front")
    assert r.status_code == 200, r.text
    fig = r.json()
    assert fig["meta"]["points"] == loads and loads >= 2
    assert fig["meta"]["slo"] == [["ttft_ms_p95", 300.0], ["tpot_ms_p95", 40.0]]
    region = [s for s in fig["layout"]["shapes"] if s.get("type") == "rect"]
    assert len(region) == 1 and region[0]["x0"] == pytest.approx(1000 / 40)
    drawn = sum(len(t["x"]) for t in fig["data"] if t["name"] in ("met the SLO", "missed the SLO"))
    assert drawn == loads
    met = next((t for t in fig["data"] if t["name"] == "met the SLO"), None)
    assert met is not None and all(x >= 1000 / 40 for x in met["x"])  # a point within the SLO lies in its region
    front = next(t for t in fig["data"] if t["name"] == "front")
    assert front["x"] == sorted(front["x"]) and len(front["x"]) == len(fig["meta"]["front"])
    assert fig["meta"]["best"] is not None and any(t["name"].startswith("best within the SLO") for t in fig["data"])


def test_a_study_without_a_goodput_objective_has_no_front(client: TestClient) -> None:
    r = client.get(f"/api/studies/{STUDY}/plots/front")
    assert r.status_code == 404 and "measured no load of a goodput objective" in r.json()["detail"]


@pytest.mark.timeout(120)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_study_page_in_headless_chromium_draws_the_front(goodput_db, live_server, tmp_path) -> None:
    _, url = goodput_db
    server = live_server(ApiSettings(storage_url=url))
    dom = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=8000",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            f"{server.url}/?study=g",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    section = html[html.index('id="front-section"') : html.index('id="best-section"')]
    assert "hidden" not in section.split(">", 1)[0], "the front section stayed hidden"
    assert "js-plotly-plot" in section and "SLO region: TPOT ≤ 40 ms" in section, section[:2000]
    assert "best within the SLO: " in section
