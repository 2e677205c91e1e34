"""What a search and ``tuner status`` print about its trials, from a real search on the fake target (CPU, seconds)."""

import subprocess
import sys

from spaces import FAKE_SPACE


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240)


def _space(tmp_path, settings: str, values: str = "[0, 1, 2, 3, 4, 5, 6, 7]") -> str:
    text = (FAKE_SPACE.replace("settings: {sleep_s: 0.0}", f"settings: {{sleep_s: 0.0, {settings}}}")
            .replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")
            .replace("values: [0, 1, 2, 3, 4, 5, 6, 7]", f"values: {values}"))
    (tmp_path / "s.yaml").write_text(text)
    return "s.yaml"


def test_the_trial_line_and_status_show_the_error_rate_and_delivered_share_of_a_level_not_served_in_full(tmp_path):
    space = _space(tmp_path, "served: {'1': [0.03, 0.9]}", values="[0, 1]")
    r = tuner("search", "--budget", "2m", "--space", space, "--n-trials", "3", "--confirm-top", "0", "--study", "s",
              "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("trial ")]
    short = [ln for ln in lines if "x=1" in ln]
    assert short and all("not served in full: c=4: 3% errors, 90% delivered" in ln for ln in short), r.stdout
    assert not any("not served" in ln for ln in lines if "x=0" in ln), r.stdout  # served in full: nothing said
    r = tuner("status", "--study", "s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "not served in full" in r.stdout and "c=4: 3% errors, 90% delivered" in r.stdout, r.stdout


def test_a_search_whose_levels_were_all_served_in_full_shows_no_served_column(tmp_path):
    space = _space(tmp_path, "served: {'1': [0.0, 1.0]}", values="[0, 1]")
    r = tuner("search", "--budget", "2m", "--space", space, "--n-trials", "2", "--confirm-top", "0", "--study", "s",
              "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "not served" not in r.stdout
    r = tuner("status", "--study", "s", cwd=tmp_path)
    assert r.returncode == 0 and "not served" not in r.stdout, r.stdout
