"""The CLI as a user runs it: real processes, real files, exit codes and one-line errors."""

import json
import subprocess
import sys

import pytest


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=240)


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("budget", ["0", "-1m", "soon", "1x"])
def test_bad_budget(tmp_path, budget):
    _one_line_error(tuner("search", "--budget", budget, cwd=tmp_path), "--budget", budget)
    assert not (tmp_path / "tuner.db").exists()


def test_missing_space_file(tmp_path):
    _one_line_error(tuner("search", "--budget", "1m", "--space", "nope.yaml", cwd=tmp_path), "nope.yaml", "not found")


def test_broken_yaml_and_unknown_type(tmp_path):
    (tmp_path / "b.yaml").write_text("name: x\nparams: {a: [1,\n")
    _one_line_error(tuner("search", "--budget", "1m", "--space", "b.yaml", cwd=tmp_path), "b.yaml", "broken YAML")
    (tmp_path / "t.yaml").write_text("name: x\nparams:\n  a: {type: tensor, default: 1}\n")
    _one_line_error(tuner("search", "--budget", "1m", "--space", "t.yaml", cwd=tmp_path), "`a`", "unknown type")
    (tmp_path / "u.yaml").write_text("name: x\nparams:\n  warp_size: {type: categorical, values: [1], default: 1}\n")
    _one_line_error(tuner("search", "--budget", "1m", "--space", "u.yaml", cwd=tmp_path), "warp_size")
    assert not (tmp_path / "tuner.db").exists()


def test_unwritable_output_folder(tmp_path):
    (tmp_path / "f").write_text("")
    _one_line_error(tuner("search", "--budget", "1m", "-o", "f/out", cwd=tmp_path), "f/out", "not writable")
    assert not (tmp_path / "tuner.db").exists()


def test_unreachable_storage(tmp_path):
    r = tuner("search", "--budget", "1m", "--storage", "postgresql://u@127.0.0.1:1/db", cwd=tmp_path)
    _one_line_error(r, "cannot be reached", "'postgresql://u@127.0.0.1:1/db'")  # the URL as typed
    assert "psycopg" not in r.stderr, r.stderr
    _one_line_error(tuner("status", "--storage", "nonsense://", cwd=tmp_path), "nonsense")


def test_unknown_target(tmp_path):
    _one_line_error(tuner("search", "--budget", "1m", "--target", "teleport", cwd=tmp_path), "teleport")


def test_read_commands_on_empty_storage(tmp_path):
    _one_line_error(tuner("best", cwd=tmp_path), "tuner search")
    _one_line_error(tuner("export", cwd=tmp_path), "tuner search")


