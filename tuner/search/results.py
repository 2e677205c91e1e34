"""What a search reports: one line per trial, the result of the whole search, and the progress receiver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.targets import PreflightReport

if TYPE_CHECKING:  # pragma: no cover
    from tuner.search.context import SearchContext


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

    @property
    def is_repeat(self) -> bool:
        return self.repeat_of is not None


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

    @property
    def speedup(self) -> float | None:
        if self.best_value and self.baseline_value:
            return self.best_value / self.baseline_value
        return None


class Progress:
    """Receives what the search does; the CLI draws it, tests record it. Every method is optional."""

    def started(self, ctx: SearchContext) -> None: ...
    def trial_started(self, number: int, params: dict[str, Any]) -> None: ...
    def trial_finished(self, summary: TrialSummary, ctx: SearchContext) -> None: ...
    def message(self, text: str) -> None: ...
