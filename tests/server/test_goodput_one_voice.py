"""Goodput speaks with one voice (issue 50): after a search where nothing met the SLO, ``tuner best``, ``best
--json``, ``best --pareto``, ``export`` and ``export --slo`` all say so; ``export --slo`` checks every rule a load was
judged by (failed requests, tokens delivered), not just the latency limits; a header names how the tokens were
counted and the study's own rules, and records no concurrency levels the study never measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server.conftest import standin_command
from tuner.figures.verification import read_recorded

SPACE_YAML = """
name: one-voice
target: command
objective: {metric: goodput_tok_s_per_gpu, slo: {ttft_ms_p95: 150}}
params:
  ttft: {type: categorical, values: [TTFT], default: TTFT, flag: --ttft-ms}
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
    "goodput_arrivals": "constant",
    "goodput_start": 2,
    "goodput_min": 1,
    "goodput_max": 4,
    "goodput_window_s": 1.0,
    "goodput_min_requests": 8,
    "goodput_tolerance": 0.5,
    "goodput_repeats": 1,
}


def _search(tmp_path: Path, ttft: int, extra: list[str], **settings) -> str:
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    space = tmp_path / "g.yaml"
    space.write_text(SPACE_YAML.replace("TTFT", str(ttft)))
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    opts = SearchOptions(
        budget_s=120,
        storage_url=url,
        study="g",
        space_path=str(space),
        target="command",
        settings={**SETTINGS, "extra_args": ["--tokens-per-second", "200", *extra], **settings},
        n_trials=1,
        confirm_top=0,
        refine_share=0.0,
        seed=3,
        out_dir=str(tmp_path / "out"),
    )
    run_search(opts)
    return url


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120)


def test_when_nothing_met_the_slo_best_and_export_slo_say_so_with_exit_codes(tmp_path):
    url = _search(tmp_path, 400, [])  # 400 ms to the first token against a 150 ms limit: infeasible everywhere
    best = _tuner("best", "--storage", url, "--study", "g")
    assert best.returncode == 1, best.stdout + best.stderr
    assert "best trial" not in best.stdout and "no configuration met the SLO" in best.stderr
    as_json = _tuner("best", "--json", "--storage", url, "--study", "g")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["feasible"] is False
    slo = _tuner("export", "--storage", url, "--study", "g", "--out", str(tmp_path / "o"), "--slo", "ttft_ms_p95<=150")
    assert slo.returncode == 2 and "no measured load meets --slo" in slo.stderr, slo.stdout + slo.stderr
    pareto = _tuner("best", "--pareto", "--storage", url, "--study", "g")
    assert pareto.returncode == 0, pareto.stderr
    lines = pareto.stdout.splitlines()
    shown = int(lines[0].split(" points on the front")[0])
    rows = [ln for ln in lines[2:] if ln.strip() and not ln.strip().startswith("no measured load")]
    assert shown == len(rows) and "no measured load met the SLO" in pareto.stdout
    assert "*" not in "".join(ln[:30] for ln in rows)


def test_export_slo_checks_the_tokens_delivered_not_just_the_latency_limits(tmp_path):
    # the server stops after 5 of the 10 tokens asked: fast (ttft 20 ms), yet half of what was asked
    url = _search(tmp_path, 20, ["--ignore-eos-ignored", "5"])
    slo = _tuner("export", "--storage", url, "--study", "g", "--out", str(tmp_path / "o"), "--slo", "ttft_ms_p95<=5000")
    assert slo.returncode == 2, slo.stdout + slo.stderr
    assert "of the asked tokens delivered (min_delivered 0.95)" in slo.stderr
    assert not list((tmp_path / "o").rglob("launch.sh"))
    # and the advice names the cause, not the SLO: the latency held, the tokens did not come
    best = _tuner("best", "--storage", url, "--study", "g")
    assert best.returncode == 1 and "the latency limits held but it" in best.stderr, best.stderr
    assert "min_delivered" in best.stderr and "loosen the SLO" not in best.stderr


def test_a_goodput_export_header_names_the_counting_and_the_rules_and_records_no_unused_levels(tmp_path):
    url = _search(tmp_path, 20, ["--no-usage", "--empty-text-every", "3"], max_error_rate=0.05)
    done = _tuner("export", "--storage", url, "--study", "g", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stdout + done.stderr
    script = tmp_path / "o" / "g" / "launch.sh"
    text = script.read_text()
    assert "# tokens counted by: chunks" in text.replace("#   ", "# ")
    assert "at most 5% of requests failed (max_error_rate)" in text
    assert read_recorded(script)["levels"] == []
