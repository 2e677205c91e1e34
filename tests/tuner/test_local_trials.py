"""The storage answers the trials this process runs from memory (tuner.search.local_trials): the reads a trial's
own suggestions and attributes make cost no query, what it writes still reaches the database first, and trials
another process runs are read from the database as before."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from tuner.search.context import open_optuna_storage
from tuner.search.heartbeat import open_worker_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Queries:
    """Counts the SQL statements an engine runs; ``reads``: those loading a whole trial (its attributes, values
    and intermediate values are loaded only by a whole trial's read)."""

    WHOLE = ("trial_user_attributes", "trial_system_attributes", "trial_values", "trial_intermediate_values")

    def __init__(self, engine) -> None:
        self.statements: list[str] = []
        sqlalchemy.event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, conn, cursor, statement, *args) -> None:
        self.statements.append(statement)

    @property
    def n(self) -> int:
        return len(self.statements)

    @property
    def reads(self) -> int:
        return sum(
            s.lstrip().startswith("SELECT") and any(f"FROM {w} " in s for w in self.WHOLE) for s in self.statements
        )

    @property
    def inserts(self) -> int:
        return sum(s.lstrip().startswith("INSERT") for s in self.statements)


def _suggest(trial: optuna.Trial) -> dict:
    return {f"p{i}": trial.suggest_categorical(f"p{i}", [1, 2, 3, 4]) for i in range(8)}


