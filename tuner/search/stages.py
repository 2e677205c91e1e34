"""Stages of one search in one budget, and convergence: when a stage has mapped its space, the next one starts.

A workload search whose space marks values the exported SGLang command cannot set (``server: not_deployable`` /
``deploys_as``) runs two stages: **command** (only the values the command can set on this GPU, as
``--set deployable_only=true`` resolves them: the best of this stage is a command, its figure "this command") and
**code changes** (the whole space). Any other search is one stage, **search**. The baseline and the confirmation
re-runs always use the whole space.

A stage ends when its share of the time for trials is spent (the shares are of the time left once the baseline's runs
are done: the baseline is no stage's trial), or earlier when it has **converged**: over the last
``stretch`` trials of the stage that ran (``--converge-after N``, at least a fifth of them so far; a trial the
target refused before running it, ``invalid_config`` in no time, is not counted: on an H200 a code-changes stage of
42 such proposals and 38 pruned trials "converged" after 80 trials without one whole measurement) no new
configuration beat the best found before them by more than the measured noise (the best's own step-time spread,
at least :data:`MIN_GAIN`), and either a quarter or more of the stretch's proposals were repeats of configurations
already timed, or the stretch has lasted twice as long. The proposals are the trials and those turned away before
them: a repeat proposal is mostly turned away and sampled again before it becomes a trial
(``tuner.search.sampling.suggest``), and only a trial whose every proposal repeated is recorded as a repeat, so the
share counts the turned-away ones and the recorded repeats over both. The stage says so in one line and the next
stage starts with the time left; when the last stage converges the search stops, confirms and exports early, and
says how much of the budget it left.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from search_spaces import ResolvedSpace, resolve
from tuner.measurement import Outcome
from tuner.search.winner import NOISE_CAP, step_noise

_logger = logging.getLogger(__name__)

CONVERGE_AFTER = 40
"""The default stretch (``--converge-after``): trials of a stage with no gain beyond the noise."""
MIN_GAIN = 0.005
"""A gain below this share is never counted as one, however quiet the measurements."""
REPEAT_SHARE = 0.25
"""Repeats crowd the proposals when at least this share of the stretch's proposals re-proposed timed configurations."""
COMMAND_SHARE = 0.5
"""The command stage's share of the time for trials; convergence passes what it leaves to the code changes."""


@dataclass(frozen=True)
class Stage:
    name: str
    share: float
    resolved: ResolvedSpace
    what: str

    def line(self, budget_s: float | None = None) -> str:
        when = f"{self.share:.0%} of the time for trials"
        if budget_s:
            when += f" (about {budget_s * self.share / 60:.0f} min)"
        return f"{self.name}: {when}, {self.what}"


@dataclass(frozen=True)
class Verdict:
    """Why a stage converged, as one line."""

    stretch: int
    repeats: int
    """Proposals of the stretch that repeated a timed configuration: turned away, or recorded as repeats."""
    noise: float
    proposals: int
    """The stretch's proposals: one per trial and those turned away before them."""

    def line(self) -> str:
        return (
            f"no better configuration beyond the noise ({self.noise:.1%}) in its last {self.stretch} trials, "
            f"{self.repeats} of their {self.proposals} proposals repeats"
        )


def converged(
    values: Sequence[float | None],
    repeats: Sequence[bool],
    best_before: float | None,
    *,
    stretch: int,
    noise: float | Callable[[], float],
    maximize: bool,
    turned_away: Sequence[int] | None = None,
) -> Verdict | None:
    """The convergence rule over one stage's trials in order (``values``: a new configuration's objective, None
    for a failure; ``repeats``: whether each was recorded as a repeat of a timed configuration; ``turned_away``: how
    many repeat proposals each had turned away first, none where omitted), ``best_before`` the search's best before
    the stage. ``None`` while the stage has not converged (see the module docstring)."""
    track = StretchTrack(best_before, maximize)
    for v, r, k in zip(values, repeats, turned_away or [0] * len(values), strict=True):
        track.append(v, r, k)
    return track.verdict(stretch=stretch, noise=noise)


