"""The search's last phase: one-change moves from the best configuration so far (a greedy local search).

The first moves from the best undo its changes one at a time (each changed parameter back to its default), then
come the rest: on an H200 the best was beaten 1.15-1.30x by undoing five of its own changes, which no move toward
other values would try. A configuration that ties the best within the noise (the best's own step-time spread, at
most ``winner.NOISE_CAP``) with fewer changes from the defaults is where the moves start from (it is kept).

TPE learns which values are good on average; with a few dozen trials over ten parameters it often stops one change
short of a better configuration (a context cap one step lower, a GEMM dtype left at fp32). In its last
``refine_share`` of the time for trials (of the trials, with ``--n-trials``) the search therefore tries, from the
best configuration so far, the configurations that differ from it in one parameter, most promising first, and moves
to any that beats it (so it climbs). Every parameter gets a move before any gets a second one; within that, moves
are ordered by what the trials so far say of each value: the objective's mean over the trials that had it, against
the mean over those that had the best's value (a value no trial had yet counts as even). A move is skipped when its
configuration was already tried (or is running, or asked) or the target refuses it before running (its rules say
why). When every move from the best has been tried (a local optimum), the moves start from the next best
configuration, up to the third; after that the search goes back to TPE.
At any time, a trial for which TPE proposed a timed configuration again (recorded as a repeat, not run, or turned
away before it became a trial: ``sampling.suggest``) is followed by one such move, here and in the kernel search:
TPE's repeats say it has little new to propose, so the next ask goes to the best's neighbourhood instead. The kernel
search has no window: replayed on the H200 sweeps, one would add nothing to those moves (``benchmarks/results/tuner_efficiency/cpu/2026-11-30_d07928c_refine.md``).

A move is an enqueued Optuna trial (``tuner_refine_of`` = the trial it moves from), so local threads and ``tuner
worker`` processes of one study take them like any other trial.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import statistics
import threading
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from search_spaces import Param, ResolvedSpace
from tuner.search.sampling import params_key, suggestable
from tuner.search.winner import NOISE_CAP, changes_from, step_noise

if TYPE_CHECKING:
    from tuner.search.context import SearchContext

_logger = logging.getLogger(__name__)

REFINE_ATTR = "tuner_refine_of"
"""User attribute of a refinement trial: the number of the trial whose configuration it changes by one value."""

ORIGINS = 3
"""Configurations moves start from: the best, then (once every move from it was tried) the next best ones."""

ORDERED_TYPES = ("int", "pow2")
"""Numeric parameter types whose moves are one step down or up; a categorical may move to any other value."""


def in_window(ctx: SearchContext, reserve_s: float, done: int | None = None) -> bool:
    """True in the last ``refine_share`` of the time for trials (after ``reserve_s`` kept for confirmation), or,
    with ``--n-trials``, of those trials (``done`` of them run so far in this search)."""
    share = ctx.options.refine_share
    if share <= 0:
        return False
    if ctx.options.n_trials is not None and done is not None:
        return done >= math.ceil((1.0 - share) * ctx.options.n_trials)
    total = ctx.deadline.trials_end - ctx.deadline.start
    return ctx.deadline.remaining_for_trials() - reserve_s <= share * total


def moves(resolved: ResolvedSpace, params: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """``(param, new value, configuration)`` for every configuration one value away from ``params``. A changed
    parent brings its children in at their defaults (or drops them), as ``ResolvedSpace.walk`` builds them."""
    out = []
    for p in resolved.params:
        if p.name not in params or p.type == "float":
            continue
        for value in _alternatives(p, params[p.name]):
            wanted = {**params, p.name: value}
            cfg = resolved.walk(
                lambda q: wanted[q.name] if q.name in wanted and q.contains(wanted[q.name]) else q.default
            )
            out.append((p.name, value, cfg))
    return out


def undo_moves(
    resolved: ResolvedSpace, params: dict[str, Any], defaults: dict[str, Any]
) -> list[tuple[str, Any, dict[str, Any]]]:
    """``(param, default, configuration)`` for each parameter of ``params`` that differs from its default: that
    change undone alone (its children back at their defaults, as ``ResolvedSpace.walk`` builds them)."""
    out = []
    for p in resolved.params:
        if p.name not in params or p.name not in defaults or params[p.name] == defaults[p.name]:
            continue
        if not p.contains(defaults[p.name]):
            continue
        wanted = {**params, p.name: defaults[p.name]}
        cfg = resolved.walk(lambda q: wanted[q.name] if q.name in wanted and q.contains(wanted[q.name]) else q.default)
        out.append((p.name, defaults[p.name], cfg))
    return out


def _alternatives(p: Param, current: Any) -> list[Any]:
    choices = list(p.choices())
    if p.type in ORDERED_TYPES and current in choices:
        i = choices.index(current)
        return [choices[j] for j in (i - 1, i + 1) if 0 <= j < len(choices)]
    return [v for v in choices if v != current]


@dataclass(frozen=True)
class Move:
    origin: int
    """The trial whose configuration this changes."""
    param: str
    old: Any
    new: Any
    params: dict[str, Any]
    """The whole configuration after the change."""

    def __str__(self) -> str:
        return f"trial {self.origin} with {self.param} {self.old!r} -> {self.new!r}"


RECENT = 256
"""How far behind the newest trial a missing trial number is still waited for (:func:`stored_trials`)."""


class StoredTrials(dict):
    """``ctx.stored``: the stored trial records refining reads, by number (shared by the worker threads), with what
    keeps a read's cost to what changed: the numbers in order, the running ones, the complete prefix (every number up
    to it is held), every record put in the order it came (``changes``, which :class:`MoveIndex` follows), and the
    current :class:`MoveIndex`."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.numbers = sorted(self)
        self.running = {n for n, r in self.items() if r.state == "running"}
        self.prefix = -1
        self.changes: list[int] = list(self.numbers)
        self.index: MoveIndex | None = None
        self.lock = threading.RLock()

    def put(self, rec: Any) -> None:
        n = rec.number
        if n not in self:
            if not self.numbers or n > self.numbers[-1]:
                self.numbers.append(n)
            else:
                bisect.insort(self.numbers, n)
        self[n] = rec
        if rec.state == "running":
            self.running.add(n)
        else:
            self.running.discard(n)
        self.changes.append(n)

    def complete_prefix(self) -> int:
        """The highest number up to which every number is held (-1: not 0)."""
        while self.prefix + 1 in self:
            self.prefix += 1
        return self.prefix


