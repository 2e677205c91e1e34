"""benchmarks/deployable_report.py over the H200 studies filed under benchmarks/results/ (issue 42): it exports each
stored study here, and its markdown carries both predictions, the command and the side-by-side ratios."""

from __future__ import annotations

import subprocess
import sys

from benchmark_scripts import ROOT

R = "benchmarks/results"
OFF = f"{R}/main_job/h200/2026-12-02_5f687fb_7m_seed0.db.gz#dsv4-flash-workload"
ON = f"{R}/deployable/h200/2026-12-02_5f687fb_on.db.gz#dsv4-deployable-on"
SIDE = f"{R}/deployable/h200/2026-12-02_5f687fb_side_by_side.json"


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "deployable_report.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_the_filed_report_is_what_the_script_writes_from_the_filed_studies():
    proc = _report("--side-by-side", SIDE, f"off=sqlite:///{OFF}", f"on=sqlite:///{ON}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the export's date line is the moment of the export: the rest is the filed file's, line for line
    got = [ln for ln in proc.stdout.splitlines() if "exported by tuner" not in ln]
    filed = [
        ln
        for ln in (ROOT / R / "deployable/h200/2026-12-02_5f687fb.md").read_text().splitlines()
        if "exported by tuner" not in ln
    ]
    assert got == filed
    text = proc.stdout
    assert text.count("  this command: c=1") == 2 and text.count("  with these code changes: c=1") == 2
    assert "--context-length 8192" in text and "--context-length 32768" in text
    # where each search and the side-by-side run ran, read from the study's record and the JSON
    assert text.count("- searched on NVIDIA H200 on 2026-12-02, torch 2.11.0, commit 5f687fb") == 2
    assert "## Side by side on NVIDIA H200:" in text
    assert "best found by `dsv4-deployable-on` (trial 30, stored 262.68) / the exported command of" in text


def test_a_study_spec_without_a_database_is_one_line_naming_it():
    proc = _report("off=sqlite:///nowhere.db#study")
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1] == (
        "error: off=sqlite:///nowhere.db#study: no database at nowhere.db"
    )
