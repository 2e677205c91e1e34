"""The trials this process runs, kept in memory by its Optuna storage: a running trial is read from the process
that writes it, not from the database.

Optuna's ``RDBStorage`` (under Optuna's own cache, which keeps finished trials only) reads a running trial back
from the database every time it is looked at: once per suggested parameter (``Trial._suggest`` reads the trial
before it writes the value), once per ``trial.user_attrs``, and every running trial of the study again at every
sampler call (TPE's constant liar). Each read is six queries (the trial and five ``selectin`` loads). With eight
worker threads at 2-s trials that was two thirds of the search process's time (py-spy at 8ed3c8a, 8 threads,
SQLite: 70% of the GIL held in SQLAlchemy), and the workers idled 70-80% waiting for it.

:class:`LocalTrialsMixin` keeps a copy of every trial this storage object created running or took from the
waiting queue, updated by every write this process makes to it, and hands it to Optuna's cache once it finished.
Every write goes to the database before the copy changes; a trial's suggested values are written together, in one
transaction, when ``tuner.search.sampling.suggest`` returns (:func:`flush_params`), before the trial runs.
Until then they can be taken back (:meth:`LocalTrialsMixin.drop_params`: the search turns a repeat proposal away
and samples again). ``get_trial`` of such a trial answers from the copy; the cache's re-read of unfinished trials
asks the database only which trials are new or unfinished (their ids) and loads in full only those this process does
not run. Trials other processes run (``tuner worker``) are read from the database as before. A trial another process
fails (a stale heartbeat) reads as running here until this process's next write to it, which the database refuses as
before.

:class:`IndexedCachedStorage` is Optuna's cache of the study with its reads indexed (see there).
"""

from __future__ import annotations

import bisect
import copy
import datetime
import json
import threading
from collections.abc import Container, Sequence
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.orm
from optuna import distributions
from optuna.distributions import BaseDistribution
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.dialects import postgresql, sqlite

MAX_LISTED = 500
"""Trials read by their ids at most; a read of more reads the whole study (SQLite limits a statement's values)."""
MAX_FINISHED_HERE = 4096
"""Trials this process finished and the cache has not read back yet, kept at most (the oldest go first)."""


