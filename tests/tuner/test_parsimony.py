"""prefer_parsimonious: within the noise of the best, fewer changes from the defaults win."""

import pytest

from tuner.search.winner import Candidate, changes_from, prefer_parsimonious

D = {"a": 1, "b": 1, "c": 1}


def test_within_noise_the_configuration_with_fewer_changes_is_preferred():
    best = Candidate(7, {"a": 2, "b": 2, "c": 2}, 100.0)
    simple = Candidate(3, {"a": 2, "b": 1, "c": 1}, 98.5)
    choice = prefer_parsimonious([simple, best, Candidate(5, {"a": 2, "b": 2, "c": 1}, 99.0)], D, 0.02)
    assert choice.chosen is simple and choice.best is best and choice.switched
    assert (choice.changes, choice.best_changes) == (1, 3)
    assert "preferred trial 3 (1 change(s)" in choice.reason() and "best trial 7 (3 changes)" in choice.reason()


def test_outside_noise_the_best_stays_even_with_more_changes():
    best = Candidate(7, {"a": 2, "b": 2, "c": 2}, 100.0)
    choice = prefer_parsimonious([best, Candidate(3, {"a": 2, "b": 1, "c": 1}, 95.0)], D, 0.02)
    assert choice.chosen is best and not choice.switched and "no other configuration" in choice.reason()


def test_ties_in_changes_go_to_the_better_value_and_minimize_flips_the_window():
    a, b = Candidate(1, {"a": 2}, 10.0), Candidate(2, {"b": 2}, 10.1)
    assert prefer_parsimonious([a, b], D, 0.05).chosen is b
    fast, simple = Candidate(1, {"a": 2, "b": 2}, 1.00), Candidate(2, {"a": 2}, 1.02)  # latency: lower is better
    assert prefer_parsimonious([fast, simple], D, 0.05, maximize=False).chosen is simple
    assert prefer_parsimonious([fast, simple], D, 0.01, maximize=False).chosen is fast


def test_an_activated_child_counts_as_a_change():
    assert changes_from({"a": 1, "split": 4}, D) == 1


@pytest.mark.parametrize("noise", [-0.1, 1.0, float("nan"), "3%"])
def test_a_bad_noise_is_refused_naming_it(noise):
    with pytest.raises(ValueError, match="`noise` must be a fraction"):
        prefer_parsimonious([Candidate(1, {}, 1.0)], D, noise)


def test_no_candidate_is_refused():
    with pytest.raises(ValueError, match="at least one candidate"):
        prefer_parsimonious([], D, 0.01)