def _stored(ctx: SearchContext) -> StoredTrials:
    if not isinstance(ctx.stored, StoredTrials):  # a plain dict (a context built by hand): indexed from now on
        ctx.stored = StoredTrials(ctx.stored)
    return ctx.stored


def refresh_stored(ctx: SearchContext) -> StoredTrials:
    """``ctx.stored`` brought up to date (see :func:`stored_trials`), at the cost of what changed."""
    cache = _stored(ctx)
    with cache.lock:
        if not cache:
            fresh = ctx.repo.list_trials(ctx.run.id)
        else:
            newest = cache.numbers[-1]
            above = max(cache.complete_prefix(), newest - RECENT)
            running = sorted(n for n in cache.running if n <= above)
            fresh = ctx.repo.trials_from(ctx.run.id, above, also=running)
        for r in fresh:
            if not _same(cache.get(r.number), r):  # a finished trial read again (above a gap) changes nothing
                cache.put(r)
    return cache


def _same(a: Any, b: Any) -> bool:
    """Whether two reads of a trial record say the same to refining."""
    return a is not None and all(
        getattr(a, f) == getattr(b, f) for f in ("state", "outcome", "value", "repeat_of", "params")
    )


def stored_trials(ctx: SearchContext) -> list:
    """Every stored trial of the search (every process's), read in full once and then only what changed, kept in
    ``ctx.stored`` (shared by the worker threads): a finished trial does not change, so each read asks for the trials
    above the cache's complete prefix (every number up to it is cached) and for those still running when last
    read. A number missing for more than :data:`RECENT` trials (an asked trial never stored, e.g. its worker died)
    stops holding the prefix back. Re-reading the whole study before every move cost a read of 20,000 rows per
    trial by the end of an 8-GPU night; re-reading the newest 256 was still a sizeable share of an 8-thread
    search's time (py-spy). (The moves read the records through :class:`MoveIndex`, not this list.)"""
    cache = refresh_stored(ctx)
    return [cache[n] for n in cache.numbers]


def _is_ok(r: Any) -> bool:
    """A measured result: ok, with a finite value, not a repeat (whose value is a copy, not a measurement)."""
    return r.outcome == "ok" and r.value is not None and math.isfinite(r.value) and r.repeat_of is None


