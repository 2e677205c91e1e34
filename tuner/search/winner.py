"""Choosing the winner: the one place that turns measured configurations into the configuration a search reports,
records and exports, with its reason.

A configuration's figure is the median over its runs; its runs' spread, (max - min) / median, is its noise. The
decision, in order (:func:`decide`, a pure function: measured configurations in, a :class:`Decision` out):

1. **The best median.** Once any configuration was timed more than once, a configuration timed once competes only
   when its lead over the best repeated median is far beyond the widest spread any configuration's own runs showed
   (:func:`beyond_noise`): a 17x lead is not a lucky draw when repeated runs differ by 7x at most. It then wins,
   marked "measured once" (the budget left no time to re-run it).
2. **The baseline.** A winner that does not beat the baseline by more than their runs' spread (both timed more than
   once) is not a winner: the defaults are exported, and the note says so.
3. **Parsimony.** Among the configurations whose medians are within the noise below the winner's, the one with the
   fewest changes from the defaults (:func:`prefer_parsimonious`): fewer flags to carry, fewer ways to break.

The search (:func:`decide_for_search`), a stored study (:func:`decision_for_run`) and the kernel search
(:func:`tuner.search.kernel_search`) all decide here.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.figures.parsimony import NOISE_CAP, Candidate, ParsimonyChoice, changes_from, prefer_parsimonious
from tuner.settings import CommonSettings

__all__ = [
    "NOISE_CAP",
    "Candidate",
    "ParsimonyChoice",
    "changes_from",
    "prefer_parsimonious",
]  # re-exported: the rule's home


# -- measured configurations ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One configuration and its runs (trial numbers and objective values, in the same order)."""

    key: str
    params: Mapping[str, Any]
    numbers: tuple[int, ...]
    values: tuple[float, ...]
    is_baseline: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        return spread_of(list(self.values))

    @property
    def last(self) -> int:
        return max(self.numbers)


def spread_of(values: list[float]) -> float:
    """The relative range of repeated timings: (max - min) / median; 0 for a single one or identical ones (runs
    that all met nothing, 0, agree); ``inf`` for runs that differ around a median of 0."""
    if len(values) < 2 or max(values) == min(values):
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / abs(med) if med else math.inf


def group_runs(records: Iterable, key_of: Callable[[dict], str]) -> list[Measured]:
    """The measured configurations of trial-like ``records`` (``number``, ``params``, ``outcome``, ``value``,
    ``repeat_of``, ``is_baseline``): the ok runs with a value, a repeat (a copied timing) left out, grouped by
    ``key_of(params)`` (twins of one program are one configuration)."""
    groups: dict[str, list] = {}
    for r in records:
        if r.outcome == "ok" and r.value is not None and math.isfinite(r.value) and r.repeat_of is None:
            groups.setdefault(key_of(r.params), []).append(r)
    out = []
    for key, runs in groups.items():
        runs = sorted(runs, key=lambda r: r.number)
        out.append(
            Measured(
                key,
                runs[-1].params,
                tuple(r.number for r in runs),
                tuple(r.value for r in runs),
                any(r.is_baseline for r in runs),
            )
        )
    return out


def baseline_of(groups: Sequence[Measured]) -> Measured | None:
    """The baseline configuration among ``groups`` (the one any of whose runs was the baseline trial): its median is
    the one figure every "x baseline" uses (the per-trial lines, ``tuner status``, the final line, the export)."""
    return next((g for g in groups if g.is_baseline), None)


FAR_BEYOND = 2.0
"""A configuration timed once beats a repeated median when it leads by more than this many times the measured
noise (:func:`beyond_noise`)."""


def widest_spread(groups: Sequence[Measured]) -> float:
    """The largest (max - min) / median over the runs of any configuration timed more than once: the measured
    noise (0 when nothing was timed twice). A configuration whose median is 0 (it met nothing, e.g. a goodput
    baseline that missed the SLO) has no relative spread and is left out: its ``inf`` would make every lead noise."""
    return max((g.spread for g in groups if len(g.values) > 1 and g.median != 0), default=0.0)


def met_nothing(g: Measured, maximize: bool) -> bool:
    """True when a maximized objective's median is 0 or less: the configuration met nothing (a goodput search's
    baseline that missed the SLO at every load). No ratio over it means anything."""
    return maximize and g.median <= 0


def lead_of(a: float, b: float, maximize: bool) -> float:
    """How many times better ``a`` is than ``b`` (a ratio; > 1 when ``a`` is better)."""
    num, den = (a, b) if maximize else (b, a)
    if den > 0:
        return num / den
    return math.inf if num > den else 1.0


def beyond_noise(lead: float, noise: float, tolerance: float = 0.0) -> bool:
    """True when a single timing's ``lead`` (a ratio over a repeated median) is more than :data:`FAR_BEYOND` times
    the measured ``noise`` (the widest relative spread between repeated runs) or the space's ``tolerance``, whichever
    is larger, above 1: no draw the noise was seen to make explains it. With repeated runs 7.2x apart (a loaded CPU:
    a spread of 151%), a lead of 4.3x over their median is beyond it; with runs 20% apart, 1.22x is not."""
    return lead > 1.0 + FAR_BEYOND * max(noise, tolerance)


