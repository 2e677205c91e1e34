import time

import pytest

from tuner.budget import Deadline, format_seconds, parse_budget
from tuner.errors import BudgetError


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h30m15s", 5415),
        ("45", 45),
        (" 2H ", 7200),
        ("1.5m", 90),
    ],
)
def test_parse_budget_accepts(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["0", "0s", "-5m", "abc", "", "10x", "1m1h", "1h1h", "m", "5 minutes"])
def test_parse_budget_rejects_with_one_line_fix(text):
    with pytest.raises(BudgetError) as err:
        parse_budget(text)
    msg = str(err.value)
    assert "\n" not in msg and "--budget" in msg and "90s" in msg


def test_deadline_keeps_back_time_for_export():
    d = Deadline.start_now(100)
    assert d.trials_end < d.end
    assert 2.0 <= d.end - d.trials_end <= 60.0
    assert abs(d.elapsed()) < 1.0
    assert Deadline.start_now(10000).reserve_s == 60.0
    assert d.remaining_for_trials() <= 100 and d.remaining_for_trials() > 90
    assert time.time() < d.trials_end


def test_format_seconds():
    assert format_seconds(5) == "5s"
    assert format_seconds(125) == "2m05s"
    assert format_seconds(3725) == "1h02m05s"


def test_a_budget_counted_from_the_command_s_start_keeps_that_start_and_never_one_in_the_future():
    t = time.time()
    assert Deadline.start_now(60.0, t - 25.0).start == t - 25.0
    assert Deadline.start_now(60.0, t + 100.0).start <= time.time()  # a clock read ahead of now: now
    assert abs(Deadline.start_now(60.0).start - t) < 5.0


def test_the_process_start_is_when_the_process_began_not_when_tuner_was_imported():
    """`tuner search --budget 7m` ran 22-33 s over on an H200: the budget's clock began after the imports, CUDA's
    start and SGLang's parser. The CLI now counts from its process's start."""
    import subprocess
    import sys

    code = "import time; time.sleep(1.5); from tuner.budget import process_start; print(time.time() - process_start())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 1.4 <= float(done.stdout) < 30.0, done.stdout


def test_a_search_whose_budget_started_earlier_ends_that_much_earlier(tmp_path, sqlite_url):
    from spaces import FAKE_SPACE

    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    p = tmp_path / "space.yaml"
    p.write_text(FAKE_SPACE)
    began = time.time() - 20.0  # the command started 20 s ago (its imports, a slow start)
    res = run_search(
        SearchOptions(
            budget_s=30.0,
            started_at=began,
            storage_url=sqlite_url,
            study="s",
            space_path=str(p),
            out_dir=str(tmp_path / "out"),
            seed=1,
            converge_after=0,
        )
    )
    assert res.elapsed_s >= 20.0
    assert time.time() - began <= 30.0 + 8.0, time.time() - began  # within the budget, give or take the export