class MoveIndex:
    """What :func:`choose_move` reads of the trial records, kept up to date record by record: the configurations
    tried (their keys), each configuration's best measured record (the origins, ranked), and the sums behind each
    (param, value)'s mean objective. Updating it costs the records that changed, not the study (rebuilding the
    keys and the means of 5,000 records before every move was most of an 8-thread search's time, py-spy). Its
    answers are those of the records read whole: the means are exact sums (integers in units of 2**-1100, which hold
    any finite float exactly) rounded once and divided, as ``statistics.fmean`` divides ``math.fsum``."""

    def __init__(self, resolved: ResolvedSpace, canonical: Callable[[dict], dict] | None, direction: str) -> None:
        self.resolved, self.canonical, self.direction = resolved, canonical, direction
        self.sign = 1.0 if direction == "maximize" else -1.0
        self.cursor = 0  # of StoredTrials.changes
        self.key_of: dict[int, str] = {}
        self.tried: dict[str, int] = {}  # key -> records with it
        self.ok: dict[int, Any] = {}  # number -> its ok record
        self.members: dict[str, set[int]] = {}  # key -> the ok records' numbers with it
        self.origin_of: dict[str, tuple[float, int]] = {}  # key -> (-sign * value, number) of its origin
        self.ranked: list[tuple[float, int]] = []  # the origins, best first (of equal values, the earlier trial)
        self.sums: dict[tuple[str, str], list] = {}  # (param, value) -> [n, sum of values, sum of their logs]
        self.not_positive = 0  # ok records whose value is <= 0 (then the means are of values, not logs)

    def fits(self, resolved: ResolvedSpace, canonical: Callable[[dict], dict] | None, direction: str) -> bool:
        return self.resolved is resolved and self.canonical == canonical and self.direction == direction

    def sync(self, stored: StoredTrials) -> MoveIndex:
        changes = stored.changes
        for n in changes[self.cursor :]:
            self._drop(n)
            self.add(stored[n])
        self.cursor = len(changes)
        return self

    def add(self, r: Any) -> None:
        key = _key(self.resolved, r.params, self.canonical)
        self.key_of[r.number] = key
        self.tried[key] = self.tried.get(key, 0) + 1
        if not _is_ok(r):
            return
        self.ok[r.number] = r
        self.members.setdefault(key, set()).add(r.number)
        here = (-self.sign * r.value, r.number)
        now = self.origin_of.get(key)
        if now is None or here < now:
            if now is not None:
                del self.ranked[bisect.bisect_left(self.ranked, now)]
            self.origin_of[key] = here
            bisect.insort(self.ranked, here)
        self._count(r, +1)

    def _drop(self, n: int) -> None:
        key = self.key_of.pop(n, None)
        if key is None:
            return
        self.tried[key] -= 1
        if not self.tried[key]:
            del self.tried[key]
        r = self.ok.pop(n, None)
        if r is None:
            return
        self._count(r, -1)
        self.members[key].discard(n)
        if self.origin_of[key][1] == n:  # its configuration's origin: the next best record with it, if any
            del self.ranked[bisect.bisect_left(self.ranked, self.origin_of.pop(key))]
            if self.members[key]:
                here = min((-self.sign * self.ok[m].value, m) for m in self.members[key])
                self.origin_of[key] = here
                bisect.insort(self.ranked, here)

    def _count(self, r: Any, step: int) -> None:
        positive = r.value > 0
        self.not_positive += 0 if positive else step
        value = step * _exact(r.value)
        log = step * _exact(math.log(r.value)) if positive else 0
        for name, v in r.params.items():
            s = self.sums.setdefault((name, _k(v)), [0, 0, 0])
            s[0] += step
            s[1] += value
            s[2] += log

    def scores(self) -> _Scores:
        return _Scores(self.sums, self.sign, self.not_positive == 0)

    def origins(self) -> Iterator[Any]:
        """The ok records, one per configuration (its best; of equal values the earlier), best first."""
        for _, n in self.ranked:
            yield self.ok[n]

    def best(self) -> Any | None:
        return self.ok[self.ranked[0][1]] if self.ranked else None


class _Scores:
    """:func:`_value_scores` of the ok records, as a read-only map computed per key on demand."""

    def __init__(self, sums: dict, sign: float, positive: bool) -> None:
        self.sums, self.sign, self.i = sums, sign, 2 if positive else 1

    def get(self, key: tuple[str, str], default: float | None = None) -> float | None:
        s = self.sums.get(key)
        if s is None or not s[0]:
            return default
        return self.sign * (s[self.i] / _ONE) / s[0]  # the exact sum rounded once (as math.fsum), then the mean


_EXACT_BITS = 1100
_ONE = 1 << _EXACT_BITS


