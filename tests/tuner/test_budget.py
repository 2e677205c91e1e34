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