@pytest.fixture(params=["search", "worker"])
def storage(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    return open_optuna_storage(url) if request.param == "search" else open_worker_storage(url)


def test_a_running_trial_is_read_from_memory_and_its_writes_reach_the_database(storage):
    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    params = _suggest(trial)
    trial.set_user_attr("worker", "w0")
    trial.report(1.5, 0)
    q = Queries(storage.engine)
    assert _suggest(trial) == params  # the values already drawn, read back
    assert trial.user_attrs == {"worker": "w0"}
    assert trial.params == params
    assert q.n == 0
    # the database holds every write: a fresh storage object reads the same running trial
    other = optuna.storages.RDBStorage(storage.url)
    frozen = other.get_trial(trial._trial_id)
    assert frozen.state == TrialState.RUNNING and frozen.params == params
    assert frozen.user_attrs == {"worker": "w0"} and frozen.intermediate_values == {0: 1.5}
    assert storage.get_trial(trial._trial_id) == frozen
    study.tell(trial, 2.0)
    assert trial._trial_id not in storage.local_trial_ids()
    assert study.trials[0].value == 2.0 and study.trials[0].params == params


def test_the_sampler_sees_this_process_s_running_trials_and_another_process_s_from_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    here = open_worker_storage(url)
    there = open_worker_storage(url)
    study = optuna.create_study(study_name="s", storage=here)
    theirs = optuna.load_study(study_name="s", storage=there).ask()
    their_params = _suggest(theirs)
    mine = study.ask()
    my_params = _suggest(mine)
    assert here.local_trial_ids() == {mine._trial_id}
    q = Queries(here.engine)
    seen = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    assert seen[theirs.number].params == their_params and seen[mine.number].params == my_params
    # one query for which trials are new or unfinished, then the other process's trial whole (the trial and its
    # five parts); this process's own trial costs none
    assert q.n == 1 + 6 and q.reads == 4
    # the other process writes (an attribute goes with its next write to the database): the next read sees it
    theirs.set_user_attr("k", 1)
    theirs.report(0.5, 0)
    seen = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    assert seen[theirs.number].user_attrs == {"k": 1}


def test_a_waiting_trial_this_process_takes_is_answered_from_memory(storage):
    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({f"p{i}": 1 for i in range(8)}, user_attrs={"baseline": True})
    trial = study.ask()
    assert trial._trial_id in storage.local_trial_ids()
    q = Queries(storage.engine)
    assert _suggest(trial) == {f"p{i}": 1 for i in range(8)}
    assert trial.user_attrs == {"baseline": True}
    assert q.reads == 0 and q.inserts == 8  # one write per value (the fixed ones are written when suggested)
    study.tell(trial, state=TrialState.FAIL)
    assert storage.local_trial_ids() == set()
    assert storage.get_trial(trial._trial_id).state == TrialState.FAIL


def test_a_trial_another_process_failed_as_stale_refuses_this_process_s_next_write(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    here = open_worker_storage(url)
    study = optuna.create_study(study_name="s", storage=here)
    trial = study.ask()
    _suggest(trial)
    optuna.storages.RDBStorage(url).set_trial_state_values(trial._trial_id, TrialState.FAIL)
    trial.set_user_attr("k", 1)  # kept for the trial's next write to the database
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        study.tell(trial, 1.0)


def test_a_trial_s_values_reach_the_database_in_one_write_when_suggest_returns(storage):
    from tuner.search.local_trials import flush_params

    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    first = study.ask()
    _suggest(first)  # the study's first value of each parameter is written at once (checked against the database)
    study.tell(first, 1.0)
    trial = study.ask()
    q = Queries(storage.engine)
    params = _suggest(trial)
    assert q.n == 0  # deferred: the distributions were checked against the first trial's
    fresh = optuna.storages.RDBStorage(storage.url)
    assert fresh.get_trial(trial._trial_id).params == {}
    flush_params(study._storage, trial._trial_id)
    assert fresh.get_trial(trial._trial_id).params == params
    assert sum(s.lstrip().startswith("INSERT") for s in q.statements) <= 8 and q.n <= 10


def test_a_trial_finished_here_is_read_back_from_memory_and_equals_the_database_s(storage):
    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    running = study.ask()  # keeps the cache's read going past the finished trial
    _suggest(running)
    trial = study.ask()
    params = _suggest(trial)
    trial.report(0.5, 1)
    study.tell(trial, 3.0)
    q = Queries(storage.engine)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert q.reads == 0 and [t.number for t in done] == [trial.number]
    db = optuna.storages.RDBStorage(storage.url).get_trial(trial._trial_id)
    got = done[0]
    assert (got.params, got.values, got.state, got.intermediate_values) == (
        params,
        [3.0],
        TrialState.COMPLETE,
        {1: 0.5},
    )
    assert (db.params, db.values, db.state, db.intermediate_values) == (params, [3.0], TrialState.COMPLETE, {1: 0.5})


def test_an_attribute_reads_back_as_the_database_gives_it(storage):
    from tuner.search.local_trials import flush_params

    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    trial.set_user_attr("constraints", (1.0, 2.0))
    flush_params(storage, trial._trial_id)
    stored = optuna.storages.RDBStorage(storage.url).get_trial(trial._trial_id).user_attrs
    assert storage.get_trial(trial._trial_id).user_attrs == stored == {"constraints": [1.0, 2.0]}


def test_the_indexed_cache_answers_every_state_filter_as_optuna_s_own_cache(tmp_path):
    from optuna.storages._cached_storage import _CachedStorage

    from tuner.search.local_trials import IndexedCachedStorage, flush_params
    from tuner.search.parallel import load_worker_study

    url = f"sqlite:///{tmp_path / 'o.db'}"
    storage = open_worker_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    running = []
    for i in range(12):  # every state, and trials finishing out of order (as eight threads finish them)
        t = study.ask()
        t.suggest_int("x", 0, 9)
        flush_params(study._storage, t._trial_id)  # as tuner's suggest does: the database holds it too
        running.append(t)
        if i % 4 == 3:
            study.enqueue_trial({"x": i % 10})
    for t in running[::3]:
        study.tell(t, float(t.number))
    for t in running[1::3]:
        study.tell(t, state=TrialState.PRUNED if t.number % 2 else TrialState.FAIL)
    ours, theirs = IndexedCachedStorage(storage), _CachedStorage(optuna.storages.RDBStorage(url))
    sid = ours.get_study_id_from_name("s")
    filters = [None, (TrialState.WAITING,), (TrialState.RUNNING, TrialState.WAITING), (TrialState.COMPLETE,)]
    filters += [(TrialState.COMPLETE, TrialState.PRUNED), (TrialState.FAIL, TrialState.RUNNING)]
    for states in filters:
        a = ours.get_all_trials(sid, deepcopy=False, states=states)
        b = theirs.get_all_trials(sid, deepcopy=False, states=states)
        assert [(t.number, t.state, t.params) for t in a] == [(t.number, t.state, t.params) for t in b], states
    # the search's studies read through it
    assert isinstance(load_worker_study(storage, "s")._storage, IndexedCachedStorage)


def test_the_pruner_takes_its_percentile_over_the_most_recent_completed_trials(tmp_path):
    from tuner.search.sampling import RecentPercentilePruner

    def pruned_with(recent: int) -> bool:
        pruner = RecentPercentilePruner(50.0, n_startup_trials=1, n_warmup_steps=0, recent=recent)
        study = optuna.create_study(direction="maximize", pruner=pruner)
        for v in (1.0, 1.0, 100.0):  # an old level of 1, the most recent at 100
            t = study.ask()
            t.report(v, 0)
            study.tell(t, v)
        t = study.ask()
        t.report(5.0, 0)
        return t.should_prune()

    assert pruned_with(recent=1) and not pruned_with(recent=1000)


def test_the_indexed_cache_hands_out_what_finished_since_a_reader_s_cursor_and_the_most_recent(tmp_path):
    from tuner.search.local_trials import IndexedCachedStorage

    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=open_worker_storage(url))
    running = [study.ask() for _ in range(9)]
    for t in running[::2]:
        study.tell(t, float(t.number))
    ours = IndexedCachedStorage(open_worker_storage(url))
    sid = ours.get_study_id_from_name("s")
    ours.refresh(sid)
    new, cursor, n, unfinished = ours.finished_since(sid, 0, (TrialState.COMPLETE, TrialState.RUNNING))
    assert [t.number for t in new] == [0, 2, 4, 6, 8] and n == 9 and [t.number for t in unfinished] == [1, 3, 5, 7]
    for t in (running[5], running[1]):  # finishing out of number order: handed out in the order they finished
        study.tell(t, state=TrialState.PRUNED)
        ours.refresh(sid)
    new, cursor, n, unfinished = ours.finished_since(sid, cursor, (TrialState.COMPLETE,))
    assert [t.number for t in new] == [5, 1] and cursor == 7 and n == 5 and unfinished == []
    assert ours.finished_since(sid, cursor)[0] == []
    every = ours.get_all_trials(sid, deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    for k in (1, 3, 7, 20):
        recent = ours.recent_trials(sid, (TrialState.COMPLETE, TrialState.PRUNED), k)
        assert [t.number for t in recent] == [t.number for t in every[-k:]]


def test_the_pruner_reads_the_recent_trials_not_a_list_of_the_whole_study(tmp_path):
    """Through the search's indexed storage, a pruning decision reads the ``recent`` most recent completed trials
    (once per trial finished), not every trial of the study; it decides as over the whole list cut to them."""
    from tuner.search.local_trials import cached
    from tuner.search.sampling import RecentPercentilePruner

    url = f"sqlite:///{tmp_path / 'o.db'}"
    pruner = RecentPercentilePruner(50.0, n_startup_trials=1, n_warmup_steps=0, recent=3)
    study = optuna.create_study(
        study_name="s", storage=cached(open_worker_storage(url)), pruner=pruner, direction="maximize"
    )
    study.direction  # noqa: B018 - read once before counting
    handed = []
    inner = study._storage.get_all_trials
    study._storage.get_all_trials = lambda *a, **k: handed.append(len(out := inner(*a, **k))) or out
    for v in (100.0, 100.0, 100.0, 100.0, 1.0, 1.0, 1.0):  # old levels of 100, the three most recent at 1
        t = study.ask()
        t.report(v, 0)
        study.tell(t, v)
    t = study.ask()
    t.report(5.0, 0)
    handed.clear()
    assert not t.should_prune()  # 5 beats the median of the three most recent (1), not that of all seven (100)
    assert sum(handed) == 0


def test_the_study_wide_cap_counts_states_without_a_list_of_the_whole_study(tmp_path):
    """``cap_decision`` (the check before every ask with ``--n-trials``) reads the indexed cache's counts per state:
    no whole-study list, and the decisions a list of every trial gives."""
    from tuner.search.local_trials import cached
    from tuner.search.parallel import cap_decision

    url = f"sqlite:///{tmp_path / 'o.db'}"
    indexed = optuna.create_study(study_name="s", storage=cached(open_worker_storage(url)))
    plain = optuna.load_study(study_name="s", storage=url)
    whole = []  # reads of a list of every trial (any state, or finished ones)
    inner = indexed._storage.get_all_trials

    def counted(study_id, deepcopy=True, states=None):
        whole.append(states is None or any(s.is_finished() for s in TrialState if s in states))
        return inner(study_id, deepcopy=deepcopy, states=states)

    indexed._storage.get_all_trials = counted
    decisions = []
    running = [indexed.ask() for _ in range(3)]
    for t, state in zip(running, (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL), strict=True):
        for cap in (1, 2, 3, 4):
            decisions.append((cap_decision(indexed, cap), cap_decision(plain, cap)))
        indexed.tell(t, 1.0 if state == TrialState.COMPLETE else None, state=state)
    for cap in (1, 2, 3):  # none running: done at the cap
        decisions.append((cap_decision(indexed, cap), cap_decision(plain, cap)))
    indexed.enqueue_trial({})
    decisions.append((cap_decision(indexed, 2), cap_decision(plain, 2)))
    assert all(a == b for a, b in decisions), decisions
    assert {a for a, _ in decisions} == {"ask", "wait", "done"} and not any(whole)


def test_the_read_of_what_changed_searches_the_primary_key_not_every_trial(tmp_path):
    """The cache's read of new and unfinished trials, and of other processes' trials whole, are searches of the
    primary key: SQLite's plan for them scans no index of the study (an OR of the two was a pass over every trial of
    the study, several times per trial)."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    here, there = open_worker_storage(url), open_worker_storage(url)
    study = optuna.create_study(study_name="s", storage=here)
    theirs = optuna.load_study(study_name="s", storage=there)
    for _ in range(3):
        study.tell(study.ask(), 1.0)
    other = theirs.ask()  # running in another process: read whole at every read
    mine = study.ask()
    plans = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().startswith("SELECT") and " trials" in statement:
            plans.extend(row[-1] for row in cursor.connection.execute("EXPLAIN QUERY PLAN " + statement, parameters))

    sqlalchemy.event.listen(here.engine, "before_cursor_execute", explain)
    seen = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    assert seen == {other.number, mine.number}
    scans = [p for p in plans if p.startswith("SCAN") or ("ix_trials_study_id (study_id=?)" in p)]
    assert plans and not scans, plans


def test_a_trial_s_attributes_reach_the_database_with_its_next_write_in_one_transaction(storage):
    """A running trial's attributes (its tag, the constant liar's proposal, its constraints, its outcome) are
    written with its next write, all in one transaction with its values, not one transaction each."""
    from tuner.search.local_trials import flush_params

    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    first = study.ask()
    _suggest(first)
    study.tell(first, 1.0)
    trial = study.ask()
    commits = []
    sqlalchemy.event.listen(storage.engine, "commit", lambda conn: commits.append(1))
    trial.set_user_attr("tuner_worker", "w0")
    study._storage.set_trial_system_attr(trial._trial_id, "relative", {"p0": 1})
    params = _suggest(trial)
    trial.set_user_attr("tuner_worker", "w1")  # the last value is the one written
    flush_params(study._storage, trial._trial_id)
    assert len(commits) == 1
    fresh = optuna.storages.RDBStorage(storage.url).get_trial(trial._trial_id)
    assert fresh.params == params and fresh.user_attrs == {"tuner_worker": "w1"}
    assert fresh.system_attrs == {"relative": {"p0": 1}}
    trial.set_user_attr("constraints", [0.0])
    trial.set_user_attr("outcome", "ok")
    study.tell(trial, 2.0)
    assert len(commits) == 3  # the attributes, then the state and value
    fresh = optuna.storages.RDBStorage(storage.url).get_trial(trial._trial_id)
    assert fresh.user_attrs == {"tuner_worker": "w1", "constraints": [0.0], "outcome": "ok"}
    here = storage.get_trial(trial._trial_id)
    assert fresh.state == here.state == TrialState.COMPLETE and here.user_attrs == fresh.user_attrs
