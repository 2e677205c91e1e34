"""Goodput agrees with itself (issue 43): the search's best, ``tuner best --pareto``, ``tuner export --slo`` and
``tuner verify`` are one decision and one value, and a configuration that never met the SLO is never exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from storage import Repo
from tests.server.conftest import standin_command
from tuner.figures.verification import read_recorded
from tuner.targets.server.goodput import LEVEL

# the baseline answers its first token after 400 ms: it misses a 150 ms TTFT at every load; 20 ms meets it
SPACE_YAML = """
name: goodput-agrees
target: command
objective: {metric: goodput_tok_s_per_gpu, slo: {ttft_ms_p95: 150}}
params:
  ttft: {type: categorical, values: [400, 20], default: 400, flag: --ttft-ms}
"""

SETTINGS = {
    "command": standin_command(),
    "model": "standin",
    "port_range": "34000-34999",
    "prompt_len": 4,
    "output_len": 10,
    "warmup_requests": 1,
    "teardown_reserve_s": 3.0,
    "trial_timeout_s": 60,
    "extra_args": ["--tokens-per-second", "40", "--max-running-requests", "2"],
    "goodput_arrivals": "constant",
    "goodput_start": 2,
    "goodput_min": 0.5,
    "goodput_window_s": 1.0,
    "goodput_min_requests": 8,
    "goodput_tolerance": 0.25,
    "goodput_repeats": 1,
}


def _search(tmp_path: Path, study: str, n_trials: int):
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    space = tmp_path / "g.yaml"
    space.write_text(SPACE_YAML)
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    opts = SearchOptions(
        budget_s=150,
        storage_url=url,
        study=study,
        space_path=str(space),
        target="command",
        settings=SETTINGS,
        n_trials=n_trials,
        confirm_top=0,
        refine_share=0.0,
        seed=3,
        out_dir=str(tmp_path / "out"),
    )
    return url, run_search(opts)


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a goodput search, export and verify on stand-in servers: 20-40 s of real load
def test_the_configuration_meeting_the_slo_is_one_decision_and_one_value_everywhere(tmp_path):
    url, result = _search(tmp_path, "g", 2)
    ran = {t.params["ttft"]: t for t in result.trials if t.repeat_of is None}
    assert set(ran) == {400, 20}, [(t.params, t.outcome, t.reason) for t in result.trials]
    assert ran[400].value == 0.0 and "infeasible" in ran[400].reason
    good = ran[20]
    assert good.outcome == "ok" and good.value > 0, good.reason
    # the search: that configuration, its value, exported
    assert result.best.number == good.number and result.best_value == pytest.approx(good.value)
    rec = read_recorded(Path(result.export_dir) / "launch.sh")
    assert rec["value"] == pytest.approx(good.value)
    # best --pareto: the best within the SLO is that trial, at that value
    front = _tuner("best", "--pareto", "--storage", url, "--study", "g")
    assert front.returncode == 0, front.stdout + front.stderr
    best_row = next(ln.split() for ln in front.stdout.splitlines() if "<- best within the SLO" in ln)
    assert int(best_row[4]) == good.number and float(best_row[0]) == pytest.approx(good.value, abs=0.06)
    # export --slo with the study's SLO: the same trial, the same value recorded
    out = tmp_path / "slo"
    exported = _tuner("export", "--storage", url, "--study", "g", "--out", str(out), "--slo", "ttft_ms_p95<=150")
    assert exported.returncode == 0, exported.stdout + exported.stderr
    slo_rec = read_recorded(out / "g" / "launch.sh")
    assert slo_rec["value"] == pytest.approx(good.value)
    repo = Repo(url)
    rows = {(m.metric, m.level): m.value for m in repo.get_trial(repo.get_run("g").id, good.number).measurements}
    assert slo_rec["goodput"]["load"] == pytest.approx(rows[("goodput_low", LEVEL)])
    # verify (from the storage): the exported configuration meets the SLO at that load, less the tolerance
    verified = _tuner("verify", "--storage", url, "--study", "g", "--timeout", "90s")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "meets the SLO at" in verified.stdout
    stored = json.loads(repo.get_artifact(repo.get_run("g").id, "verify.json").content)
    assert stored["ok"] is True and stored["outcome"] == "ok"


def test_a_study_where_nothing_met_the_slo_exports_nothing(tmp_path):
    url, result = _search(tmp_path, "none", 1)
    assert [t.value for t in result.trials] == [0.0]  # the baseline alone, infeasible
    assert result.export_dir is None
    done = _tuner("export", "--storage", url, "--study", "none", "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    assert "no configuration met the SLO" in done.stderr and "nothing to export" in done.stderr


def test_a_search_where_nothing_met_the_slo_exits_1_naming_the_slo_and_its_relaxation_and_stores_every_trial(tmp_path):
    import yaml

    space = tmp_path / "g.yaml"
    space.write_text(SPACE_YAML.replace("values: [400, 20]", "values: [400]") + yaml.safe_dump({"settings": SETTINGS}))
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = _tuner(
        "search",
        "--budget",
        "150s",
        "--space",
        str(space),
        "--target",
        "command",
        "--storage",
        url,
        "--study",
        "none",
        "--n-trials",
        "2",
        "--confirm-top",
        "0",
        "--refine-share",
        "0",
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "no configuration met the SLO" in errors[0], done.stderr
    assert "ttft_ms_p95<=150" in errors[0] and "loosen the SLO" in errors[0] and "goodput_min" in errors[0]
    repo = Repo(url)
    assert len(repo.list_trials(repo.get_run("none").id)) == 2  # every trial stored
    assert not list((tmp_path / "out").rglob("launch.sh"))  # nothing exported
