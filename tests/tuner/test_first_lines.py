"""What a user reads first, trustworthy from its first line: the README's main job on the CPU twin (its per-trial
ratios on one baseline figure whose spread is known, the install hint as written, warnings said once at the end),
``tuner status`` (the baseline's own figure and spread, repeats folded, only columns that hold data) and the test
script's output."""

import dataclasses
import datetime as dt
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from spaces import FAKE_SPACE

ROOT = Path(__file__).resolve().parents[2]
BASELINE_LINE = re.compile(
    r"baseline \(the space's defaults\): ([\d.]+) \S+ \(median of (\d+) runs, "
    r"([\d.]+)-([\d.]+), spread ([\d.]+)%\)"
)
RATIO = re.compile(r"^trial +(\d+) ok +([\d.]+) \(([\d.]+)x baseline\)")


def tuner(*args, cwd, timeout=400):
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _ratios_after_baseline(stdout: str) -> tuple[re.Match, list[tuple[int, float, float]]]:
    """The baseline line, and each per-trial line's (number, value, ratio); asserts no ratio comes before it."""
    lines = stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if BASELINE_LINE.search(ln))
    before = [ln for ln in lines[:at] if "x baseline" in ln]
    assert not before, before
    ratios = [(int(m[1]), float(m[2]), float(m[3])) for ln in lines[at:] if (m := RATIO.match(ln))]
    return BASELINE_LINE.search(lines[at]), ratios


def test_the_main_job_shows_no_ratio_before_its_baseline_was_timed_twice_and_says_their_spread(cpu_main_job):
    r = cpu_main_job  # `tuner search --budget 4m --n-trials 4 --seed 3 -o out` (conftest's MAIN_JOB)
    assert r.returncode == 0, r.stderr
    if not BASELINE_LINE.search(r.stdout):  # a run of the baseline failed (a loaded machine): no ratio at all
        assert re.search(r"^trial +[01] (?!ok)", r.stdout, re.M), r.stdout
        assert not [ln for ln in r.stdout.splitlines() if RATIO.match(ln)], r.stdout
        return
    base, ratios = _ratios_after_baseline(r.stdout)
    assert base[2] == "2", base[0]  # two timed runs (after an untimed warm-up run in the fresh worker)
    baseline_trials = [ln for ln in r.stdout.splitlines() if ln.startswith("trial ") and "[baseline]" in ln]
    assert [ln.split()[1] for ln in baseline_trials] == ["0", "1"], r.stdout
    assert "x baseline" not in baseline_trials[0], baseline_trials  # its spread is not known yet
    median = float(base[1])
    for number, value, ratio in ratios:  # every ratio divides by the one figure the baseline line names
        assert value / median == pytest.approx(ratio, abs=0.006), (number, value, ratio, median)


def test_the_flashmla_install_hint_is_printed_as_written(cpu_main_job):
    """Rich would take ``[flashmla]`` for markup and print `pip install tuner`."""
    assert "`pip install tuner[flashmla]`" in cpu_main_job.stdout, cpu_main_job.stdout
    assert "`pip install tuner`" not in cpu_main_job.stdout


