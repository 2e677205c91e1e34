"""Whole searches (a real Optuna study in a real database, trials in subprocesses) on the stand-in server through
the `command` target: what the run stores about where it ran, what the export binds and what verify dials, a
missing model refused before any trial, and the failed-flag memory kept in the study's storage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from storage import Repo
from tests.server.conftest import SPACE_YAML, standin_command
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search
from tuner.settings import target_settings
from tuner.targets.server.verify import verify_script

FAST = {
    "prompt_len": 8,
    "output_len": 10,
    "min_requests": 4,
    "rounds": 1,
    "warmup_requests": 1,
    "level_s": 0.3,
    "port_range": "35000-35999",
    "teardown_reserve_s": 3.0,
    "trial_timeout_s": 30,
}


def _search(tmp_path: Path, *, n_trials: int = 2, name: str = "s", **settings) -> tuple:
    space = tmp_path / "standin.yaml"
    space.write_text(SPACE_YAML)
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    opts = SearchOptions(
        budget_s=90,
        storage_url=url,
        study=name,
        space_path=str(space),
        target="command",
        settings={"command": standin_command(), "model": "standin", **FAST, **settings},
        n_trials=n_trials,
        confirm_top=0,
        refine_share=0.0,
        out_dir=str(tmp_path / "out"),
    )
    return run_search(opts), Repo(url)


def test_the_export_binds_the_host_setting_and_verify_dials_it_never_the_machine_name(tmp_path):
    result, repo = _search(tmp_path, host="127.0.0.2")
    assert result.best is not None, [t.reason for t in result.trials]
    run = repo.get_run("s")
    assert run.settings["run_host"] == socket.gethostname()
    assert run.settings["host"] == "127.0.0.2"
    assert target_settings(run.settings)["host"] == "127.0.0.2"
    script = Path(result.export_dir) / "launch.sh"
    text = script.read_text()
    assert "--host \\\n    127.0.0.2" in text and socket.gethostname() not in text.split("tuner-recorded")[1]
    res = verify_script(script, tolerance=0.9, timeout_s=60, port_range="36000-36999")
    assert res.outcome.value == "ok" and res.ok, "\n".join(res.lines())


def test_the_default_bind_address_is_the_loopback(tmp_path):
    result, repo = _search(tmp_path, n_trials=1)
    run = repo.get_run("s")
    assert "host" not in run.settings
    assert "--host \\\n    127.0.0.1" in (Path(result.export_dir) / "launch.sh").read_text()


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_command_needing_model_without_model_is_one_error_line_before_any_trial(tmp_path, dry_run):
    space = tmp_path / "standin.yaml"
    space.write_text(SPACE_YAML)
    db = tmp_path / "tuner.db"
    args = [
        sys.executable,
        "-m",
        "tuner.cli",
        "search",
        "--target",
        "command",
        "--space",
        str(space),
        "--budget",
        "60s",
        "--storage",
        f"sqlite:///{db}",
        "--out",
        str(tmp_path / "out"),
        "--set",
        "command=" + repr(standin_command()).replace("'", '"'),
    ] + (["--dry-run"] if dry_run else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "{model}" in lines[0] and "--model" in lines[0], (
        done.stderr
    )
    assert not db.exists() or "tuner_trials" not in db.read_bytes().decode(errors="replace")


def test_status_shows_each_trials_time_split_and_a_failures_exception_line(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    _search(tmp_path, n_trials=1, name="ok")
    _search(tmp_path, n_trials=1, name="oom", extra_args=["--oom-at-start"])
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    runner = CliRunner()
    ok = runner.invoke(app, ["status", "--storage", url, "--study", "ok"], env={"COLUMNS": "250"})
    assert ok.exit_code == 0, ok.output
    assert "start/warm/measure s" in ok.output
    row = next(ln for ln in ok.output.splitlines() if ln.startswith("│ 0 b"))
    startup, warm, measure = row.split("│")[6].strip().split("/")
    # the stand-in's warm-up is one short request (tens of ms): shown with two decimals below a tenth, never "0.0"
    assert float(startup) > 0 and float(warm) > 0 and float(measure) > 0, row
    oom = runner.invoke(app, ["status", "--storage", url, "--study", "oom"], env={"COLUMNS": "250"})
    assert "torch.OutOfMemoryError: CUDA out of memory" in oom.output, oom.output
    assert "Traceback" not in oom.output


OOM_SPACE = """
name: oom-switch
target: command
objective: {metric: tok_s, combine: geomean, levels: [1, 2]}
params:
  oom: {type: bool, default: false, flag: --oom-at-start}
  fast: {type: bool, default: false, flag: --enable-fast-path}
