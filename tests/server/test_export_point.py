"""``tuner export --point`` / ``--slo`` on a goodput study: a real search on the stand-in (two configurations, a
real database), then each export as its own process, as a user would run it."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import standin_command
from tuner.figures.verification import read_recorded

ROOT = Path(__file__).resolve().parents[2]
SPACE = """
name: goodput-export
target: command
objective: {metric: goodput_tok_s_per_gpu, slo: {ttft_ms_p95: 300}, pareto: tok_s_per_request}
params:
  slots: {type: categorical, values: [2, 4], default: 2, flag: --max-running-requests}
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    tmp = tmp_path_factory.mktemp("export_point")
    space = tmp / "g.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp / 'tuner.db'}"
    settings = {
        "command": standin_command(),
        "model": "standin",
        "port_range": "35000-35999",
        "prompt_len": 4,
        "output_len": 10,
        "warmup_requests": 1,
        "teardown_reserve_s": 3.0,
        "trial_timeout_s": 60,
        "extra_args": ["--tokens-per-second", "40", "--ttft-ms", "20"],
        "goodput_arrivals": "constant",
        "goodput_start": 4,
        "goodput_window_s": 1.5,
        "goodput_min_requests": 8,
        "goodput_tolerance": 0.25,
        "goodput_repeats": 1,
        "goodput_incumbent_check": False,
    }
    opts = SearchOptions(
        budget_s=150,
        storage_url=url,
        study="g",
        space_path=str(space),
        target="command",
        settings=settings,
        n_trials=2,
        confirm_top=0,
        refine_share=0.0,
        seed=1,
        out_dir=str(tmp / "out"),
    )
    result = run_search(opts)
    assert [t.outcome for t in result.trials if t.repeat_of is None] == ["ok", "ok"], [t.reason for t in result.trials]
    return tmp, url


def _export(url: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "export", "--storage", url, "--study", "g", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _levels(tmp: Path) -> dict[tuple[int, str], dict[str, float]]:
    """Every figure stored per (trial, load) in the study database."""
    db = sqlite3.connect(tmp / "tuner.db")
    out: dict[tuple[int, str], dict[str, float]] = {}
    for number, metric, level, value in db.execute(
        "SELECT t.number, m.metric, m.level, m.value FROM tuner_measurements m JOIN tuner_trials t "
        "ON t.id = m.trial_id WHERE m.level LIKE 'r=%'"
    ):
        out.setdefault((number, level), {})[metric] = value
    return out


def test_export_slo_writes_the_best_point_meeting_that_slo_and_says_so_in_the_header(study, tmp_path):
    tmp, url = study
    levels = _levels(tmp)
    ttfts = sorted(f["ttft_ms_p95"] for f in levels.values() if "ttft_ms_p95" in f)
    # a limit between the measured TTFTs: some loads meet it, some do not
    limit = round(ttfts[len(ttfts) // 2] + 0.05, 1)
    meets = {
        k: f
        for k, f in levels.items()
        if f.get("ttft_ms_p95", math.inf) <= limit and f.get("error_rate", 0) == 0 and f.get("kept_up", 1) == 1
    }
    assert meets and len(meets) < len(levels)
    want = max(meets, key=lambda k: (meets[k]["tok_s"], float(k[1][2:])))
    done = _export(url, tmp_path, "--slo", f"ttft_ms_p95<={limit}")
    assert done.returncode == 0, done.stdout + done.stderr
    script = tmp_path / "g" / "launch.sh"
    text = script.read_text()
    assert f"exported for: SLO ttft_ms_p95<={limit:g}: trial {want[0]} at {want[1]}" in text, text[:1500]
    rec = read_recorded(script)
    assert rec["goodput"]["load"] == float(want[1][2:]) and rec["goodput"]["slo"] == [["ttft_ms_p95", limit]]
    db = sqlite3.connect(tmp / "tuner.db")
    (params,) = db.execute("SELECT params FROM tuner_trials WHERE number = ?", (want[0],)).fetchone()
    assert f"--max-running-requests {json.loads(params)['slots']}" in text, text


def test_export_point_by_trial_and_load_names_it_in_the_header(study, tmp_path):
    tmp, url = study
    (trial, load), figs = sorted(_levels(tmp).items())[-1]
    done = _export(url, tmp_path, "--point", f"{trial}@{load}")
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "g" / "launch.sh").read_text()
    assert f"exported for: point {trial}@{load} ({figs['tok_s']:.1f} tok/s per GPU" in text, text[:1500]
    assert read_recorded(tmp_path / "g" / "launch.sh")["goodput"]["load"] == float(load[2:])


@pytest.mark.parametrize(
    "args, says",
    [
        (("--point", "99@r=1"), "error: --point '99@r=1' names no measured load of this study; give trial@load, e.g. "),
        (
            ("--slo", "ttft_ms_p95<=0.001"),
            "error: no measured load meets --slo 'ttft_ms_p95<=0.001' (at most 1% of "
            "requests failed (max_error_rate), at least 95% of the asked tokens delivered (min_delivered)); the closest: ",
        ),
        (("--slo", "queue_ms<=3"), "error: --slo metric 'queue_ms' is not measured at each load; use one of "),
        (("--slo", "ttft_ms_p95>3"), "error: --slo part 'ttft_ms_p95>3' is not `metric<=limit`"),
    ],
)
def test_an_unknown_point_or_an_slo_no_point_meets_is_one_line_and_writes_nothing(study, tmp_path, args, says):
    _, url = study
    done = _export(url, tmp_path / "out", *args)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), done.stderr
    assert not (tmp_path / "out" / "g").exists()


def test_export_point_by_trial_number_takes_its_goodput_boundary(study, tmp_path):
    tmp, url = study
    db = sqlite3.connect(tmp / "tuner.db")
    number, low = db.execute(
        "SELECT t.number, m.value FROM tuner_measurements m JOIN tuner_trials t ON t.id = "
        "m.trial_id WHERE m.metric = 'goodput_low' ORDER BY t.number"
    ).fetchone()
    done = _export(url, tmp_path, "--point", str(number))
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "g" / "launch.sh").read_text()
    assert f"exported for: point {number}@r={low:g} (trial {number} at its goodput boundary r={low:g}" in text


def test_best_pareto_shows_whether_the_server_kept_up_at_each_point(study):
    tmp, url = study
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "best", "--pareto", "--storage", url, "--study", "g"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "kept up" in lines[1], out.stdout
    levels = _levels(tmp)
    for row in lines[2:]:
        cells = row.split()
        if not cells or not cells[0][0].isdigit():
            continue
        i = 3 if cells[2] == "*" else 2
        flag, trial, load = cells[i], int(cells[i + 1]), cells[i + 2]
        stored = levels[(trial, load)].get("kept_up")
        assert flag == ("-" if stored is None else "yes" if stored == 1 else "no"), (row, stored)