def test_status_shows_the_baseline_s_median_and_spread_and_only_columns_that_hold_data(tmp_path, cpu_main_job):
    r = tuner("status", "--study", "dsv4-flash-tiny-workload", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(
        r"baseline \(the space's defaults\): [\d.]+ tok/s, the median of 2 runs "
        r"\([\d.]+-[\d.]+, spread [\d.]+%\)",
        r.stdout,
    ), r.stdout
    rows = {m[1]: m[2] for m in re.finditer(r"│ (\d+)(?: b)? +│ ok +│ [\d.]+ +│ (\S+) ", r.stdout)}
    assert rows["0"] == rows["1"] == "baseline", r.stdout  # not "0.43": the baseline is the reference itself
    assert "start/warm/measure" not in r.stdout  # no server trials: no start-up or warm-up to show


def test_tuner_status_folds_repeats_into_their_configuration(tmp_path):
    """A search on two values asks the same configurations again and again: ``tuner status`` lists each measured
    configuration once, with the trials that asked it again, and ``--repeats`` lists those."""
    (tmp_path / "s.yaml").write_text(
        FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]").replace(
            "values: [0, 1, 2, 3, 4, 5, 6, 7]", "values: [0, 7]"
        )
    )
    r = tuner(
        "search",
        "--budget",
        "2m",
        "--space",
        "s.yaml",
        "--n-trials",
        "12",
        "--confirm-top",
        "0",
        "--study",
        "s",
        "--seed",
        "3",
        "-o",
        "out",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    repeats = [ln for ln in r.stdout.splitlines() if "[same configuration as trial" in ln]
    assert repeats, r.stdout
    r = tuner("status", "--study", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "same configuration as trial" not in r.stdout, r.stdout
    assert "asked again" in r.stdout and f"{len(repeats)} repeats" in r.stdout, r.stdout
    r = tuner("status", "--study", "s", "--repeats", cwd=tmp_path)
    assert r.stdout.count("same configuration as trial") == len(repeats), r.stdout


def test_a_warning_logged_during_a_search_is_said_once_at_its_end_as_a_sentence(tmp_path):
    """Two worker threads on SQLite log a warning as the search starts: it is not a timestamped record among the
    trial lines but one ``warning:`` sentence after the result."""
    (tmp_path / "s.yaml").write_text(FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"))
    r = tuner(
        "search",
        "--budget",
        "2m",
        "--space",
        "s.yaml",
        "--n-trials",
        "3",
        "--confirm-top",
        "0",
        "--workers",
        "2",
        "--study",
        "s",
        "-o",
        "out",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert not re.search(r"^\d{4}-\d\d-\d\d [\d:,]+ WARNING", r.stderr, re.M), r.stderr
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(said) == 1 and "2 worker threads share SQLite storage" in said[0], r.stderr
    assert said[0].endswith("."), said


def test_budget_used_is_said_only_when_the_budget_was_used():
    from tuner.cli import stop_reason

    result = SimpleNamespace(stop_reason="budget used", budget_s=120.0)
    assert stop_reason(SimpleNamespace(**vars(result), elapsed_s=118.5)) == "budget used"
    early = stop_reason(SimpleNamespace(**vars(result), elapsed_s=103.0))
    assert "budget used" not in early and early.startswith("ended 17s before its 2m00s budget"), early
    assert stop_reason(SimpleNamespace(stop_reason="4 trials done", budget_s=120.0, elapsed_s=30.0)) == "4 trials done"


def test_the_test_script_s_installs_skip_the_resolver_complaint_about_sglang_s_missing_gpu_stack():
    """SGLang is installed ``--no-deps`` (its parser only): any install pip runs beside it would print the
    requirements it lacks as a 59-line resolver ERROR block on every green run. Every install in the script skips
    that check, and ``pip check`` reports what is not SGLang's."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    installs = [ln for ln in script.splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]
    assert installs and all("--no-warn-conflicts" in ln for ln in installs), installs
    assert re.search(r"^\$PIP ", script, re.M) and "pip check" in script and "grep -v -e '^sglang '" in script


@pytest.mark.slow
@pytest.mark.timeout(560)
def test_the_cpu_main_job_s_ratios_never_move_by_more_than_the_baseline_s_spread_once_shown(tmp_path):
    """The README's main job on the tiny twin (``tuner search``, re-runs at the end included; 3 minutes, not 2, so
    that a loaded 2-core machine still times the baseline twice): once the first ratio is shown, every "x baseline"
    (each per-trial line and the final line) divides by a figure within the baseline's measured spread of the one
    the baseline line named; and no logger record interrupts the lines."""
    r = tuner("search", "--budget", "3m", "--seed", "3", "-o", "out", cwd=tmp_path, timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not re.search(r"^\d{4}-\d\d-\d\d [\d:,]+ WARNING", r.stderr, re.M), r.stderr
    if not BASELINE_LINE.search(r.stdout):  # a run of the baseline failed on a loaded machine: the ratios wait
        assert re.search(r"^trial +[01] (?!ok)", r.stdout, re.M), r.stdout
        assert not [ln for ln in r.stdout.splitlines() if RATIO.match(ln)], r.stdout
        return
    base, ratios = _ratios_after_baseline(r.stdout)
    first, spread = float(base[1]), float(base[5]) / 100
    final = re.search(r"x the baseline's median \(([\d.]+), (\d+) run", r.stdout)
    assert final, r.stdout
    figures = [(value / ratio, 0.005 / ratio) for _, value, ratio in ratios if ratio >= 0.1]
    figures.append((float(final[1]), 0.0))
    for figure, rounding in figures:  # a ratio printed to 2 decimals: its rounding beside the spread
        assert abs(figure / first - 1) <= spread + rounding + 1e-9, (figure, first, spread, r.stdout)


def test_parallel_workers_start_no_trial_with_less_time_left_than_one_trial_needs(tmp_path):
    """The target says a trial needs 20 s to give a figure: two worker threads stop starting trials once less than
    that is left of a 32-s budget, as the one-worker loop does (they went on until 1 s was left, and each such trial
    was cut off). Read from the trials' stored start times, which a loaded machine only pulls closer together."""
    space = FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]").replace(
        "settings: {sleep_s: 0.0}", "settings: {sleep_s: 1.0, min_trial_s: 20}"
    )
    (tmp_path / "s.yaml").write_text(space)
    r = tuner(
        "search",
        *("--budget", "32s", "--space", "s.yaml", "--confirm-top", "0", "--refine-share", "0"),
        *("--workers", "2", "--converge-after", "0", "--study", "s", "-o", "out"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    starts = [
        dt.datetime.fromisoformat(s)
        for (s,) in sqlite3.connect(tmp_path / "tuner.db").execute("select started_at from tuner_trials")
    ]
    # the first trial starts after the budget's clock did, so the last start lies at most 32 - 20 s (and the lag of
    # one ask) after it; before the fix the workers started trials until about 31 s
    span = (max(starts) - min(starts)).total_seconds()
    assert len(starts) >= 2 and span <= 16, (span, len(starts), r.stdout[-2000:])


@dataclasses.dataclass(frozen=True)
class _Job:
    """What the warm-up reads and replaces of a ``TrialJob``: its deadline."""

    deadline: float


class _Said:
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("slow", [True, False])
def test_a_slow_warm_up_run_of_the_baseline_is_said_in_one_line(monkeypatch, slow):
    """The untimed warm-up run took 191 s of an H200 main job's 7 minutes (kernels built on a fresh machine) and the
    search printed nothing until the baseline's first timed run."""
    from tuner.measurement import Measurement, Outcome
    from tuner.search import trial as trial_mod

    class Run:
        def wait(self):
            return Measurement(outcome=Outcome.OK, value=1.0)

    worker = SimpleNamespace(start=lambda job: Run())
    deadline = SimpleNamespace(trials_end=1e12)
    ctx = SimpleNamespace(current=None, stop=SimpleNamespace(is_set=lambda: False), deadline=deadline)
    job = _Job(deadline=0.0)
    monkeypatch.setattr(trial_mod, "SLOW_WARM_UP_S", 0.0 if slow else 1e9)
    said = _Said()
    out = trial_mod._warm_up(ctx, worker, job, 30.0, said)
    assert out.deadline > 0 and ctx.current is None
    if slow:
        assert len(said.lines) == 1 and said.lines[0].startswith("the baseline's warm-up run (not timed) took ")
        assert "kernels' first builds" in said.lines[0]
    else:
        assert said.lines == []
