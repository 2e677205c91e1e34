"""Parsimony: among the measured configurations within the noise of the best, the one with the fewest changes from
the defaults (fewer flags to carry, fewer ways to break). A pure rule: the search's decision
(``tuner.search.winner``) and the workload target's choice of the exported command (the command stage's best,
``tuner.targets.workload.deploy``) both use it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NOISE_CAP = 0.10
"""Parsimony's noise is capped here: a noisier measurement must not make a much slower configuration win."""


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
                return (
                    f"no other configuration is within the measured noise ({self.noise:.1%}) of the best "
                    f"({_name(self.best)}, {self.best_changes} change(s) from the defaults)"
                )
            return (
                f"the best ({_name(self.best)}) has {self.best_changes} change(s) from the defaults; none of the "
                f"{others} other configuration(s) within the measured noise ({self.noise:.1%}) has fewer"
            )
        gap = abs(self.chosen.value / self.best.value - 1) if self.best.value else 0.0
        return (
            f"preferred {_name(self.chosen)} ({self.changes} change(s) from the defaults) over the best "
            f"{_name(self.best)} ({self.best_changes} changes): {gap:.1%} apart, within the measured noise "
            f"{self.noise:.1%}"
        )


def _name(c: Candidate) -> str:
    return f"trial {c.key}" if isinstance(c.key, int) else str(c.key)


def changes_from(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> int:
    """How many parameters differ from the defaults (a parameter the defaults lack, e.g. an activated child, counts)."""
    return sum(1 for k, v in params.items() if k not in defaults or defaults[k] != v)


def prefer_parsimonious(
    candidates: Sequence[Candidate], defaults: Mapping[str, Any], noise: float, *, maximize: bool = True
) -> ParsimonyChoice:
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
    return ParsimonyChoice(
        chosen=chosen,
        best=best,
        changes=changes_from(chosen.params, defaults),
        best_changes=changes_from(best.params, defaults),
        within=tuple(within),
        noise=float(noise),
    )