"""


def _search_space(tmp_path: Path, yaml: str, db: str, name: str, n_trials: int, **settings):
    space = tmp_path / "space.yaml"
    space.write_text(yaml)
    url = f"sqlite:///{tmp_path / db}"
    opts = SearchOptions(
        budget_s=120,
        storage_url=url,
        study=name,
        space_path=str(space),
        target="command",
        settings={"command": standin_command(), "model": "standin", **FAST, **settings},
        n_trials=n_trials,
        confirm_top=0,
        refine_share=0.0,
        seed=3,
        out_dir=str(tmp_path / "out"),
    )
    return run_search(opts), Repo(url)


def _ran_oom(result) -> list:
    return [t for t in result.trials if t.params.get("oom") and t.repeat_of is None]


def test_a_failed_start_is_kept_in_the_storage_and_refuses_a_launch_only_when_it_repeats_in_the_scope_asked(tmp_path):
    first, repo = _search_space(tmp_path, OOM_SPACE, "a.db", "first", 6)
    oom = _ran_oom(first)
    assert oom and oom[0].outcome == "oom", [(t.params, t.outcome, t.reason) for t in first.trials]
    with repo.session() as s:
        from sqlalchemy import select

        from storage import FailedFlagSet

        kept = s.scalars(select(FailedFlagSet)).all()
    assert [(k.trial_number, k.outcome) for k in kept] == [(t.number, "oom") for t in oom]  # each start that failed
    # the memory is the study's: the next study in the same storage runs the flag set (and sees the OOM itself)
    second, _ = _search_space(tmp_path, OOM_SPACE, "a.db", "second", 6)
    assert any(t.outcome == "oom" for t in _ran_oom(second)), [(t.params, t.outcome, t.reason) for t in second.trials]
    # asked for the storage's memory, a start that failed the same way twice (in the two studies) is refused
    third, _ = _search_space(tmp_path, OOM_SPACE, "a.db", "third", 6, failed_scope="storage")
    refused = _ran_oom(third)
    assert refused and all(t.outcome == "invalid_config" and "failed at start 2 times" in t.reason for t in refused), [
        (t.params, t.outcome, t.reason) for t in third.trials
    ]


def test_the_memory_never_refuses_the_baseline(tmp_path):
    first, _ = _search_space(tmp_path, OOM_SPACE, "a.db", "first", 1, extra_args=["--oom-at-start"])
    second, _ = _search_space(tmp_path, OOM_SPACE, "a.db", "second", 1, extra_args=["--oom-at-start"])
    for result in (first, second):
        base = next(t for t in result.trials if t.is_baseline)
        assert base.outcome == "oom" and "already failed" not in base.reason, base.reason


def test_a_request_error_is_not_remembered_and_the_next_study_measures_its_baseline(tmp_path):
    strict = ["--reject-field", "top_k"]
    first, repo = _search_space(tmp_path, OOM_SPACE, "a.db", "first", 1, extra_args=strict, extra_body={"top_k": 5})
    base = next(t for t in first.trials if t.is_baseline)
    assert base.outcome == "request_error" and "remove `top_k` from setting `extra_body`" in base.reason
    with repo.session() as s:
        from sqlalchemy import func, select

        from storage import FailedFlagSet

        assert s.scalar(select(func.count()).select_from(FailedFlagSet)) == 0
    fixed, _ = _search_space(tmp_path, OOM_SPACE, "a.db", "fixed", 1, extra_args=strict)
    assert next(t for t in fixed.trials if t.is_baseline).outcome == "ok"


def test_a_server_refusing_a_field_the_load_needs_stops_the_search_naming_the_field_and_the_fix(tmp_path):
    space = tmp_path / "standin.yaml"
    space.write_text(OOM_SPACE)
    command = json.dumps(standin_command() + ["--reject-field", "ignore_eos"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "search",
            "--target",
            "command",
            "--space",
            str(space),
            "--model",
            "m",
            "--budget",
            "60s",
            "--storage",
            f"sqlite:///{tmp_path / 't.db'}",
            "--out",
            str(tmp_path / "out"),
            "--set",
            f"command={command}",
            "--set",
            "ignore_eos=true",
            "--set",
            "level_s=0.2",
            "--set",
            "port_range=39000-39999",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "trial   0 request_error" in done.stdout, done.stdout
    assert "the server refuses request field `ignore_eos`" in done.stdout and "set `ignore_eos: false`" in done.stdout
    assert "\nerror: the search gave up" in "\n" + done.stderr, done.stderr


def test_status_time_split_shows_a_short_warm_up_as_more_than_zero():
    """A stand-in's warm-up takes tens of milliseconds: status shows it (0.04), not 0.0 (a CI run saw "0.2/0.0/...")."""
    from types import SimpleNamespace as M

    from tuner.cli import _time_split

    rows = [
        M(metric="startup_s", value=0.2),
        M(metric="warmup_s", value=0.04),
        M(metric="measure_s", value=1.0),
        M(metric="measure_s", value=2.25),
    ]
    assert _time_split(rows) == "0.2/0.04/3.2"
    assert _time_split([M(metric="tok_s", value=5.0)]) == ""