class StretchTrack:
    """One stage's trials as :func:`converged` reads them, appended one by one: the best up to each trial, the
    proposals and the repeat proposals up to each, and the best new value of any range of trials (a sparse table), so
    the rule costs the same at the 20,000th trial of a stage as at the 50th (it re-read the whole stage after every
    trial)."""

    def __init__(self, best_before: float | None, maximize: bool) -> None:
        self.best_before, self.maximize = best_before, maximize
        self.n = 0
        self.prefix_best: list[float | None] = [best_before]  # best_of(values[:i], best_before), i = 0..n
        self.prefix_reps = [0]  # repeat proposals of the first i trials: recorded repeats and those turned away
        self.prefix_props = [0]  # proposals of the first i trials: one per trial and those turned away
        self.top: list[list[float]] = [[]]  # top[k][i]: the best key of the new values in [i, i + 2**k)

    def append(self, value: float | None, repeat: bool, turned_away: int = 0) -> None:
        """One more trial: its value (None: failed), whether it was recorded as a repeat, and how many repeat
        proposals were turned away before it."""
        best = self.prefix_best[-1]
        if (
            value is not None
            and math.isfinite(value)
            and (best is None or (value > best if self.maximize else value < best))
        ):
            best = value
        self.prefix_best.append(best)
        self.prefix_reps.append(self.prefix_reps[-1] + bool(repeat) + turned_away)
        self.prefix_props.append(self.prefix_props[-1] + 1 + turned_away)
        # a value that may beat: a new configuration's (a repeat's is a copy), NaN never does
        key = -math.inf if value is None or repeat or math.isnan(value) else (value if self.maximize else -value)
        self.top[0].append(key)
        self.n += 1
        k = 1
        while (i := self.n - (1 << k)) >= 0:
            if len(self.top) == k:
                self.top.append([])
            half = self.top[k - 1]
            self.top[k].append(max(half[i], half[i + (1 << (k - 1))]))
            k += 1

    def _best_key(self, lo: int, hi: int) -> float:
        k = (hi - lo).bit_length() - 1
        return max(self.top[k][lo], self.top[k][hi - (1 << k)])

    def verdict(self, *, stretch: int, noise: float | Callable[[], float]) -> Verdict | None:
        n = self.n
        if stretch <= 0:
            return None
        stretch = max(stretch, math.ceil(0.2 * n))
        if n < stretch:
            return None
        gain = max(noise() if callable(noise) else noise, MIN_GAIN)

        def quiet(window: int) -> bool:
            ref = self.prefix_best[n - window]
            if ref is None:
                return False
            key = self._best_key(n - window, n)
            if key == -math.inf:
                return True
            v = key if self.maximize else -key
            return not (v > ref * (1 + gain) if self.maximize else v < ref * (1 - gain))

        if not quiet(stretch):
            return None
        reps = self.prefix_reps[n] - self.prefix_reps[n - stretch]
        props = self.prefix_props[n] - self.prefix_props[n - stretch]
        if reps >= REPEAT_SHARE * props:
            return Verdict(stretch, reps, gain, props)
        if n >= 2 * stretch and quiet(2 * stretch):
            lo = n - 2 * stretch
            return Verdict(
                2 * stretch,
                self.prefix_reps[n] - self.prefix_reps[lo],
                gain,
                self.prefix_props[n] - self.prefix_props[lo],
            )
        return None


def convergence_line(stretch: int, n_trials: int | None) -> str:
    """The dry run's line on convergence."""
    if n_trials is not None:
        return "off with --n-trials (every stage runs its share of the trials)"
    if stretch <= 0:
        return "off (--converge-after 0): every stage runs its share of the budget"
    return (
        f"a stage ends early when its last {stretch} trials (at least a fifth of the stage's) found nothing "
        f"better beyond the noise and a quarter of their proposals repeated timed configurations (turned away "
        f"and sampled again, or recorded as repeats), or after twice that many "
        f"(--converge-after N sets the stretch, 0 turns it off); the last stage's convergence ends the search "
        f"with the export and the budget it left"
    )