def _exact(x: float) -> int:
    """``x`` as an integer number of 2**-1100 (exact for every finite float: the smallest is 2**-1074)."""
    n, d = float(x).as_integer_ratio()
    return n << (_EXACT_BITS + 1 - d.bit_length())


class _Tried:
    """Tried configurations: those of the records and those asked."""

    def __init__(self, tried: Container[str], asked: Container[str]) -> None:
        self.tried, self.asked = tried, asked

    def __contains__(self, key: object) -> bool:
        return key in self.tried or key in self.asked


def next_move(ctx: SearchContext) -> Move | None:
    """The most promising untried one-change move from the best ok configuration of the study (every process's
    trials, read from the store); once every move from it was tried (a local optimum), from the next best, up to
    ``ORIGINS`` configurations; ``None`` when all of theirs were tried."""
    stored = refresh_stored(ctx)
    same = ctx.target.canonical_params
    space = ctx.sampling_space  # inside the current stage's space (tuner.search.stages)
    with stored.lock:
        index = _synced_index(ctx, stored)
        best = index.best()
        rec = ctx.repo.get_trial(ctx.run.id, best.number) if best is not None else None
        noise = min(NOISE_CAP, step_noise(rec)) if rec is not None else 0.0  # the best's own step-time spread
        return choose_move(
            space,
            [],
            ctx.direction,
            ctx.target.check,
            asked=asked_keys(ctx.study, space, same),
            canonical=same,
            defaults=ctx.resolved.defaults(),
            noise=noise,
            index=index,
        )


def _synced_index(ctx: SearchContext, stored: StoredTrials) -> MoveIndex:
    """``stored``'s :class:`MoveIndex` over the current stage's space, brought up to date (``stored.lock`` held)."""
    space, same = ctx.sampling_space, ctx.target.canonical_params
    if stored.index is None or not stored.index.fits(space, same, ctx.direction):
        stored.index = MoveIndex(space, same, ctx.direction)
    return stored.index.sync(stored)


def open_moves(ctx: SearchContext) -> int:
    """The untried one-change moves from the best ok configuration so far, inside the current stage's space, that
    the target accepts: how many asks a new stage opens with (``tuner.search.stages.StagePlan.take_opening``)."""
    if ctx.options.refine_share <= 0:
        return 0
    stored = refresh_stored(ctx)
    same = ctx.target.canonical_params
    space = ctx.sampling_space
    with stored.lock:
        index = _synced_index(ctx, stored)
        best = index.best()
        if best is None:
            return 0
        tried = index.tried
        return sum(
            1
            for _, _, cfg in moves(space, best.params)
            if _key(space, cfg, same) not in tried and not ctx.target.check(cfg)
        )


def choose_move(
    resolved: ResolvedSpace,
    records: list,
    direction: str,
    check: Callable[[dict], str | None],
    asked: Container[str] = frozenset(),
    canonical: Callable[[dict], dict] | None = None,
    defaults: dict[str, Any] | None = None,
    noise: float = 0.0,
    *,
    index: MoveIndex | None = None,
) -> Move | None:
    """:func:`next_move` over given trial records (``number``, ``params``, ``outcome``, ``value``, ``reason``):
    ``check`` says why the target refuses a configuration (or returns nothing), ``asked`` holds the keys of
    configurations asked and not yet recorded; ``canonical`` (``Target.canonical_params``) makes a configuration
    that runs the same thing as a tried one tried too (no move goes there). With ``defaults``, a move first undoes
    one of the origin's changes, and the first origin is the configuration with the fewest changes among those
    within ``noise`` (relative) of the best. ``index``: the records as a :class:`MoveIndex` kept up to date (then
    ``records`` is not read)."""
    if index is None:
        index = MoveIndex(resolved, canonical, direction)
        for r in records:
            index.add(r)
    tried = _Tried(index.tried, asked)
    score = index.scores()
    sign = index.sign
    origins = index.origins()
    ranked = list(itertools.islice(origins, ORIGINS))
    if defaults is not None and ranked:
        top = ranked[0].value

        def tied(r: Any) -> bool:
            return sign * r.value >= sign * top - abs(top) * noise

        while tied(ranked[-1]) and (more := next(origins, None)) is not None:  # every tie, then ORIGINS more
            ranked.append(more)
        ranked += itertools.islice(origins, ORIGINS)
        simplest = min((r for r in ranked if tied(r)), key=lambda r: changes_from(r.params, defaults))
        ranked.remove(simplest)  # of equal changes, the better
        ranked.insert(0, simplest)
    for origin in ranked[:ORIGINS]:
        move = _move_from(resolved, check, origin, tried, score, canonical, defaults)
        if move is not None:
            return move
    return None


