"""What a search reports: one line per trial and the result of the whole search (the progress receiver, which
also sees the search's context, is ``tuner.search.context.Progress``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.search.winner import params_json
from tuner.targets import PreflightReport


@dataclass
class TrialSummary:
    number: int
    params: dict[str, Any]
    outcome: str
    value: float | None
    reason: str = ""
    duration_s: float = 0.0
    is_baseline: bool = False
    repeat_of: int | None = None
    """The earlier trial whose timing this one copies (its configuration was not run again)."""
    served: str = ""
    """The loads not served in full (failed requests, tokens short of those asked):
    :func:`tuner.measurement.served_shortfall`; empty when all were."""
    turned_away: int = 0
    """Proposals for this trial turned away before it ran, each a repeat of a timed configuration
    (``tuner.search.sampling.suggest``); stored as the Optuna trial's ``turned_away`` user attribute."""

    @property
    def is_repeat(self) -> bool:
        return self.repeat_of is not None

    @property
    def reproposed(self) -> bool:
        """TPE proposed a timed configuration for this trial: it was recorded as a repeat, or turned away."""
        return self.repeat_of is not None or self.turned_away > 0


@dataclass
class SearchResult:
    study: str
    storage_url: str
    state: str
    trials: list[TrialSummary]
    baseline: TrialSummary | None
    best: TrialSummary | None
    best_params: dict[str, Any] | None
    best_value: float | None
    baseline_value: float | None
    export_dir: str | None
    preflight: PreflightReport
    elapsed_s: float
    stop_reason: str = ""
    best_runs: list[int] = field(default_factory=list)
    """The trials whose median is ``best_value`` (the winner's runs)."""
    best_spread: float = 0.0
    """(max - min) / median over the winner's runs."""
    baseline_runs: list[int] = field(default_factory=list)
    note: str = ""
    """What the user must know about the choice (e.g. nothing beat the baseline beyond the noise)."""
    infeasible: str = ""
    """A goodput search in which no configuration met the SLO: the line that says so (nothing was exported; the
    command exits non-zero)."""
    budget_s: float = 0.0
    """The wall-clock budget the search ran under (0 when unknown)."""

    @property
    def speedup(self) -> float | None:
        if self.best_value and self.baseline_value:
            return self.best_value / self.baseline_value
        return None


def trial_tally(trials: list[TrialSummary]) -> str:
    """What a search's trials were, each counted once: the configurations measured, by the outcome of their first
    run, then how many trials were a repeat told an earlier result (not run) or a re-run of a configuration already
    measured (confirmation, side by side), and how many proposals were turned away as repeats before they became
    trials: ``2 configurations: ok 2 (31 trials: 25 repeats not run again, 4 re-runs of a measured configuration;
    90 proposals turned away as repeats)``."""
    first: dict[str, str] = {}
    repeats = reruns = 0
    turned = sum(t.turned_away for t in trials)
    for t in sorted(trials, key=lambda t: t.number):
        key = params_json(t.params)
        if t.repeat_of is not None:
            repeats += 1
        elif key in first:
            reruns += 1
        else:
            first[key] = t.outcome
    counts: dict[str, int] = {}
    for outcome in first.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    text = f"{len(first)} configuration{'s' if len(first) != 1 else ''}"
    if counts:
        text += ": " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    extra = [
        part
        for n, part in (
            (repeats, f"{repeats} repeat{'s' if repeats != 1 else ''} not run again"),
            (reruns, f"{reruns} re-run{'s' if reruns != 1 else ''} of a measured configuration"),
        )
        if n
    ]
    away = f"{turned} proposal{'s' if turned != 1 else ''} turned away as repeats" if turned else ""
    if extra:
        return text + f" ({len(trials)} trials: {', '.join(extra)}{'; ' + away if away else ''})"
    return text + (f" ({away})" if away else "")