class LocalTrialsMixin:
    """Mixed into an ``optuna.storages.RDBStorage`` subclass (before it): see the module's docstring."""

    def _local_init(self) -> None:
        self._local_lock = threading.Lock()
        self._local: dict[int, tuple[int, FrozenTrial]] = {}  # trial id -> (study id, the trial as written)
        self._pending: dict[int, list[tuple]] = {}  # trial id -> parameter writes not yet in the database
        self._pending_attrs: dict[int, dict[tuple[str, str], Any]] = {}  # trial id -> (user|system, key) -> value
        self._written: set[int] = set()  # running trials here with a parameter in the database (none can be dropped)
        self._finished_here: dict[int, tuple[int, FrozenTrial]] = {}  # finished here, not yet read back

    def _local_state(self) -> tuple[threading.Lock, dict[int, tuple[int, FrozenTrial]]]:
        if "_local" not in self.__dict__:  # also after unpickling
            self._local_init()
        return self._local_lock, self._local

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()  # type: ignore[misc]
        for key in ("_local_lock", "_local", "_pending", "_pending_attrs", "_written", "_finished_here"):
            state.pop(key, None)
        return state

    # -- what this process owns ------------------------------------------------------------------------------
    def local_trial_ids(self) -> set[int]:
        """The ids of the running trials this storage object answers from memory."""
        lock, local = self._local_state()
        with lock:
            return set(local)

    def _own(self, study_id: int, trial: FrozenTrial) -> None:
        lock, local = self._local_state()
        with lock:
            local[trial._trial_id] = (study_id, copy.deepcopy(trial))
            if trial.params:  # read from the database with them (a waiting trial's)
                self._written.add(trial._trial_id)

    def _update(self, trial_id: int, change) -> None:
        """Replace the trial's snapshot by a changed copy: a reader holding the old one never sees it change."""
        lock, local = self._local_state()
        with lock:
            entry = local.get(trial_id)
            if entry is not None:
                t = copy.copy(entry[1])
                change(t)
                local[trial_id] = (entry[0], t)

    def flush_params(self, trial_id: int) -> None:
        """Write the trial's parameters suggested and attributes set since the last write, in one transaction.
        Kept for the next flush if the write fails."""
        lock, _ = self._local_state()
        with lock:
            pending = self._pending.pop(trial_id, None)
            attrs = self._pending_attrs.pop(trial_id, None)
        if not pending and not attrs:
            return
        try:
            with _create_scoped_session(self.scoped_session, True) as session:  # type: ignore[attr-defined]
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
                self.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[attr-defined]
                session.add_all(
                    models.TrialParamModel(
                        trial_id=trial_id,
                        param_name=name,
                        param_value=value,
                        distribution_json=distributions.distribution_to_json(dist),
                    )
                    for name, value, dist in pending or ()
                )
                if attrs:
                    self._write_attrs(session, trial_id, attrs)
            if pending:
                with lock:
                    self._written.add(trial_id)
        except Exception:
            with lock:  # as they were, before any written since: a retry of the write finds them
                if pending:
                    self._pending[trial_id] = pending + self._pending.get(trial_id, [])
                if attrs:
                    self._pending_attrs[trial_id] = {**attrs, **self._pending_attrs.get(trial_id, {})}
            raise

    def drop_params(self, trial_id: int) -> bool:
        """Take back the parameters suggested to a trial this process runs, before any of them was written: its
        pending writes and the copy's parameters go, so its next suggestions are sampled anew (a proposal the search
        turns away: ``tuner.search.sampling.suggest``). False, and nothing changed, where one of them is already in
        the database (a flush, or the study's first value of a parameter, written at once) or the trial is not run
        here: the database would keep a configuration the trial no longer has."""
        lock, local = self._local_state()
        with lock:
            entry = local.get(trial_id)
            if entry is None or trial_id in self._written:
                return False
            self._pending.pop(trial_id, None)
            t = copy.copy(entry[1])  # a new snapshot (see :meth:`_update`)
            t.params, t.distributions = {}, {}
            local[trial_id] = (entry[0], t)
        return True

    def _write_attrs(self, session: sqlalchemy.orm.Session, trial_id: int, attrs: dict[tuple[str, str], Any]) -> None:
        """The user and system attributes in one statement per kind where the database can insert-or-update many
        rows at once (SQLite, PostgreSQL), else one by one as Optuna writes them."""
        dialect = self.engine.dialect.name  # type: ignore[attr-defined]
        for kind, model in (("user", models.TrialUserAttributeModel), ("system", models.TrialSystemAttributeModel)):
            rows = [
                {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                for (k, key), value in attrs.items()
                if k == kind
            ]
            if not rows:
                continue
            if dialect in ("sqlite", "postgresql"):
                stmt = (sqlite if dialect == "sqlite" else postgresql).insert(model).values(rows)
                stmt = stmt.on_conflict_do_update(
                    index_elements=["trial_id", "key"], set_={"value_json": stmt.excluded.value_json}
                )
                session.execute(stmt)
            else:
                for row in rows:
                    self._set_trial_attr_without_commit(  # type: ignore[attr-defined]
                        session, model, trial_id, row["key"], json.loads(row["value_json"])
                    )

    # -- writes: the database first, then the copy -----------------------------------------------------------
    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        frozen = super()._create_new_trial(study_id, template_trial)  # type: ignore[misc]
        if frozen.state == TrialState.RUNNING:
            self._own(study_id, frozen)
        return frozen

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        self.flush_params(trial_id)
        ok = super().set_trial_state_values(trial_id, state, values)  # type: ignore[misc]
        lock, local = self._local_state()
        if state == TrialState.RUNNING:
            if ok:  # this process took a waiting trial: read it once, then answer from memory
                trial = optuna.storages.RDBStorage.get_trial(self, trial_id)  # type: ignore[arg-type]
                self._own(self._study_of(trial_id), trial)
        elif state.is_finished():
            with lock:
                entry = local.pop(trial_id, None)
                self._written.discard(trial_id)
                if entry is not None and ok:  # as written: the cache's next read takes it from here
                    t = copy.copy(entry[1])
                    t.state, t.values, t.datetime_complete = (
                        state,
                        list(values) if values else None,
                        datetime.datetime.now(),
                    )
                    self._finished_here[trial_id] = (entry[0], t)
                    while len(self._finished_here) > MAX_FINISHED_HERE:
                        self._finished_here.pop(next(iter(self._finished_here)))
        elif state == TrialState.WAITING:
            with lock:
                local.pop(trial_id, None)
                self._written.discard(trial_id)
        return ok

    def _study_of(self, trial_id: int) -> int:
        with _create_scoped_session(self.scoped_session) as session:  # type: ignore[attr-defined]
            return models.TrialModel.find_or_raise_by_id(trial_id, session).study_id

    def _set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
        previous_distribution: BaseDistribution | None,
    ) -> None:
        lock, local = self._local_state()
        with lock:
            mine = trial_id in local
        if mine and previous_distribution is not None:  # checked now, written with the others (flush_params)
            distributions.check_distribution_compatibility(previous_distribution, distribution)
            with lock:
                self._pending.setdefault(trial_id, []).append((param_name, param_value_internal, distribution))
        else:  # the study's first value of this parameter (its distribution is checked against the database's)
            super()._set_trial_param(  # type: ignore[misc]
                trial_id, param_name, param_value_internal, distribution, previous_distribution
            )
            if mine:
                with lock:
                    self._written.add(trial_id)

        def change(t: FrozenTrial) -> None:
            t.params = {**t.params, param_name: distribution.to_external_repr(param_value_internal)}
            t.distributions = {**t.distributions, param_name: distribution}

        self._update(trial_id, change)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self.flush_params(trial_id)
        super().set_trial_intermediate_value(trial_id, step, intermediate_value)  # type: ignore[misc]
        self._merge(trial_id, "intermediate_values", step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        if not self._defer_attr(trial_id, "user", key, value):
            self.flush_params(trial_id)
            super().set_trial_user_attr(trial_id, key, value)  # type: ignore[misc]
        self._merge(trial_id, "user_attrs", key, _as_stored(value))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        if not self._defer_attr(trial_id, "system", key, value):
            self.flush_params(trial_id)
            super().set_trial_system_attr(trial_id, key, value)  # type: ignore[misc]
        self._merge(trial_id, "system_attrs", key, _as_stored(value))

    def _defer_attr(self, trial_id: int, kind: str, key: str, value: Any) -> bool:
        """Keep an attribute of a trial this process runs for its next write (:meth:`flush_params`: when its values
        are suggested, a value is reported, it finishes), where Optuna writes each in a transaction of its own (a
        trial's tag, its constant-liar proposal, its constraints, its outcome: six to eight per trial)."""
        lock, local = self._local_state()
        json.dumps(value)  # refused now, as Optuna's write would refuse it, not at the flush
        with lock:
            if trial_id not in local:
                return False
            self._pending_attrs.setdefault(trial_id, {})[(kind, key)] = value
        return True

    def _merge(self, trial_id: int, field: str, key: Any, value: Any) -> None:
        """The snapshot with ``key: value`` added to its dict ``field`` (a new dict: see :meth:`_update`)."""
        self._update(trial_id, lambda t: setattr(t, field, {**getattr(t, field), key: value}))

    # -- reads -----------------------------------------------------------------------------------------------
    def get_trial(self, trial_id: int) -> FrozenTrial:
        lock, local = self._local_state()
        with lock:
            entry = local.get(trial_id) or self._finished_here.get(trial_id)
            if entry is not None:
                return entry[1]  # a snapshot: writes replace it, never change it
        return super().get_trial(trial_id)  # type: ignore[misc]

    def _get_trials(
        self,
        study_id: int,
        states: Container[TrialState] | None,
        included_trial_ids: set[int],
        trial_id_greater_than: int,
    ) -> list[FrozenTrial]:
        lock, local = self._local_state()
        with lock:
            here = {tid for tid, (sid, _) in local.items() if sid == study_id}
            here |= {tid for tid, (sid, _) in self._finished_here.items() if sid == study_id}
        if not here:  # nothing of this study is known here
            return super()._get_trials(  # type: ignore[misc]
                study_id, states, included_trial_ids, trial_id_greater_than
            )
        included = {tid for tid in included_trial_ids if tid <= trial_id_greater_than}
        trial = models.TrialModel
        with _create_scoped_session(self.scoped_session) as session:  # type: ignore[attr-defined]
            # two index searches, not one OR of them: SQLite answers the OR by a pass over every trial of the study
            # (1.4 ms at 5,000 trials, several reads per trial); each half alone is a search of the primary key
            newer = sqlalchemy.select(trial.trial_id, trial.state).where(
                trial.study_id == study_id, trial.trial_id > trial_id_greater_than
            )
            if included:
                newer = sqlalchemy.union_all(
                    newer,
                    sqlalchemy.select(trial.trial_id, trial.state).where(
                        trial.trial_id.in_(included), trial.study_id == study_id
                    ),
                )
            rows = session.execute(newer).all()
        wanted = sorted({tid for tid, state in rows if states is None or state in states})
        found: dict[int, FrozenTrial] = {}
        with lock:  # the snapshots as they are now; a finished one is handed over once (the cache keeps it)
            for tid in wanted:
                entry = local.get(tid) or self._finished_here.pop(tid, None)
                if entry is not None:
                    found[tid] = entry[1]
        others = [tid for tid in wanted if tid not in found]
        if len(others) > MAX_LISTED:  # a first read of a large study: every trial, ours replaced by their snapshots
            for t in super()._get_trials(study_id, states, set(), -1):  # type: ignore[misc]
                found.setdefault(t._trial_id, t)
        elif others:  # other processes' trials (and waiting ones), and ours that finished between the two reads
            for t in self._read_whole(others):
                found.setdefault(t._trial_id, t)
        return [found[tid] for tid in sorted(found)]

    def _read_whole(self, trial_ids: list[int]) -> list[FrozenTrial]:
        """These trials read whole, by their ids (Optuna's own read of "these and the newer" is the OR above)."""
        orm = sqlalchemy.orm
        trial = models.TrialModel
        with _create_scoped_session(self.scoped_session) as session:  # type: ignore[attr-defined]
            rows = (
                session.query(trial)
                .options(orm.selectinload(trial.params))
                .options(orm.selectinload(trial.values))
                .options(orm.selectinload(trial.user_attributes))
                .options(orm.selectinload(trial.system_attributes))
                .options(orm.selectinload(trial.intermediate_values))
                .filter(trial.trial_id.in_(trial_ids))
                .order_by(trial.trial_id)
                .all()
            )
            return [self._build_frozen_trial_from_trial_model(t) for t in rows]  # type: ignore[attr-defined]


def _as_stored(value: Any) -> Any:
    """The value as the database gives it back (Optuna stores attributes as JSON: a tuple reads back a list)."""
    return json.loads(json.dumps(value))


def flush_params(study_storage: Any, trial_id: int) -> None:
    """Write a trial's suggested parameters now (``tuner.search.sampling.suggest`` calls it once per trial), where
    the study's storage defers them (:class:`LocalTrialsMixin` under Optuna's cache); nothing otherwise."""
    backend = getattr(study_storage, "_backend", study_storage)  # Optuna's cache wraps the RDBStorage
    flush = getattr(backend, "flush_params", None)
    if flush is not None:
        flush(trial_id)


def drop_params(study_storage: Any, trial_id: int) -> bool:
    """Take back a trial's suggested parameters before they are written (:meth:`LocalTrialsMixin.drop_params`);
    False where the storage cannot (it writes each one at once, or one is written already)."""
    backend = getattr(study_storage, "_backend", study_storage)
    drop = getattr(backend, "drop_params", None)
    return drop is not None and drop(trial_id)


class LocalTrialsRDBStorage(LocalTrialsMixin, optuna.storages.RDBStorage):
    """Optuna's ``RDBStorage`` answering this process's running trials from memory (:class:`LocalTrialsMixin`)."""


_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)