def _move_from(
    resolved: ResolvedSpace,
    check,
    origin,
    tried: Container[str],
    score,
    canonical=None,
    defaults: dict[str, Any] | None = None,
) -> Move | None:
    undo, seen = [], set()
    for name, value, cfg in undo_moves(resolved, origin.params, defaults or {}):
        seen.add(_key(resolved, cfg, canonical))
        if _key(resolved, cfg, canonical) not in tried:
            here = score.get((name, _k(origin.params.get(name))), 0.0)
            undo.append((score.get((name, _k(value)), here) - here, name, value, cfg))
    candidates, done = [], {}
    for name, value, cfg in moves(resolved, origin.params):
        key = _key(resolved, cfg, canonical)
        if key in seen and key not in tried:
            continue  # an undo move, ordered first
        if key in tried:
            done[name] = done.get(name, 0) + 1
            continue
        here = score.get((name, _k(origin.params.get(name))), 0.0)
        gain = score.get((name, _k(value)), here) - here  # a value no trial had yet: no evidence either way
        candidates.append((gain, name, value, cfg))
    for gain, name, value, cfg in sorted(undo, key=lambda c: -c[0]) + _order(candidates, done):
        why = check(cfg)
        if why:
            _logger.debug("refine: %s=%r from trial %d refused by the target: %s", name, value, origin.number, why)
            continue
        return Move(origin.number, name, origin.params.get(name), value, cfg)
    return None


def _key(resolved: ResolvedSpace, params: dict[str, Any], canonical: Callable[[dict], dict] | None = None) -> str:
    return params_key(suggestable(resolved, canonical(params) if canonical else params))


def asked_keys(study, resolved: ResolvedSpace, canonical: Callable[[dict], dict] | None = None) -> set[str]:
    """Keys of the configurations asked of Optuna and not yet in the store: enqueued and waiting, or taken by a worker
    that is still waiting for its GPUs (a move another worker enqueued a moment ago is not made twice)."""
    from optuna.trial import TrialState

    out = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        fixed = t.system_attrs.get("fixed_params") or {}
        out.add(_key(resolved, {**fixed, **t.params}, canonical))
    return out


def _order(candidates: list[tuple[float, str, Any, dict]], done: dict[str, int]) -> list[tuple[float, str, Any, dict]]:
    """Round by round: each parameter's most promising untried move, then each one's next, a parameter with ``done``
    moves from this best already tried joining that many rounds later; within a round, by gain. So a parameter with
    many values (the bucket lists) cannot use up the phase before every other one had a move, and the trials' means
    (confounded by what else each trial set) only order moves, never exclude one."""
    groups: dict[str, list] = {}
    for c in sorted(candidates, key=lambda c: -c[0]):  # stable: ties keep the space's declaration order
        groups.setdefault(c[1], []).append(c)
    ranked = [(done.get(name, 0) + i, c) for name, g in groups.items() for i, c in enumerate(g)]
    return [c for _, c in sorted(ranked, key=lambda rc: (rc[0], -rc[1][0]))]


def _k(value: Any) -> str:
    return repr(value)


def _value_scores(ok: list, sign: float) -> dict[tuple[str, str], float]:
    """Mean of ``sign * log(objective)`` (or of the value itself when not all positive) over the ok trials with
    each (param, value): the trials' own word on which values help."""
    positive = all(r.value > 0 for r in ok)
    by: dict[tuple[str, str], list[float]] = {}
    for r in ok:
        v = sign * (math.log(r.value) if positive else r.value)
        for name, value in r.params.items():
            by.setdefault((name, _k(value)), []).append(v)
    return {key: statistics.fmean(vals) for key, vals in by.items()}


def enqueue_next(ctx: SearchContext, progress=None) -> Move | None:
    """Enqueue the next move (the caller's ``study.ask()`` then takes it); ``None`` when there is none or refining
    is off (``refine_share`` 0)."""
    if ctx.options.refine_share <= 0:
        return None
    move = next_move(ctx)
    if move is None:
        return None
    ctx.study.enqueue_trial(suggestable(ctx.sampling_space, move.params), user_attrs={REFINE_ATTR: move.origin})
    _logger.info("refine: %s", move)
    if progress:
        progress.message(f"refining: {move}")
    return move