def plan(resolved: ResolvedSpace, *, deployable_only: bool) -> list[Stage]:
    """The stages of a search over ``resolved`` (see the module docstring): read from the space, never from
    hard-coded values, so a space whose deployable values change per GPU plans its stages from them."""
    if deployable_only:
        return [Stage("command", 1.0, resolved, "only the values the exported command can set (deployable_only)")]
    command, held = command_space(resolved)
    if command is None:
        return [Stage("search", 1.0, resolved, "the whole space")]
    bad = resolved.space.violated_constraints(command.defaults())
    if bad:  # e.g. the command's attention needs a kernel this machine lacks: no command stage can run here
        return [
            Stage(
                "search",
                1.0,
                resolved,
                "the whole space (no command stage: the command's values break "
                + ", ".join(f"`{c.name}`" for c in bad)
                + " here)",
            )
        ]
    sampled = {p.name for p in command.params}
    code = [p.name for p in resolved.params if p.name not in sampled]
    return [
        Stage(
            "command",
            COMMAND_SHARE,
            command,
            f"the values the exported SGLang command can set on this GPU first "
            f"({', '.join(p.name for p in command.params) or 'nothing to tune'})"
            + (f"; {', '.join(held)} held at one value" if held else ""),
        ),
        Stage(
            "code changes",
            1.0 - COMMAND_SHARE,
            resolved,
            f"then the whole space, the values that need a code change too ({', '.join(code)})",
        ),
    ]


def command_space(resolved: ResolvedSpace) -> tuple[ResolvedSpace | None, list[str]]:
    """``resolved`` cut to the values the exported command can set on its GPU (``None`` when that cuts nothing),
    and the parameters it holds at one value: one whose values the cut shrinks but leaves more than one of, at its
    command default (Optuna's categorical distributions cannot change their values inside one study), and one whose
    command value cannot run on this machine (a CPU has no FlashMLA), at the value that runs here."""
    cut = resolve(resolved.space, resolved.hardware, deployable_only=True)
    full = {p.name: tuple(p.choices()) for p in resolved.params}
    kept, fixed, held = [], dict(cut.fixed), []
    runs_here = resolved.defaults()
    for name, v in cut.fixed.items():  # a command value that cannot run on this machine: the one that does
        if name in runs_here and v != runs_here[name] and v not in full.get(name, ()):
            fixed[name] = runs_here[name]
            held.append(name)
    for p in cut.params:
        if full.get(p.name) == tuple(p.choices()):
            kept.append(p)
        else:
            fixed[p.name] = p.default
            held.append(p.name)
    if len(kept) == len(resolved.params):
        return None, []
    return dataclasses.replace(cut, params=tuple(kept), fixed=fixed), held