class IndexedCachedStorage(_CachedStorage):
    """Optuna's cache of a study's trials (``_CachedStorage``, which ``optuna.load_study`` puts over an
    ``RDBStorage``) whose reads cost what they return: it keeps the trial numbers in order and the unfinished ones
    apart, where Optuna's sorts every trial of the study at every read. The sampler, the pruner and ``study.ask``
    (the waiting queue) read the study several times per trial: at 3,000 trials those sorts were most of a trial's
    cost to the search process, and they grow with the study. Answers are the same lists Optuna's would be.

    It also keeps, per study, its finished trials in the order it learned they finished and how many trials it holds
    in each state: a reader that keeps what it read (the sampler's bounded history) asks only for the trials that
    finished since (:meth:`finished_since`), and the pruner for the most recent ones (:meth:`recent_trials`), where
    a whole-study list costs a pass over every trial (20,000 by the end of an 8-GPU night) at every read."""

    def __init__(self, backend: optuna.storages.RDBStorage) -> None:
        super().__init__(backend)
        self._order: dict[int, list[int]] = {}  # study id -> its trials' numbers, ascending
        self._open: dict[int, set[int]] = {}  # study id -> the numbers of its unfinished trials
        self._done: dict[int, list[FrozenTrial]] = {}  # study id -> its finished trials, in the order learned
        self._counts: dict[int, dict[TrialState, int]] = {}  # study id -> trials held per state
        self._recent: dict[tuple, tuple[int, list[FrozenTrial]]] = {}  # (study, states, k) -> (finished, answer)

    def _add_trials_to_cache(self, study_id: int, trials: list[FrozenTrial]) -> None:
        held = self._studies[study_id].trials
        done = self._done.setdefault(study_id, [])
        counts = self._counts.setdefault(study_id, dict.fromkeys(TrialState, 0))
        latest: dict[int, FrozenTrial] = {}
        for t in trials:  # before Optuna's cache replaces them: the state each trial had
            old = latest.get(t.number) or held.get(t.number)
            latest[t.number] = t
            if old is not None:
                counts[old.state] -= 1
            counts[t.state] += 1
            if t.state.is_finished() and (old is None or not old.state.is_finished()):
                done.append(t)
        super()._add_trials_to_cache(study_id, trials)  # under self._lock, as every caller holds it
        order = self._order.setdefault(study_id, [])
        unfinished = self._open.setdefault(study_id, set())
        for t in trials:
            n = t.number
            if not order or n > order[-1]:
                order.append(n)
            else:
                i = bisect.bisect_left(order, n)
                if i == len(order) or order[i] != n:
                    order.insert(i, n)
            if t.state.is_finished():
                unfinished.discard(n)
            else:
                unfinished.add(n)

    def delete_study(self, study_id: int) -> None:
        with self._lock:
            for index in (self._order, self._open, self._done, self._counts):
                index.pop(study_id, None)
            self._recent = {k: v for k, v in self._recent.items() if k[0] != study_id}
        super().delete_study(study_id)

    def refresh(self, study_id: int) -> None:
        """Read what changed in the study since the last read (the trials new or unfinished then), as every read of
        Optuna's cache does first."""
        self._read_trials_from_remote_storage(study_id)

    def finished_since(
        self, study_id: int, cursor: int, states: Container[TrialState] | None = None
    ) -> tuple[list[FrozenTrial], int, int, list[FrozenTrial]]:
        """What a reader that has seen the first ``cursor`` finished trials (in the order this cache learned of them)
        lacks, read at one moment, without reading the database (:meth:`refresh` does): the trials that finished
        since, the cursor past them, how many trials are in ``states`` (every state: ``None``), and the unfinished
        ones in ``states``, by number. Costs what it returns, whatever the study's size."""
        with self._lock:
            done = self._done.get(study_id, [])
            counts = self._counts.get(study_id, {})
            n = sum(counts.values()) if states is None else sum(counts.get(s, 0) for s in TrialState if s in states)
            trials = self._studies[study_id].trials if study_id in self._studies else {}
            running = [
                trials[k] for k in sorted(self._open.get(study_id, ())) if states is None or trials[k].state in states
            ]
            return done[cursor:], len(done), n, running

    def state_counts(self, study_id: int) -> dict[TrialState, int]:
        """How many of the study's trials are in each state (read from the database first, as every read)."""
        self._read_trials_from_remote_storage(study_id)
        with self._lock:
            return {**dict.fromkeys(TrialState, 0), **self._counts.get(study_id, {})}

    def recent_trials(self, study_id: int, states: Container[TrialState], k: int) -> list[FrozenTrial]:
        """The ``k`` highest-numbered trials in ``states`` (finished states only), by number: what
        ``get_all_trials(states=states)[-k:]`` answers, at the cost of those ``k`` (and the trials of other states
        among them), once per trial that finished."""
        if any(not s.is_finished() for s in TrialState if s in states):
            raise ValueError(f"`states` must be finished states, but got {states}.")
        self._read_trials_from_remote_storage(study_id)
        key = (study_id, tuple(s for s in TrialState if s in states), k)
        with self._lock:
            finished = len(self._done.get(study_id, ()))
            memo = self._recent.get(key)
            if memo is not None and memo[0] == finished:  # no trial finished since: the same answer
                return list(memo[1])
            trials = self._studies[study_id].trials
            out: list[FrozenTrial] = []
            for n in reversed(self._order.get(study_id, ())):
                if len(out) >= k:
                    break
                if trials[n].state in states:
                    out.append(trials[n])
            out.reverse()
            self._recent[key] = (finished, out)
            return list(out)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        self._read_trials_from_remote_storage(study_id)
        with self._lock:
            trials = self._studies[study_id].trials
            if states is not None and not any(s in states for s in TrialState if s not in _UNFINISHED):
                numbers: Any = sorted(self._open.get(study_id, ()))  # only unfinished ones asked: few
            else:
                numbers = self._order.get(study_id, ())
            out = [trials[n] for n in numbers if states is None or trials[n].state in states]
        return copy.deepcopy(out) if deepcopy else out


def cached(storage: Any) -> Any:
    """What a study opened on ``storage`` should read through: :class:`IndexedCachedStorage` over an
    ``RDBStorage`` (Optuna would put its own cache there), anything else as it is."""
    if isinstance(storage, optuna.storages.RDBStorage):
        return IndexedCachedStorage(storage)
    return storage