@pytest.mark.slow  # the README's main job whole, then every reader of it (110 s on 2 cores): CI's slow pass runs it
def test_search_status_best_export_end_to_end(tmp_path, cpu_main_job):
    r = cpu_main_job  # `tuner search --budget 4m --n-trials 4 --seed 3 -o out` in tmp_path (conftest's MAIN_JOB)
    assert r.returncode == 0, r.stderr
    assert "best: trial" in r.stdout and "launch script: out/dsv4-flash-tiny-workload/launch.sh" in r.stdout
    script = tmp_path / "out" / "dsv4-flash-tiny-workload" / "launch.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # a named study is refused a second search without --resume; an unnamed search takes the next free name
    r = tuner("search", "--budget", "90s", "--n-trials", "1", "--study", "dsv4-flash-tiny-workload", cwd=tmp_path)
    _one_line_error(r, "--resume")
    # (the baseline alone, timed with one step per level: this search is here for its name)
    r = tuner(
        "search",
        "--budget",
        "90s",
        "--n-trials",
        "1",
        "--confirm-top",
        "0",
        "--set",
        "warmup=0",
        "--set",
        "repeats=1",
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "study dsv4-flash-tiny-workload-2" in r.stdout, r.stderr
    r = tuner("status", cwd=tmp_path)
    assert r.returncode == 0 and "dsv4-flash-tiny-workload" in r.stdout and "workload-2" in r.stdout
    r = tuner("status", "--study", "dsv4-flash-tiny-workload", cwd=tmp_path)
    assert r.returncode == 0 and "context_length" in r.stdout
    r = tuner("best", "--json", "--study", "dsv4-flash-tiny-workload", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["params"]["context_length"] in (4096, 16384, 32768, 65536, 131072)
    assert doc["metrics"]["tok_s@c=64"] > 0
    r = tuner("export", "-o", "again", "--study", "dsv4-flash-tiny-workload", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again" / "dsv4-flash-tiny-workload" / "launch.sh").exists()
    # the exported script re-measures itself: within a loose tolerance (CI's CPU is noisy) it holds, exit 0 ...
    r = tuner("verify", str(script), "--tolerance", "0.95", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "recorded" in r.stdout and "c=64:" in r.stdout
    # ... and against figures 100x what this machine reached, it says they do not hold, exit 1
    from tuner.export import RECORD_MARK, read_recorded

    rec = read_recorded(script)
    rec["by_level"] = {k: 100 * v for k, v in rec["by_level"].items()}
    rec["value"] = 100 * rec["value"]
    inflated = tmp_path / "inflated.sh"
    inflated.write_text(
        "\n".join(
            RECORD_MARK + json.dumps(rec) if ln.startswith(RECORD_MARK) else ln
            for ln in script.read_text().splitlines()
        )
        + "\n"
    )
    r = tuner("verify", str(inflated), "--tolerance", "0.95", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    (tmp_path / "plain.sh").write_text("#!/bin/bash\ntrue\n")
    _one_line_error(tuner("verify", "plain.sh", cwd=tmp_path), "tuner-recorded")


def test_dry_run_prints_preflight(tmp_path):
    r = tuner("search", "--budget", "1m", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "preflight for target `workload`" in r.stdout
    assert "cuda_graph_buckets" in r.stdout and "inactive" in r.stdout
    assert not (tmp_path / "tuner.db").exists()


# 25 s on 2 cores: the slow pass (CI runs it) keeps the README's test command within 12 minutes
@pytest.mark.slow
def test_ctrl_c_ends_cleanly_and_still_exports(tmp_path):
    import signal
    import time

    from storage import Repo

    # one timed step per level: the trials only have to finish (the interrupt, not the timing, is under test)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner",
            "search",
            "--budget",
            "5m",
            "-o",
            "out",
            "--set",
            "warmup=0",
            "--set",
            "repeats=1",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    t0 = time.time()
    while time.time() - t0 < 120:
        time.sleep(1)
        if (tmp_path / "tuner.db").exists():
            try:
                repo = Repo(url)
                run = repo.get_run("dsv4-flash-tiny-workload")
                if run and repo.count_trials(run.id, state="complete") >= 2:
                    break
            except Exception:
                pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "interrupted" in out
    run = Repo(url).get_run("dsv4-flash-tiny-workload")
    assert run.state == "interrupted"
    assert (tmp_path / "out" / "dsv4-flash-tiny-workload" / "launch.sh").exists()
    assert time.time() - t0 < 200


def test_a_search_in_which_no_trial_succeeded_exits_non_zero_with_the_outcome_counts(tmp_path):
    from spaces import FAKE_SPACE

    (tmp_path / "s.yaml").write_text(FAKE_SPACE.replace("default: ok", "default: raise"))
    r = tuner("search", "--budget", "2m", "--space", "s.yaml", "-o", "out", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    last = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert last == ["error: the search gave up (crash 1); `tuner status` lists each trial's reason"], r.stderr
    assert "the baseline (trial 0) failed, crash: ZeroDivisionError" in r.stdout


def test_a_misspelt_setting_is_one_error_naming_the_closest_valid_key(tmp_path):
    _one_line_error(
        tuner("search", "--budget", "1m", "--set", "live_contex=1024", cwd=tmp_path),
        "setting `live_contex`",
        "did you mean `live_context`?",
    )
    _one_line_error(
        tuner("search", "--budget", "1m", "--set", "live_context=lots", cwd=tmp_path),
        "setting `live_context`",
        "'lots'",
    )
    assert not (tmp_path / "tuner.db").exists()
