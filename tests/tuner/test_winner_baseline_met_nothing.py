"""A baseline that met nothing (median 0: a goodput baseline that missed the SLO at every load): the winner is
still the best configuration, and no "x baseline" ratio (it was inf) is printed or written."""

import io

from rich.console import Console

from tuner.search.results import SearchResult, TrialSummary
from tuner.search.winner import Measured, decide, spread_of
from tuner.targets import PreflightReport

BASE_MISSED_TWICE = Measured("b", {"x": 0}, (0, 5), (0.0, 0.0), is_baseline=True)
REPEATED = Measured("a", {"x": 1}, (1, 6), (30.0, 32.0))
ONCE = Measured("c", {"x": 2}, (2,), (50.0,))


def test_runs_that_all_met_nothing_have_no_spread():
    assert spread_of([0.0, 0.0]) == 0.0


def test_a_repeated_configuration_beats_a_baseline_that_met_nothing_in_both_runs():
    d = decide([BASE_MISSED_TWICE, REPEATED], defaults={"x": 0})
    assert d.best.params == {"x": 1} and d.note == ""  # was: the defaults kept, "infx it, within inf%"


def test_a_configuration_measured_once_beats_a_baseline_that_met_nothing_and_the_note_gives_no_ratio():
    d = decide([BASE_MISSED_TWICE, ONCE], defaults={"x": 0})
    assert d.best.params == {"x": 2}
    assert "the baseline met nothing" in d.note and "inf" not in d.note


def test_a_baseline_that_met_nothing_once_and_something_once_does_not_make_every_lead_noise():
    d = decide(
        [Measured("b", {"x": 0}, (0, 5, 7), (0.0, 3.0, 0.0), is_baseline=True), REPEATED, ONCE], defaults={"x": 0}
    )
    assert d.best.params == {"x": 2}


def test_the_final_line_says_the_baseline_met_nothing_instead_of_a_ratio(monkeypatch):
    from tuner import cli

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=200))
    best = TrialSummary(1, {"x": 1}, "ok", 30.0)
    result = SearchResult(
        "s",
        "sqlite://",
        "finished",
        [TrialSummary(0, {"x": 0}, "ok", 0.0, is_baseline=True), best],
        None,
        best,
        {"x": 1},
        30.0,
        0.0,
        None,
        PreflightReport("fake"),
        1.0,
        baseline_runs=[0],
    )
    cli._print_result(result)
    text = out.getvalue()
    assert "best: trial 1, 30.00 (one run); the baseline met nothing (median 0 over 1 run(s)): no ratio" in text
    assert "inf" not in text
