"""Issue 50's smaller items: a server killed from outside leaves its configuration eligible again; preflight refuses
a missing model path and a value a boolean or listed-value flag's help refuses; verify says how close a goodput
export stands to its limits and names no outcome on a NOT verified line; a goodput trial needs time for one
measurement; a kill during the warm-up is said so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import Repo
from tests.server.conftest import standin_command
from tests.server.test_launch import DEFAULTS, spy  # noqa: F401 - the fixture
from tuner.measurement import Outcome

KILLED_SPACE = """
name: killed
target: command
objective: {metric: tok_s, levels: [1]}
params:
  kill: {type: categorical, values: [1.0], default: 1.0, flag: --sigkill-self-after}
"""


def test_a_server_killed_from_outside_is_eligible_again_and_never_remembered(tmp_path):
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    space = tmp_path / "k.yaml"  # the baseline runs whole; the other value's server is SIGKILLed 1 s after ready
    space.write_text(KILLED_SPACE.replace("values: [1.0], default: 1.0", "values: [600.0, 1.0], default: 600.0"))
    url = f"sqlite:///{tmp_path / 'k.db'}"
    settings = {
        "command": standin_command(),
        "model": "standin",
        "port_range": "37000-37999",
        "prompt_len": 4,
        "output_len": 20,
        "warmup_requests": 1,
        "teardown_reserve_s": 3.0,
        "trial_timeout_s": 30,
        "fatal_grace_s": 0.5,
        "level_s": 3.0,
        "extra_args": ["--tokens-per-second", "400"],
    }
    opts = SearchOptions(
        budget_s=150,
        storage_url=url,
        study="k",
        space_path=str(space),
        target="command",
        settings=settings,
        n_trials=5,
        confirm_top=0,
        refine_share=0.0,
        seed=1,
        out_dir=str(tmp_path / "out"),
    )
    result = run_search(opts)
    killed = [t for t in result.trials if t.params["kill"] == 1.0]
    assert len(killed) >= 2, [(t.params, t.outcome) for t in result.trials]  # the seed's sampler asks it twice
    # killed by a SIGKILL the tuner did not send: measured again each time, never "not run again"
    assert [t.repeat_of for t in killed] == [None] * len(killed), [t.reason for t in killed]
    assert all(t.outcome == "crash" and "from outside the tuner" in t.reason for t in killed), [
        t.reason for t in killed
    ]
    repo = Repo(url)
    run = repo.get_run("k")
    rows = [t for t in repo.list_trials(run.id, with_measurements=True) if t.params["kill"] == 1.0]
    assert all(any(m.metric == "outside_signal" and m.value == 9.0 for m in t.measurements) for t in rows)
    import sqlite3

    kept = sqlite3.connect(tmp_path / "k.db").execute("select count(*) from tuner_failed_flags").fetchone()[0]
    assert kept == 0  # nothing entered the failed-flag memory


def test_a_kill_during_the_warm_up_is_said_so(make_target, spy):  # noqa: F811
    # 1 s after ready the server is killed, while the warm-up is still waiting for slow first requests to settle:
    # 400 first requests of 500 ms each cannot settle within that second at any warm-up concurrency
    target = make_target(
        ["--sigkill-self-after", "1.0", "--slow-first", "400", "--slow-first-ms", "500"],
        levels=[1],
        warmup_s=30,
        warmup_max_requests=800,
    )
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.CRASH, m.reason
    # at its first request when the kill came before the tuner saw the server ready, at a later one otherwise
    assert m.reason.startswith("during the warm-up, at its ") and "killed by signal 9" in m.reason, m.reason
    assert m.outside_signal


def test_a_warm_up_request_reset_by_a_dying_server_is_said_to_fail_in_the_warm_up_not_at_the_first_level(
    make_target,
    spy,  # noqa: F811
):
    # the third request's connection is reset and the process exits 0.3 s later: the tuner sees the failed request
    # before the exit, and still says where the server died (before, the levels ran and blamed c=1)
    target = make_target(
        ["--die-on-request", "3", "--die-delay-s", "0.3"], levels=[1], warmup_s=30, warmup_max_requests=50
    )
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.CRASH, m.reason
    assert m.reason.startswith("during the warm-up, at its request 3: server killed by signal 9"), m.reason
    assert m.outside_signal


def _dry_run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    space = tmp_path / "s.yaml"
    space.write_text(KILLED_SPACE)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "search",
            "--budget",
            "60s",
            "--space",
            str(space),
            "--target",
            "command",
            "--storage",
            f"sqlite:///{tmp_path / 'd.db'}",
            "--set",
            f"command={standin_command()}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_model_path_fails_the_dry_run_and_the_search_with_one_error_line(tmp_path):
    missing = str(tmp_path / "models" / "q4.gguf")
    dry = _dry_run(tmp_path, "--model", missing, "--dry-run")
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert f"ERROR: setting `model`: {missing!r} does not exist on this machine" in dry.stdout
    run = _dry_run(tmp_path, "--model", missing)
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and "setting `model`" in errors[0], run.stderr


def test_the_dry_run_says_how_tokens_will_be_counted(tmp_path):
    model = tmp_path / "q4.gguf"
    model.write_bytes(b"GGUF")
    dry = _dry_run(tmp_path, "--model", str(model), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    line = next(ln for ln in dry.stdout.splitlines() if "token count:" in ln)
    assert "the server's usage (asked for)" in line and "one token per streamed chunk" in line


def test_a_value_a_boolean_or_listed_value_flag_refuses_is_caught_from_its_help():
    from tuner.targets.server.flags import parse_help_text

    flags = parse_help_text(
        "options:\n"
        "  -fa, --flash-attn FA     set Flash Attention use ('on', 'off', or 'auto', default: "
        "'auto')\n"
        "  --kv-unified BOOL        one KV buffer for all sequences\n"
    )
    assert flags.check_value("--flash-attn", "maybe") and flags.check_value("--flash-attn", "auto") is None
    assert "'maybe' is not one of the choices of --kv-unified" in flags.check_value("--kv-unified", "maybe")
    assert flags.check_value("--kv-unified", True) is None


def test_verify_lines_name_no_outcome_when_the_run_measured_and_say_how_close_to_the_limit():
    from tuner.figures.verification import VerifyResult
    from tuner.targets.server.goodput import closeness

    missed = VerifyResult(False, Outcome.OK, "goodput_req_s", 0.0, 2.0, reason="misses the SLO")
    assert missed.lines()[0].startswith("NOT verified: ") and "outcome" not in missed.lines()[0]
    crashed = VerifyResult(False, Outcome.CRASH, "goodput_req_s", None, 2.0)
    assert "outcome crash" in crashed.lines()[0]
    assert "outcome ok" in VerifyResult(True, Outcome.OK, "goodput_req_s", 2.0, 2.0).lines()[0]
    assert (
        closeness({"ttft_ms_p95": 153.6}, [("ttft_ms_p95", 200.0)], {"ttft_ms_p95": 88.2})
        == "ttft_ms_p95 153.6 = 77% of 200 (the search: 88.2)"
    )


def test_a_goodput_trial_needs_one_measurement_and_its_teardown_before_it_starts(make_target):
    yaml = KILLED_SPACE.replace("{metric: tok_s, levels: [1]}", "{metric: goodput_req_s, slo: {ttft_ms_p95: 200}}")
    target = make_target(yaml=yaml, goodput_window_s=5.0, teardown_reserve_s=5.0)
    assert target.min_trial_s() == pytest.approx(max(5.0, 20 / 1.0) + 5.0)
    assert make_target().min_trial_s() == 0.0
