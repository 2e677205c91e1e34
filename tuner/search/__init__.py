"""The engine: the search's state, one trial, the sequential loop, parallel workers with GPU leases, the refining
moves, the top-k confirmation, the choice of the winner (``winner``), the kernel search, and the driver that runs it all in a budget.

Imports run one way: ``driver`` -> ``kernel_search`` / ``parallel`` / ``loop`` -> ``confirm`` -> ``trial`` / ``winner`` ->
``context`` -> ``refine`` / ``sampling``.
"""

from tuner.search.context import Progress, SearchContext, SearchOptions, SearchResult, TrialSummary, open_context
from tuner.search.driver import run_search
from tuner.search.trial import run_one

__all__ = [
    "Progress",
    "SearchContext",
    "SearchOptions",
    "SearchResult",
    "TrialSummary",
    "open_context",
    "run_one",
    "run_search",
]
