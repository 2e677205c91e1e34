"""How trials are sampled: the sampler and pruner every process of a study uses, the constraints that teach the
sampler from failures, and a resolved space turned into Optuna suggestions (define-by-run: conditional parameters
only when active)."""

from __future__ import annotations

import bisect
import copy
import json
import logging
import math
import threading
import warnings
from collections.abc import Callable, Container
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from search_spaces import Param, ResolvedSpace
from tuner.search.local_trials import drop_params, flush_params

_logger = logging.getLogger(__name__)


MAX_TURNED_AWAY = 8
"""Proposals of one trial turned away as repeats at most; the next one stands, a repeat or not (so a spent space still
ends in repeats recorded in a row: ``tuner.search.context.MAX_REPEATS_IN_A_ROW``)."""
TURNED_AWAY_ATTR = "turned_away"
"""User attribute of a trial: how many of its proposals were turned away as repeats of timed configurations."""


def suggest(
    trial: optuna.Trial,
    resolved: ResolvedSpace,
    *,
    repeat_of: Callable[[dict[str, Any]], int | None] | None = None,
) -> dict[str, Any]:
    """Sample one configuration: every active parameter in declaration order, fixed ones at their value; the
    values are in the study's storage when it returns (one write for all where the storage defers them).

    ``repeat_of`` (a plainly sampled trial's: the earlier trial whose configuration a proposal repeats, or None):
    a proposal that repeats a timed configuration is turned away before it is written and sampled again, at most
    :data:`MAX_TURNED_AWAY` times (the count in the trial's :data:`TURNED_AWAY_ATTR`). Why: a repeat recorded as a
    trial costs a worker a whole ask, write and tell for nothing, and telling TPE the copied value again weighs that
    point more, so it proposes it again (issue 48: 30% of a 20,000-trial search). Where the storage writes values
    at once, or they are written already (a second call on the same trial returns what the first settled), the
    proposal stands as before."""

    def choose(p: Param) -> Any:
        if p.type == "float":
            return trial.suggest_float(p.name, p.low, p.high, log=p.log, step=None if p.log else p.step)
        if p.type == "int" and not p.values:
            return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        return trial.suggest_categorical(p.name, list(p.choices()))

    params = resolved.walk(choose)
    turned = 0
    while repeat_of is not None and resolved.params and turned < MAX_TURNED_AWAY:
        earlier = repeat_of(params)
        if earlier is None or not discard_proposal(trial):
            break
        turned += 1
        _logger.debug(
            "trial %d: proposal %d turned away, a repeat of trial %d's configuration; sampled again",
            trial.number,
            turned,
            earlier,
        )
        params = resolved.walk(choose)
    if turned:
        trial.set_user_attr(TURNED_AWAY_ATTR, turned)  # written with the values, where the storage defers them
    flush_params(trial.storage, trial._trial_id)
    return params


def discard_proposal(trial: optuna.Trial) -> bool:
    """Forget what ``trial`` was suggested, in the storage (:func:`~tuner.search.local_trials.drop_params`) and in
    the ``Trial`` object, so its next suggestions are sampled anew; False (nothing changed) where the storage cannot
    take them back. The ``Trial`` keeps its proposal in private fields of Optuna 5.1 (the sampler's joint proposal,
    ``_relative_params``, and its search space, computed again when it is None; the trial as last read,
    ``_cached_frozen_trial``, whose parameters ``Trial._suggest`` returns without sampling):
    ``tests/tuner/test_sampling_turn_away.py`` checks them at every upgrade."""
    if not drop_params(trial.storage, trial._trial_id):
        return False
    frozen = copy.copy(trial._cached_frozen_trial)  # a new object: another reader may hold the old one
    frozen.params, frozen.distributions = {}, {}
    trial._cached_frozen_trial = frozen
    trial._relative_params = None
    trial.relative_search_space = None
    return True


def suggestable(resolved: ResolvedSpace, params: dict[str, Any]) -> dict[str, Any]:
    """The part of ``params`` that Optuna samples (for ``enqueue_trial``): no fixed or dropped parameters."""
    active = {p.name for p in resolved.params}
    return {k: v for k, v in params.items() if k in active}


def params_key(params: dict[str, Any]) -> str:
    """A stable identity of a configuration, for finding repeats."""
    return json.dumps(params, sort_keys=True, default=str)


_HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5; constraints_func before