def beats_beyond(value: float, reference: float, spread: float, *, maximize: bool) -> bool:
    """True when ``value`` beats ``reference`` by more than ``spread`` of it (the kernel search keeps its default
    config unless the best beats it so)."""
    return value > reference * (1.0 + spread) if maximize else value < reference * (1.0 - spread)


# -- parsimony: the rule itself is tuner.figures.parsimony (the workload target's command stage uses it too) -----
# -- the decision ----------------------------------------------------------------------------------------------
@dataclass
class Choice:
    """The configuration a search reports and exports: its median over its runs and how far those runs spread."""

    number: int
    """The latest run of the configuration (its parameters, its stored record)."""
    params: dict[str, Any]
    value: float
    """The median of the objective over :attr:`runs`."""
    runs: list[int]
    spread: float
    """(max - min) / median over the runs; 0 for one run."""
    is_baseline: bool = False

    @property
    def measured_once(self) -> bool:
        return len(self.runs) == 1

    @classmethod
    def of(cls, g: Measured) -> Choice:
        return cls(g.last, dict(g.params), g.median, sorted(g.numbers), g.spread, g.is_baseline)


@dataclass
class Decision:
    """What a search reports and exports, and why."""

    best: Choice | None
    baseline: Choice | None
    note: str = ""
    """What the user must know about the choice (the defaults kept, or a winner measured once)."""
    parsimony: ParsimonyChoice | None = None
    noise: float = 0.0
    """The widest (max - min) / median between repeated runs of one configuration (:func:`widest_spread`)."""


def pick_best(groups: Sequence[Measured], *, maximize: bool, tolerance: float = 0.0) -> tuple[Measured | None, str]:
    """``(the configuration with the best median, a note)``. Once any configuration was timed more than once, one
    timed once wins only with a lead over the best repeated median beyond the measured noise (:func:`beyond_noise`);
    the note then says it was measured once."""
    sign = 1.0 if maximize else -1.0
    if not groups:
        return None, ""
    repeated = [g for g in groups if len(g.values) > 1]
    if not repeated:
        return max(groups, key=lambda g: sign * g.median), ""
    best = max(repeated, key=lambda g: sign * g.median)
    lead, note = _single_beyond(groups, best, widest_spread(groups), maximize=maximize, tolerance=tolerance)
    return (lead, note) if lead is not None else (best, "")


def _single_beyond(
    groups: Sequence[Measured], reference: Measured, noise: float, *, maximize: bool, tolerance: float
) -> tuple[Measured | None, str]:
    """The best configuration timed once when its lead over ``reference`` (a repeated median) is beyond ``noise``
    (:func:`beyond_noise`), with the note that says so; ``(None, "")`` otherwise."""
    sign = 1.0 if maximize else -1.0
    singles = [g for g in groups if len(g.values) == 1]
    if not singles:
        return None, ""
    lead = max(singles, key=lambda g: sign * g.median)
    gain = lead_of(lead.median, reference.median, maximize)
    if not beyond_noise(gain, noise, tolerance):
        return None, ""
    what = "the baseline" if reference.is_baseline else "the best configuration timed more than once"
    if met_nothing(reference, maximize):
        return lead, (
            f"measured once: trial {lead.last} ({dict(lead.params)}) scored {lead.median:.2f} where "
            f"{what} met nothing (median 0); the budget left no time to re-run it"
        )
    return lead, (
        f"measured once: trial {lead.last} ({dict(lead.params)}) was {gain:.2f}x {what}, far beyond "
        f"the widest spread between repeated runs ({noise:.1%}); the budget left no time to re-run it"
    )


