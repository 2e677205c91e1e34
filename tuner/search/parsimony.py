"""Parsimony: among configurations the measurements cannot tell apart from the best, prefer the simplest.

A configuration within the measured noise of the best is as good as the best as far as the data can say; the one
with the fewest changes from the defaults is then the one to deploy (fewer flags to carry, fewer ways to break).
:func:`prefer_parsimonious` is a pure function: candidates in, the choice and its reason out.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NOISE_CAP = 0.10
"""A study's noise estimate is capped here: a noisier measurement must not make a much slower configuration win."""


@dataclass(frozen=True)
class Candidate:
    """One measured configuration: an id (e.g. the trial number), its parameters and its objective value."""

    key: Any
    params: Mapping[str, Any]
    value: float


@dataclass(frozen=True)
class ParsimonyChoice:
    chosen: Candidate
    best: Candidate
    changes: int
    """Parameters of ``chosen`` that differ from the defaults."""
    best_changes: int
    within: tuple[Candidate, ...] = field(default_factory=tuple)
    """Every candidate within the noise of the best (the best included)."""
    noise: float = 0.0

    @property
    def switched(self) -> bool:
        return self.chosen.key != self.best.key

    def reason(self) -> str:
        """One line saying what was preferred and why (or that the best is also the simplest)."""
        if not self.switched:
            others = len(self.within) - 1
            if not others:
                return (f"no other configuration is within the measured noise ({self.noise:.1%}) of the best "
                        f"({_name(self.best)}, {self.best_changes} change(s) from the defaults)")
            return (f"the best ({_name(self.best)}) has {self.best_changes} change(s) from the defaults; none of the "
                    f"{others} other configuration(s) within the measured noise ({self.noise:.1%}) has fewer")
        gap = abs(self.chosen.value / self.best.value - 1) if self.best.value else 0.0
        return (f"preferred {_name(self.chosen)} ({self.changes} change(s) from the defaults) over the best "
                f"{_name(self.best)} ({self.best_changes} changes): {gap:.1%} apart, within the measured noise "
                f"{self.noise:.1%}")


def _name(c: Candidate) -> str:
    return f"trial {c.key}" if isinstance(c.key, int) else str(c.key)


def changes_from(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> int:
    """How many parameters differ from the defaults (a parameter the defaults lack, e.g. an activated child, counts)."""
    return sum(1 for k, v in params.items() if k not in defaults or defaults[k] != v)


def prefer_parsimonious(candidates: Sequence[Candidate], defaults: Mapping[str, Any], noise: float, *,
                        maximize: bool = True) -> ParsimonyChoice:
    """The candidate with the fewest changes from ``defaults`` among those within ``noise`` (relative, e.g. 0.03)
    of the best; ties go to the better value. ``ValueError`` for no candidate or a bad noise."""
    if not candidates:
        raise ValueError("prefer_parsimonious needs at least one candidate, but got none")
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and 0 <= noise < 1):
        raise ValueError(f"`noise` must be a fraction in [0, 1), but got {noise!r}")
    finite = [c for c in candidates if c.value is not None and math.isfinite(c.value)]
    if not finite:
        raise ValueError("prefer_parsimonious needs a candidate with a finite value, but every value is missing")
    sign = 1.0 if maximize else -1.0
    best = max(finite, key=lambda c: sign * c.value)
    if maximize:
        within = [c for c in finite if c.value >= best.value * (1 - noise)]
    else:
        within = [c for c in finite if c.value <= best.value * (1 + noise)]
    chosen = min(within, key=lambda c: (changes_from(c.params, defaults), -sign * c.value))
    return ParsimonyChoice(chosen=chosen, best=best, changes=changes_from(chosen.params, defaults),
                           best_changes=changes_from(best.params, defaults), within=tuple(within), noise=float(noise))


def parsimony_for_run(repo, run) -> ParsimonyChoice | None:
    """Among the study's successful trials within the measured noise below its recorded best (``run.best_value``,
    the search's decided choice), the one with the fewest changes from the defaults (:func:`prefer_parsimonious`);
    ``None`` when it cannot be judged. A trial timed above the recorded best (a single lucky draw the search did not
    choose) is not a candidate. The noise is the spread of the best configuration's own runs ((max - min) / median)
    when it ran more than once, else the median over levels of its step times' interquartile spread relative to
    the step; at most :data:`NOISE_CAP`."""
    from search_spaces import SpaceError, load_space_text

    try:
        space = load_space_text(run.space_yaml, source=run.space_name) if run.space_yaml else None
    except SpaceError:
        space = None
    best_trial = repo.get_trial(run.id, run.best_trial_number) if run.best_trial_number is not None else None
    if space is None or best_trial is None:
        return None
    maximize = run.direction != "minimize"
    best_value = run.best_value if run.best_value is not None else best_trial.value
    if best_value is None:
        return None
    trials = [t for t in repo.list_trials(run.id, outcome="ok") if t.value is not None and t.repeat_of is None]
    same = sorted(t.value for t in trials if t.params == best_trial.params)
    if len(same) > 1 and same[len(same) // 2]:
        noise = (same[-1] - same[0]) / abs(same[len(same) // 2])
    else:
        spreads = {m.level: m.value for m in best_trial.measurements if m.metric == "step_spread_ms"}
        steps = {m.level: m.value for m in best_trial.measurements if m.metric == "step_ms" and m.value}
        rel = sorted(spreads[lv] / steps[lv] for lv in steps if lv in spreads)
        noise = rel[len(rel) // 2] if rel else 0.0
    noise = min(NOISE_CAP, noise)
    groups: dict[str, list] = {}  # a configuration competes with the median of its runs, never one lucky run
    for t in trials:
        if t.params != best_trial.params:
            groups.setdefault(json.dumps(t.params, sort_keys=True, default=str), []).append(t)
    below = []
    for runs in groups.values():
        value = statistics.median(r.value for r in runs)
        if value <= best_value if maximize else value >= best_value:
            last = max(runs, key=lambda r: r.number)
            below.append(Candidate(last.number, last.params, value))
    return prefer_parsimonious([Candidate(best_trial.number, best_trial.params, best_value), *below],
                               space.defaults(), noise, maximize=maximize)