HISTORY_CAP = 500
"""Finished trials the sampler's estimators see at most (see :class:`BoundedTPESampler`). A trial's whole cost to the
search process grows with the history TPE reads (``benchmarks/results/search_overhead/cpu/``: 500 and 1,000 trials
in the study, side by side); eight worker threads share one interpreter, so that cost is what keeps them waiting."""
HISTORY_BEST = 100
"""Of those, the best ones (TPE's "good" group is at most 25 of them), the rest the most recent."""


class BoundedTPESampler(optuna.samplers.TPESampler):
    """Optuna's TPE, whose estimators see at most ``history_cap`` finished trials: every one until the study holds
    that many, then the ``history_best`` best (feasible by value first, then pruned, then infeasible by violation:
    the order TPE splits them in) and the most recent others, plus the running ones the constant liar needs.

    Why: TPE builds its two estimators from every trial at every ask, so an ask costs time in proportion to the
    study (2,000 trials: ~45 ms on two cores, growing faster than linearly with the liar) and a 20,000-trial
    search would spend a second per trial sampling. Past ``history_cap`` trials the "good" estimator is unchanged
    (TPE's good group is the best ``min(25, 10%)``, all kept) and the "bad" one is estimated from recent trials,
    which TPE already weighs most; the cost of an ask stays what it was at ``history_cap``.
    Single-objective studies only; a multi-objective study sees its whole history.

    What Optuna recomputes from every trial of that history at every ask, and at every parameter group of it, this
    sampler computes once per finished trial and keeps (a finished trial never changes): its place in the split into
    good and bad trials (:meth:`_split`) and its parameters in TPE's internal form (:meth:`_get_internal_repr`).
    The estimators get the same numbers, so the proposals are Optuna's (``tests/tuner/test_sampling_history.py``);
    these override private methods of ``TPESampler`` (Optuna 5.1), which those tests check at every upgrade."""

    def __init__(
        self, *args: Any, history_cap: int = HISTORY_CAP, history_best: int = HISTORY_BEST, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if not 0 < history_best < history_cap:
            raise ValueError(f"`0 < history_best < history_cap` must hold, but got ({history_best=}, {history_cap=}).")
        self.history_cap, self.history_best = history_cap, history_best
        self._lock = threading.Lock()
        self._study_id: int | None = None
        self._finished: dict[int, FrozenTrial] = {}
        self._numbers: list[int] = []  # of the finished trials, sorted
        self._best: list[tuple[tuple, int]] = []  # (rank key, number), sorted, at most history_best
        self._grouped: set[int] = set()  # trials the grouped search space has seen
        self._cursors: dict[tuple[int, str], tuple[Any, int]] = {}  # (storage id, reader) -> (storage, finished read)
        self._split_keys: dict[int, tuple] = {}  # finished trial number -> its place in TPE's split (see _split)
        self._rows: dict[tuple, dict[int, tuple | None]] = {}  # search space -> trial number -> internal values

    def infer_relative_search_space(self, study, trial):
        # the grouped search space is refined trial by trial and never coarsened; Optuna re-feeds it every trial
        # of the study at every ask (O(study)); fed only the trials it has not seen, it comes out the same
        return super().infer_relative_search_space(_HistoryView(study, self, unseen_only=True), trial)

    def sample_relative(self, study, trial, search_space):
        return super().sample_relative(_HistoryView(study, self), trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return super().sample_independent(_HistoryView(study, self), trial, param_name, param_distribution)

    def _sample(self, study, trial, search_space):
        """Optuna's ``TPESampler._sample`` (one parameter group: split the history, two estimators, the best of
        the candidates), with the split and the estimators' inputs taken from what this sampler keeps per finished
        trial (:meth:`_split`, :meth:`_get_internal_repr`) instead of recomputed from every trial at every call;
        the same numbers, so the same proposals. A multi-objective study: Optuna's own."""
        if study._is_multi_objective():
            return super()._sample(study, trial, search_space)
        states = (TrialState.COMPLETE, TrialState.PRUNED) + ((TrialState.RUNNING,) if self._constant_liar else ())
        trials = study._get_trials(deepcopy=False, states=states, use_cache=not self._constant_liar)
        if self._constant_liar:
            trials = [t for t in trials if t.number != trial.number]
        if self._gamma is None:
            self._gamma = _default_gamma
        n = sum(t.state != TrialState.RUNNING for t in trials)
        below, above = self._split(study, trials, self._gamma(n))
        mpe_below = self._build_parzen_estimator(study, search_space, below, handle_below=True)
        mpe_above = self._build_parzen_estimator(study, search_space, above, handle_below=False)
        samples = mpe_below.sample(self._rng.rng, self._n_ei_candidates)
        best = self._compare(samples, self._compute_acquisition_func(samples, mpe_below, mpe_above))
        return {name: dist.to_external_repr(best[name]) for name, dist in search_space.items()}

    def _split(
        self, study: Any, trials: list[FrozenTrial], n_below: int
    ) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
        """TPE's good (``n_below`` best) and bad trials of ``trials`` (single objective), as Optuna's
        ``_split_trials`` splits them: feasible complete ones by value, then pruned ones by their last step and
        value, then infeasible ones by violation, ties in the given order; running trials are bad. Each finished
        trial's place is computed once (a finished trial never changes); through a :class:`_HistoryView` (one
        sampler call, two to three parameter groups over the same history) the split is made once."""
        splits = study.__dict__.get("_splits") if isinstance(study, _HistoryView) else None
        key = (n_below, tuple(t.number for t in trials))
        if splits is not None and key in splits:
            return splits[key]
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        with self._lock:
            self._reset_for(study)
            keys = self._split_keys
            ranked, running = [], []
            for i, t in enumerate(trials):
                if t.state == TrialState.RUNNING:
                    running.append(t)
                    continue
                k = keys.get(t.number)
                if k is None:
                    k = keys[t.number] = _split_key(t, sign)
                ranked.append((k, i))
        ranked.sort()
        below = sorted((trials[i] for _, i in ranked[:n_below]), key=lambda t: t.number)
        above = sorted([trials[i] for _, i in ranked[n_below:]] + running, key=lambda t: t.number)
        if splits is not None:
            splits[key] = (below, above)
        return below, above

    def _get_internal_repr(
        self, trials: list[FrozenTrial], search_space: dict[str, Any], study: Any
    ) -> dict[str, np.ndarray]:
        """Optuna's: each parameter of ``search_space`` over the trials that have all of them, in its internal
        representation; a finished trial's values computed once per search space, not at every sampler call."""
        if study._is_multi_objective():
            return super()._get_internal_repr(trials, search_space, study)
        names = tuple(search_space)
        with self._lock:
            self._reset_for(study)
            cache = self._rows.setdefault(tuple(search_space.items()), {})
        rows = []
        for t in trials:
            finished = t.state.is_finished()
            row = cache.get(t.number, False) if finished else False
            if row is False:
                params = self._get_params(t, study)
                row = (
                    tuple(d.to_internal_repr(params[name]) for name, d in search_space.items())
                    if search_space.keys() <= params.keys()
                    else None
                )
                if finished:
                    cache[t.number] = row
            if row is not None:
                rows.append(row)
        columns = list(zip(*rows)) if rows else [() for _ in names]
        return {name: np.asarray(list(col)) for name, col in zip(names, columns)}

    def unseen(self, study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """Of ``trials`` (finished ones), those the grouped search space has not been fed yet; marks them fed."""
        with self._lock:
            self._reset_for(study)
            new = [t for t in trials if t.number not in self._grouped]
            self._grouped.update(t.number for t in new)
        return new

    def _reset_for(self, study: optuna.Study) -> None:
        if self._study_id != study._study_id:
            self._study_id, self._finished, self._numbers, self._best = study._study_id, {}, [], []
            self._grouped, self._cursors = set(), {}
            self._split_keys, self._rows = {}, {}

    def bounded(self, study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """``trials`` as the estimators see them (see the class docstring); in trial-number order."""
        if study._is_multi_objective() or len(trials) <= self.history_cap:
            return trials
        with self._lock:
            self._reset_for(study)
            self._feed(study, trials)
            out = self._kept()
        return out + [t for t in trials if t.state == TrialState.RUNNING]

    def _feed(self, study: optuna.Study, trials: list[FrozenTrial]) -> None:
        """Take the finished (complete, pruned) ones of ``trials`` not taken yet into the history (under the lock)."""
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        for t in trials:
            if t.number not in self._finished and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                self._finished[t.number] = t
                if not self._numbers or t.number > self._numbers[-1]:
                    self._numbers.append(t.number)
                else:
                    bisect.insort(self._numbers, t.number)
                bisect.insort(self._best, (_rank(t, sign), t.number))
                del self._best[self.history_best :]

    def _kept(self) -> list[FrozenTrial]:
        """The history kept: the best and the most recent, ``history_cap`` at most, by number (under the lock)."""
        keep = {n for _, n in self._best}
        for n in reversed(self._numbers):
            if len(keep) >= self.history_cap:
                break
            keep.add(n)
        return [self._finished[n] for n in sorted(keep)]

    def _since(self, study: optuna.Study, reader: str, states: Container[TrialState] | None) -> tuple:
        """From an indexed storage (``tuner.search.local_trials.IndexedCachedStorage``): the trials that finished
        since ``reader`` last asked this storage, and its count and unfinished trials in ``states`` (under the
        lock). Another storage (a second study object on the same study) is read from its start once."""
        storage = study._storage
        key = (id(storage), reader)
        held, cursor = self._cursors.get(key, (None, 0))
        if held is not storage:
            cursor = 0
        new, cursor, n, unfinished = storage.finished_since(study._study_id, cursor, states)
        self._cursors[key] = (storage, cursor)
        return new, n, unfinished

    def bounded_read(
        self, study: optuna.Study, states: Container[TrialState] | None, *, refresh: bool = True
    ) -> list[FrozenTrial] | None:
        """What :meth:`bounded` answers for the study's trials in ``states``, read from an indexed storage at the
        cost of the trials that finished since the last read (the study's size does not count); ``None`` where
        that does not apply (another storage, a multi-objective study, a study under the cap): read it whole."""
        storage = study._storage
        if not hasattr(storage, "finished_since") or study._is_multi_objective():
            return None
        if refresh:
            storage.refresh(study._study_id)  # the database read, outside the lock
        with self._lock:
            self._reset_for(study)
            new, n, unfinished = self._since(study, "bounded", states)
            self._feed(study, new)
            if n <= self.history_cap:
                return None
            out = self._kept()
        if states is not None:  # as ``bounded`` keeps them: of the finished ones, those the read asked for
            out = [t for t in out if t.state in states]
        return out + [t for t in unfinished if t.state == TrialState.RUNNING]

    def unseen_read(self, study: optuna.Study, states: Container[TrialState] | None) -> list[FrozenTrial] | None:
        """What :meth:`unseen` answers for the study's trials in ``states``, read from an indexed storage at the
        cost of the trials that finished since the last read; ``None`` where the storage is not indexed."""
        storage = study._storage
        if not hasattr(storage, "finished_since"):
            return None
        storage.refresh(study._study_id)
        with self._lock:
            self._reset_for(study)
            new, _, _ = self._since(study, "unseen", states)
            fresh = [t for t in new if (states is None or t.state in states) and t.number not in self._grouped]
            self._grouped.update(t.number for t in fresh)
        return fresh


def _rank(t: FrozenTrial, sign: float) -> tuple:
    """How TPE orders finished trials from best to worst (``optuna.samplers._tpe.sampler._split_trials``)."""
    values = t.constraints.values() if _HAS_SET_CONSTRAINT else t.system_attrs.get("constraints", ())
    violation = sum(c for c in values or () if c > 0)
    if violation > 0:
        return (2, violation)
    if t.state == TrialState.COMPLETE:
        return (0, sign * float(t.value))
    return (1, -(t.last_step if t.last_step is not None else -1))


def _default_gamma(n: int) -> int:
    """Optuna's ``default_gamma``: how many of ``n`` finished trials TPE calls good (single objective)."""
    return min(math.ceil(0.1 * n), 25)


def _split_key(t: FrozenTrial, sign: float) -> tuple:
    """A finished trial's place in TPE's split (Optuna's ``_split_trials`` and its scores): lower is better."""
    values = t.constraints.values() if _HAS_SET_CONSTRAINT else t.system_attrs.get("constraints", ())
    violation = sum(v for v in values or () if v > 0)
    if violation > 0:
        return (2, violation)
    if t.state == TrialState.COMPLETE:
        return (0, sign * float(t.value))
    if not t.intermediate_values:
        return (1, 1, 0.0)
    step, value = max(t.intermediate_values.items())
    return (1, -step, math.inf if math.isnan(value) else sign * value)


class _HistoryView:
    """A study as :class:`BoundedTPESampler`'s estimators see it: its trials bounded, everything else its own."""

    def __init__(self, study: optuna.Study, sampler: BoundedTPESampler, *, unseen_only: bool = False) -> None:
        self._study, self._sampler, self._unseen_only = study, sampler, unseen_only
        self._read: dict[tuple, list[FrozenTrial]] = {}
        self._splits: dict[tuple, tuple[list[FrozenTrial], list[FrozenTrial]]] = {}  # see BoundedTPESampler._split

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        # one view serves one sampler call: TPE reads the history once per parameter group and once more for the
        # constraints; the study read once is what each of those reads saw (a trial finishing meanwhile waits for
        # the next ask, as it would a moment later)
        # Read from an indexed storage, the view costs what finished since the last ask, not the study's size
        # (a pass over every trial, twice, at every ask: 20,000 by the end of an 8-GPU night).
        key = (deepcopy, tuple(sorted(states, key=lambda s: s.value)) if states is not None else None, use_cache)
        if self._unseen_only and not deepcopy:
            fresh = self._sampler.unseen_read(self._study, states)
            if fresh is not None:
                return fresh
        if self._unseen_only or deepcopy or key not in self._read:
            if not self._unseen_only and not deepcopy:  # the database read once per view (per sampler call)
                bounded = self._sampler.bounded_read(self._study, states, refresh=not self._read)
                if bounded is not None:
                    self._read[key] = bounded
                    return list(bounded)
            trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
            if self._unseen_only:
                return self._sampler.unseen(self._study, trials)
            if deepcopy:
                return self._sampler.bounded(self._study, trials)
            self._read[key] = self._sampler.bounded(self._study, trials)
        return list(self._read[key])

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=deepcopy, states=states)


def make_sampler(resolved: ResolvedSpace, seed: int | None, *, parallel: bool = True) -> optuna.samplers.BaseSampler:
    """The sampler every process of a study uses: multivariate TPE grouped for conditional parameters, learning
    from failures through constraints; with several workers (``parallel``) a constant liar keeps them apart (it
    costs about a third more sampling time, so a single worker goes without); its view of history bounded past
    :data:`HISTORY_CAP` trials (:class:`BoundedTPESampler`), so an ask costs the same at 20,000 trials as at
    1,000."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return BoundedTPESampler(
        seed=seed,
        multivariate=True,
        group=True,
        constant_liar=parallel,
        n_startup_trials=max(5, min(10, len(resolved.params) + 2)),
        **({} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_of}),
    )


PRUNER_RECENT = 1000
"""Completed trials the pruner's percentile is taken over at most: the most recent ones."""


class RecentPercentilePruner(optuna.pruners.PercentilePruner):
    """Optuna's percentile pruner over the ``recent`` most recently numbered completed trials: Optuna's takes the
    percentile over every completed trial at every report, a cost that grows with the study (a 20,000-trial
    night), and the search's recent trials are the ones a new trial competes with."""

    def __init__(self, *args: Any, recent: int = PRUNER_RECENT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recent = recent

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return super().prune(_RecentView(study, self.recent), trial)


class _RecentView:
    """A study whose completed trials are its ``recent`` most recent ones (for :class:`RecentPercentilePruner`)."""

    def __init__(self, study: optuna.Study, recent: int) -> None:
        self._study, self._recent = study, recent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        storage = self._study._storage
        if (
            not deepcopy
            and states is not None
            and self._recent > 0
            and hasattr(storage, "recent_trials")
            and all(s.is_finished() for s in TrialState if s in states)
        ):  # the most recent only, not a list of the whole study first
            return storage.recent_trials(self._study._study_id, states, self._recent)
        return self._study.get_trials(deepcopy=deepcopy, states=states)[-self._recent :]


def make_pruner() -> optuna.pruners.BasePruner:
    # keep the top 90% at each level: prune only a clearly bad trial, after the first level (c=1 says little)
    return RecentPercentilePruner(90.0, n_startup_trials=5, n_warmup_steps=1)


def _constraints_of(frozen: optuna.trial.FrozenTrial) -> list[float]:
    return list(frozen.user_attrs.get("constraints", [0.0]))


def set_constraints(trial: optuna.Trial, values: list[float]) -> None:
    """Feasibility for the sampler: every value <= 0 is feasible. Kept in user attrs for the API as well."""
    trial.set_user_attr("constraints", values)
    if _HAS_SET_CONSTRAINT:
        for i, v in enumerate(values):
            trial.set_constraint(f"c{i}", v)
