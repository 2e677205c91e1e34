"""What a search is asked to do: its options (the CLI, the API's search process and the tests build them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from search_spaces import Hardware


@dataclass
class SearchOptions:
    budget_s: float
    storage_url: str = "sqlite:///tuner.db"
    study: str | None = None
    space_path: str | None = None
    """A YAML file or a built-in name; ``None`` picks ``dsv4_flash`` on a GPU and ``dsv4_flash_tiny`` on a CPU."""
    target: str | None = None
    resume: bool = False
    seed: int | None = None
    out_dir: str = "tuner-out"
    settings: dict[str, Any] = field(default_factory=dict)
    n_trials: int | None = None
    dry_run: bool = False
    started_at: float | None = None
    """When the budget starts (``time.time()``'s clock): the CLI passes its process's start, so the imports and
    setup before the search count against ``--budget`` as the user's clock does; ``None``: when the search starts."""
    confirm_top: int = 3
    refine_share: float = 0.25
    """Share of the time for trials spent last on one-change moves from the best so far (``tuner.search.refine``)."""
    export: bool = True
    trial_timeout_s: float | None = None
    hardware: Hardware | None = None
    workers: int = 1
    """Local worker threads, each running its trials in its own subprocess (see ``tuner.search.parallel``)."""
    gpus: list[int] | None = None
    """GPU ids the local workers lease from (``None``: every visible GPU, or none on a CPU machine)."""
    converge_after: int = 40
    """The stretch of convergence (``tuner.search.stages``): a stage whose last this-many trials (at least a fifth of
    the stage's) found nothing better beyond the noise while repeats crowd the proposals has mapped its space and
    ends early; 0 turns convergence off (every stage runs its share of the budget)."""
    warm_start: str | None = None
    """``URL#STUDY`` of a twin (workload) study whose best configurations, translated, run first (server targets)."""