@dataclass
class StagePlan:
    """The stages of one running search, shared by its worker threads. ``started`` / ``trials_end``: when the
    time for trials starts and ends (``time.time()``); with ``n_trials`` the shares are of trials instead."""

    stages: list[Stage]
    stretch: int = CONVERGE_AFTER
    n_trials: int | None = None
    index: int = 0
    first: int = 0
    """How many of the search's trials came before the current stage."""
    lines: list[str] = field(default_factory=list)
    """What each stage ended with, in order: the one-line messages."""
    converged_line: str = ""
    """Set when the last stage converged: the search ends early."""
    clock_start: float | None = None
    """When the stages' time starts: the end of the baseline's last run (``observe`` sets it)."""
    follower: bool = False
    """A ``tuner worker`` process's plan: it never ends a stage itself, it follows the search's (:meth:`follow`)."""
    opening: int | None = 0
    """Asks of the current stage still to open with a one-change move from the best so far: ``None`` when a stage
    after the first has just started (:meth:`take_opening` counts its moves then), 0 when the opening is over."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _read: _StageRead | None = field(default=None, repr=False)

    @property
    def current(self) -> Stage:
        return self.stages[self.index]

    @property
    def done(self) -> bool:
        return bool(self.converged_line)

    def planned_lines(self, budget_s: float | None = None) -> list[str]:
        return [f"stage {i + 1} {s.line(budget_s)}" for i, s in enumerate(self.stages)]

    def observe(
        self,
        trials: Sequence,
        *,
        maximize: bool,
        noise: float | Callable[[], float],
        started: float,
        trials_end: float,
        now: float | None = None,
    ) -> str | None:
        """After a trial: end the current stage when it converged or spent its share; returns the line to print
        (None when nothing changed). ``trials``: the search's trial summaries so far, in order."""
        now = time.time() if now is None else now
        with self._lock:
            if self.done or self.follower:
                return None
            read = self._read
            if read is None or not read.follows(trials, self.first, maximize):
                read = self._read = _StageRead(trials, self.first, maximize)
            read.catch_up(trials)
            mine = read.mine
            if self.index == 0 and not mine:  # the baseline's runs so far: the stages' time starts after them
                self.clock_start = now
                return None
            start = started if self.clock_start is None else self.clock_start
            last = self.index == len(self.stages) - 1
            ends_at = start + (trials_end - start) * sum(s.share for s in self.stages[: self.index + 1])
            if self.n_trials is not None:
                spent = len(trials) >= math.ceil(self.n_trials * sum(s.share for s in self.stages[: self.index + 1]))
            else:
                spent = now >= ends_at
            verdict = None
            if self.n_trials is None and self.stretch > 0:
                verdict = read.track.verdict(stretch=self.stretch, noise=noise)
            if verdict is None and (last or not spent):
                return None
            stage = self.current
            why = f"converged: {verdict.line()}" if verdict is not None else "its share of the time is spent"
            if last:
                self.converged_line = f"stage {stage.name!r} converged: {verdict.line()}"
                self.lines.append(self.converged_line)
                return self.converged_line
            self.index += 1
            self.first = len(trials)
            self.opening = None
            left = max(0.0, trials_end - now)
            line = (
                f"stage {stage.name!r} ends after {mine} trials ({why}); stage {self.current.name!r} "
                f"starts with {left / 60:.1f} min left: {self.current.what}"
            )
            self.lines.append(line)
            return line

    def exhausted(self, repeats_in_a_row: int, n_trials_so_far: int, index: int | None = None) -> str | None:
        """TPE re-proposed timed configurations ``repeats_in_a_row`` times in a row: the stage's space is spent.
        Moves to the next stage (the line to print) or, on the last, returns None (the search ends as before).
        ``index``: the stage the repeats were counted in; when another worker thread already moved on from it,
        nothing moves and the line is empty (the caller goes on in the new stage)."""
        with self._lock:
            if index is not None and index != self.index:
                return ""
            if self.index == len(self.stages) - 1 or self.follower:
                return None
            stage = self.current
            self.index += 1
            self.first = n_trials_so_far
            self.opening = None
            line = (
                f"stage {stage.name!r} ends: its space is exhausted ({repeats_in_a_row} repeated configurations "
                f"in a row); stage {self.current.name!r} starts: {self.current.what}"
            )
            self.lines.append(line)
            return line

    def take_opening(self, count: Callable[[], int]) -> bool:
        """Whether the next ask of the current stage opens it with a one-change move from the best so far (and takes
        one from the opening). A stage after the first opens with as many such moves as ``count`` finds when its
        first ask comes (the untried moves from the best that the target accepts): the code-changes stage starts
        from the command's best, and what each code change buys on top of the command is measured before TPE
        samples the whole space (on an H200 its samples changed many values at once, 42 of 80 broke a constraint,
        and none of the other 38 beat the command; the twin's best there was one code change away from it)."""
        with self._lock:
            if self.follower:
                return False
            if self.opening is None:
                self.opening = max(0, count())
            if self.opening <= 0:
                return False
            self.opening -= 1
            return True

    def follow(self, index: int, n_trials_so_far: int) -> bool:
        """Move to the search's stage ``index`` (a follower); True when it moved."""
        with self._lock:
            if not 0 <= index < len(self.stages) or index == self.index:
                return False
            self.index, self.first = index, n_trials_so_far
            return True


class _StageRead:
    """What :meth:`StagePlan.observe` read of the search's trials in the current stage (from ``first``), kept up to
    date trial by trial: the stage's own trials (not the baseline's) counted and tracked for the rule
    (:class:`StretchTrack`). Read again whole only when the stage or the list changes."""

    def __init__(self, trials: Sequence, first: int, maximize: bool) -> None:
        self.src, self.first, self.maximize = trials, first, maximize
        before = [t.value for t in trials[:first] if t.outcome == "ok" and t.value is not None]
        self.track = StretchTrack((max(before) if maximize else min(before)) if before else None, maximize)
        self.seen, self.last, self.mine = first, trials[first - 1] if 0 < first <= len(trials) else None, 0

    def follows(self, trials: Sequence, first: int, maximize: bool) -> bool:
        """Whether ``trials`` is the list read so far, grown at its end only, in the same stage."""
        return (
            trials is self.src
            and first == self.first
            and maximize == self.maximize
            and self.seen <= len(trials)
            and (self.seen == self.first or trials[self.seen - 1] is self.last)
        )

    def catch_up(self, trials: Sequence) -> None:
        for t in trials[self.seen :]:  # a copy: a trial another thread appends meanwhile waits for the next read
            if not t.is_baseline:
                self.mine += 1
                if t.outcome != Outcome.INVALID_CONFIG.value:  # refused before it ran: says nothing of the objective
                    self.track.append(t.value if t.outcome == "ok" else None, t.repeat_of is not None, t.turned_away)
            self.last = t
            self.seen += 1


