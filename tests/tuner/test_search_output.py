"""What a search and ``tuner status`` print about its trials, from a real search on the fake target (CPU, seconds)."""

import os
import re
import subprocess
import sys

import pytest
from spaces import FAKE_SPACE

from tuner.search.sampling import MAX_TURNED_AWAY


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=240)


def _space(tmp_path, settings: str, values: str = "[0, 1, 2, 3, 4, 5, 6, 7]") -> str:
    text = (
        FAKE_SPACE.replace("settings: {sleep_s: 0.0}", f"settings: {{sleep_s: 0.0, {settings}}}")
        .replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")
        .replace("values: [0, 1, 2, 3, 4, 5, 6, 7]", f"values: {values}")
    )
    (tmp_path / "s.yaml").write_text(text)
    return "s.yaml"


def test_the_trial_line_and_status_show_the_error_rate_and_delivered_share_of_a_level_not_served_in_full(tmp_path):
    space = _space(tmp_path, "served: {'1': [0.03, 0.9]}", values="[0, 1]")
    r = tuner(
        "search",
        "--budget",
        "2m",
        "--space",
        space,
        "--n-trials",
        "3",
        "--confirm-top",
        "0",
        "--study",
        "s",
        "-o",
        "out",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("trial ")]
    short = [ln for ln in lines if "x=1" in ln and "[same configuration" not in ln]  # a repeat ran nothing
    assert short and all("not served in full: c=4: 3% errors, 90% delivered" in ln for ln in short), r.stdout
    assert not any("not served" in ln for ln in lines if "x=0" in ln), r.stdout  # served in full: nothing said
    r = tuner("status", "--study", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "not served in full" in r.stdout and "c=4: 3% errors, 90% delivered" in r.stdout, r.stdout


def test_a_search_whose_levels_were_all_served_in_full_shows_no_served_column(tmp_path):
    space = _space(tmp_path, "served: {'1': [0.0, 1.0]}", values="[0, 1]")
    r = tuner(
        "search",
        "--budget",
        "2m",
        "--space",
        space,
        "--n-trials",
        "2",
        "--confirm-top",
        "0",
        "--study",
        "s",
        "-o",
        "out",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "not served" not in r.stdout
    r = tuner("status", "--study", "s", cwd=tmp_path)
    assert r.returncode == 0 and "not served" not in r.stdout, r.stdout


@pytest.fixture(scope="module")
def noisy_search(tmp_path_factory):
    """A search whose winner's runs disagree 10x (x=7: 45, then 4.5...): nothing beats the baseline beyond that
    spread; 2 configurations, many repeats told an earlier result and confirmation re-runs."""
    tmp_path = tmp_path_factory.mktemp("noisy")
    space = _space(tmp_path, 'noise: {"7": 0.1}', values="[0, 7]")
    env = {**os.environ, "TUNER_FAKE_NOISE_DIR": str(tmp_path)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "search",
            "--budget",
            "45s",
            "--space",
            space,
            "--seed",
            "3",
            "--study",
            "s",
            "-o",
            "out",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


def test_nothing_beat_the_baseline_is_said_once_at_the_end_of_a_search(noisy_search):
    assert noisy_search.returncode == 0, noisy_search.stderr
    said = (noisy_search.stdout + noisy_search.stderr).count("nothing beat the baseline")
    assert said == 1, (noisy_search.stdout, noisy_search.stderr)
    assert "note: nothing beat the baseline" in noisy_search.stdout


def test_the_final_summary_counts_each_configuration_once_beside_its_repeats_and_re_runs(noisy_search):
    lines = noisy_search.stdout.splitlines()
    summary = next(ln for ln in lines if ln.startswith("search finished"))
    trials = [ln for ln in lines if re.match(r"trial +\d+ ", ln)]
    repeats = sum("[same configuration as trial" in ln for ln in trials)
    assert repeats > 0, noisy_search.stdout
    # a repeat is recorded once its proposals were turned away MAX_TURNED_AWAY times (a spent space); they are counted
    head = (
        f": 2 configurations: ok 2 ({len(trials)} trials: {repeats} repeats not run again, "
        f"{len(trials) - repeats - 2} re-runs of a measured configuration; "
    )
    assert head in summary, summary
    turned = re.fullmatch(r"(\d+) proposals turned away as repeats\)", summary.split(head, 1)[1])
    assert turned and int(turned[1]) >= MAX_TURNED_AWAY * repeats, summary


def test_the_per_trial_line_and_tuner_status_divide_by_the_same_baseline_figure_during_the_search(
    tmp_path, monkeypatch
):
    """The baseline's re-run halves (x=0: 14.1, then 7.1): from then on the per-trial lines divide by its median,
    and so must ``tuner status`` (the stored run), not by the first run's figure."""
    from search_spaces import Hardware
    from storage import Repo
    from tuner.search.context import Progress, SearchOptions
    from tuner.search.driver import run_search

    class Seen(Progress):
        def __init__(self):
            self.pairs = []

        def trial_finished(self, summary, ctx):
            self.pairs.append((summary.number, ctx.baseline_value, Repo(url).get_run("s").baseline_value))

    monkeypatch.setenv("TUNER_FAKE_NOISE_DIR", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    seen = Seen()
    run_search(
        SearchOptions(
            budget_s=45.0,
            storage_url=url,
            study="s",
            seed=3,
            hardware=Hardware(),
            space_path=str(tmp_path / _space(tmp_path, 'noise: {"0": 0.5}', values="[0, 7]")),
            out_dir=str(tmp_path / "out"),
            trial_timeout_s=10.0,
            confirm_top=2,
        ),
        seen,
    )
    assert len({round(line, 9) for _, line, _ in seen.pairs}) > 1  # the baseline's median moved
    for number, line, stored in seen.pairs:
        assert stored == pytest.approx(line), (number, seen.pairs)