def decide(
    groups: Sequence[Measured],
    *,
    defaults: Mapping[str, Any],
    maximize: bool = True,
    tolerance: float = 0.0,
    noise_of_single: Callable[[Measured], float] | None = None,
) -> Decision:
    """The winner of ``groups`` (see the module docstring): best median, then the baseline check, then parsimony.
    ``tolerance`` is the space's ``noise_tolerance`` (a single timing must lead by more); ``noise_of_single``
    gives parsimony's noise for a winner timed once (e.g. its step times' spread; 0 without it)."""
    base_g = baseline_of(groups)
    base = Choice.of(base_g) if base_g else None
    best_g, note = pick_best(groups, maximize=maximize, tolerance=tolerance)
    noise = widest_spread(groups)
    if best_g is None:
        return Decision(None, base, "", None, noise)
    # a baseline that met nothing (median 0) is beaten by any configuration that met something: no ratio to judge
    if base_g is not None and best_g.key != base_g.key and not note and not met_nothing(base_g, maximize):
        gain = lead_of(best_g.median, base_g.median, maximize)
        spread = max(best_g.spread, base_g.spread)
        if len(best_g.values) > 1 and len(base_g.values) > 1 and gain - 1.0 <= spread:
            single, why = _single_beyond(groups, base_g, noise, maximize=maximize, tolerance=tolerance)
            if single is not None:  # the best repeated one is the baseline's equal; one timed once is not
                return Decision(Choice.of(single), base, why, None, noise)
            return Decision(
                base,
                base,
                (
                    f"nothing beat the baseline beyond the measured spread: the best "
                    f"({dict(best_g.params)}) was {gain:.3f}x it, within the runs' spread of "
                    f"{spread:.1%}; the defaults are exported"
                ),
                None,
                noise,
            )
    if len(best_g.values) > 1:
        p_noise = best_g.spread
    else:
        p_noise = noise_of_single(best_g) if noise_of_single else 0.0
    p_noise = min(NOISE_CAP, p_noise) if math.isfinite(p_noise) else NOISE_CAP
    sign = 1.0 if maximize else -1.0
    # a configuration competes with the median of its runs; one timed above the winner (a lucky draw the
    # decision did not choose) is not a candidate
    below = [g for g in groups if g.key != best_g.key and sign * g.median <= sign * best_g.median]
    parsimony = prefer_parsimonious(
        [Candidate(best_g.last, best_g.params, best_g.median), *(Candidate(g.last, g.params, g.median) for g in below)],
        defaults,
        p_noise,
        maximize=maximize,
    )
    chosen = best_g
    if parsimony.switched:
        chosen = next(g for g in below if g.last == parsimony.chosen.key)
        if note:  # the measured-once winner gave way to one with fewer changes within its noise
            note += (
                f"; trial {chosen.last}, {len(chosen.values)} run(s) and fewer changes, is within its noise and "
                f"is the choice"
            )
    return Decision(Choice.of(chosen), base, note, parsimony, noise)


# -- adapters: a running search, a stored study --------------------------------------------------------------
def step_noise(trial) -> float:
    """A stored trial's own noise: the median over levels of its step times' interquartile spread relative to the
    step (``step_spread_ms`` / ``step_ms``); 0 when it recorded none."""
    spreads = {m.level: m.value for m in trial.measurements if m.metric == "step_spread_ms"}
    steps = {m.level: m.value for m in trial.measurements if m.metric == "step_ms" and m.value}
    rel = sorted(spreads[lv] / steps[lv] for lv in steps if lv in spreads and spreads[lv] is not None)
    return rel[len(rel) // 2] if rel else 0.0


def decide_for_search(ctx) -> Decision:
    """The decision over a running search's trials (``tuner.search.context.SearchContext``)."""
    groups = group_runs(ctx.trials, ctx.key_of)

    def noise_of_single(g: Measured) -> float:
        rec = ctx.repo.get_trial(ctx.run.id, g.last)
        return step_noise(rec) if rec is not None else 0.0

    return decide(
        groups,
        defaults=ctx.resolved.defaults(),
        maximize=ctx.direction == "maximize",
        tolerance=ctx.target.config.noise_tolerance,
        noise_of_single=noise_of_single,
    )


def params_json(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def decision_for_run(repo, run) -> Decision | None:
    """The decision over a stored study's trials (``tuner export`` of a finished run, a study read back); ``None``
    when its space cannot be read."""
    from search_spaces import SpaceError, load_space_text

    try:
        space = load_space_text(run.space_yaml, source=run.space_name) if run.space_yaml else None
    except SpaceError:
        space = None
    if space is None:
        return None
    groups = group_runs(repo.list_trials(run.id, outcome="ok"), params_json)
    tolerance = float(
        (run.settings or {}).get("noise_tolerance", CommonSettings.model_fields["noise_tolerance"].default)
    )

    def noise_of_single(g: Measured) -> float:
        rec = repo.get_trial(run.id, g.last)
        return step_noise(rec) if rec is not None else 0.0

    return decide(
        groups,
        defaults=space.defaults(),
        maximize=run.direction != "minimize",
        tolerance=tolerance,
        noise_of_single=noise_of_single,
    )


def parsimony_for_run(repo, run) -> ParsimonyChoice | None:
    """Parsimony around a stored study's recorded best (``run.best_trial_number``, the search's decided choice):
    among the configurations whose medians are within the noise below it, the one with the fewest changes from the
    defaults (``tuner export`` of a finished study says which trial it exports and why). ``None`` when it cannot be
    judged. The noise is the recorded best's own runs' spread when it ran more than once, else its step times'
    spread (:func:`step_noise`); at most :data:`NOISE_CAP`."""
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
    groups = group_runs(repo.list_trials(run.id, outcome="ok"), params_json)
    anchor = next((g for g in groups if g.key == params_json(best_trial.params)), None)
    noise = anchor.spread if anchor is not None and len(anchor.values) > 1 else step_noise(best_trial)
    noise = min(NOISE_CAP, noise) if math.isfinite(noise) else NOISE_CAP
    sign = 1.0 if maximize else -1.0
    others = [g for g in groups if anchor is None or g.key != anchor.key]
    below = [Candidate(g.last, g.params, g.median) for g in others if sign * g.median <= sign * best_value]
    return prefer_parsimonious(
        [Candidate(best_trial.number, best_trial.params, best_value), *below],
        space.defaults(),
        noise,
        maximize=maximize,
    )