def _record_move(ctx, line: str | None) -> None:
    """The leader moved to a new stage: store it for the ``tuner worker`` processes (``Repo.add_stage``)."""
    plan_ = ctx.stages
    if line and not plan_.done:
        try:
            ctx.repo.add_stage(ctx.run.id, plan_.index, plan_.current.name, line)
        except Exception:  # noqa: BLE001 - the search goes on; a worker keeps sampling its stage
            _logger.exception("storing the stage failed")


def follow_stage(ctx, repo=None) -> None:
    """A ``tuner worker`` process: take the stage its search is in from the study's database (``repo``: another
    handle than ``ctx.repo``, e.g. one that does not retry)."""
    plan_ = ctx.stages
    if plan_ is None or not plan_.follower:
        return
    if plan_.follow((repo or ctx.repo).current_stage(ctx.run.id), len(ctx.trials)):
        _logger.info("following the search into stage %r: %s", plan_.current.name, plan_.current.what)


def repeats_in_a_row(ctx) -> tuple[int, int | None]:
    """How many of the search's latest trials, in the current stage, were recorded as repeats of a timed
    configuration in a row (every worker thread's, in the order they finished), and the stage they were counted in.
    A recorded repeat is a trial whose every proposal repeated (``sampling.MAX_TURNED_AWAY`` turned away first), so
    a run of them says the space is spent. A ``tuner worker`` process's plan (a follower) counts none: it sees only
    its own trials, and the search moves the stages."""
    plan_ = ctx.stages
    if plan_ is not None and plan_.follower:
        return 0, plan_.index
    index, first = (plan_.index, plan_.first) if plan_ is not None else (None, 0)
    trials, n = ctx.trials, 0
    while len(trials) - n > first and trials[len(trials) - n - 1].repeat_of is not None:
        n += 1
    return n, index


def after_trial(ctx, progress=None) -> bool:
    """Called by the search loops after each trial of ``ctx`` (a ``tuner.search.context.SearchContext``): ends the
    current stage when it converged or spent its share (printing the one line), and returns True when the last
    stage converged (the loop stops; the driver confirms and exports early)."""
    plan_ = ctx.stages
    if plan_ is None:
        return False
    if plan_.done:
        return True

    def noise() -> float:  # the best's own step-time spread, as refining moves read it
        best = ctx.best
        rec = ctx.repo.get_trial(ctx.run.id, best.number) if best is not None else None
        return min(NOISE_CAP, step_noise(rec)) if rec is not None else 0.0

    line = plan_.observe(
        ctx.trials,
        maximize=ctx.direction == "maximize",
        noise=noise,
        started=ctx.deadline.start,
        trials_end=ctx.deadline.trials_end,
    )
    if line:
        _logger.info("%s", line)
        if progress:
            progress.message(line)
        _record_move(ctx, line)
    return plan_.done


def opening(ctx, count: Callable) -> bool:
    """Whether the next ask opens the current stage with a one-change move from the best (``StagePlan.take_opening``;
    ``count(ctx)``: how many it opens with, ``tuner.search.refine.open_moves``)."""
    plan_ = ctx.stages
    return plan_ is not None and plan_.take_opening(lambda: count(ctx))


def on_exhausted(ctx, repeats_in_a_row: int, progress=None, index: int | None = None) -> bool:
    """TPE re-proposed timed configurations ``repeats_in_a_row`` times in a row: True when a next stage took over
    (the loop goes on), False on the last stage (the search ends: its space is exhausted). ``index``: the stage the
    repeats were counted in (worker threads: the first to count them moves the plan on, the others follow)."""
    if ctx.stages is None:
        return False
    line = ctx.stages.exhausted(repeats_in_a_row, len(ctx.trials), index)
    if line:
        _logger.info("%s", line)
        if progress:
            progress.message(line)
        _record_move(ctx, line)
    return line is not None
