"""Parsimony: among configurations the measurements cannot tell apart from the best, prefer the simplest.

A configuration within the measured noise of the best is as good as the best as far as the data can say; the one
with the fewest changes from the defaults is then the one to deploy (fewer flags to carry, fewer ways to break).
:func:`prefer_parsimonious` is a pure function: candidates in, the choice and its reason out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


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
            return (f"the best ({self.best.key}) has {self.best_changes} change(s) from the defaults; none of the "
                    f"{len(self.within) - 1} other configuration(s) within the noise ({self.noise:.1%}) has fewer")
        gap = abs(self.chosen.value / self.best.value - 1) if self.best.value else 0.0
        return (f"preferred {self.chosen.key} ({self.changes} change(s) from the defaults) over the best "
                f"{self.best.key} ({self.best_changes} changes): {gap:.1%} apart, within the measured noise "
                f"{self.noise:.1%}")


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
