"""The sampler's view of history (``tuner.search.sampling.BoundedTPESampler``): the same proposals as Optuna's TPE
while the study is under the cap, and past it at most the cap, the best ones always kept."""

import optuna
import pytest

from search_spaces import Hardware, load_space, resolve
from tuner.search.sampling import BoundedTPESampler, make_sampler, set_constraints, suggest

H200 = Hardware(gpu_name="NVIDIA H200", gpu_count=1, compute_capability=(9, 0), has_triton=True, has_torch_compile=True)


def _value(p, i):
    return float(p["context_length"] < 100000) * 10 + (p["glue"] == "fused") + (i % 7) * 0.1


def _fill(study, resolved, n, start=0):
    asked = []
    for i in range(start, start + n):
        t = study.ask()
        p = suggest(t, resolved)
        asked.append(p)
        set_constraints(t, [0.0 if p["context_length"] < 1048576 else 1.0])
        study.tell(t, _value(p, i))
    return asked


def test_under_the_cap_the_bounded_sampler_proposes_what_optunas_tpe_proposes():
    resolved = resolve(load_space("dsv4_flash"), H200)
    ours = optuna.create_study(direction="maximize", sampler=make_sampler(resolved, 3, parallel=True))
    kw = dict(
        seed=3, multivariate=True, group=True, constant_liar=True, n_startup_trials=ours.sampler._n_startup_trials
    )
    theirs = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(**kw))
    assert isinstance(ours.sampler, BoundedTPESampler)
    assert _fill(ours, resolved, 40) == _fill(theirs, resolved, 40)


def test_past_the_cap_the_sampler_sees_the_best_and_the_most_recent_only():
    resolved = resolve(load_space("dsv4_flash"), H200)
    sampler = BoundedTPESampler(
        seed=0, multivariate=True, group=True, constant_liar=True, history_cap=60, history_best=10
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    _fill(study, resolved, 150)
    running = study.ask()
    trials = study._get_trials(deepcopy=False, states=None)
    view = sampler.bounded(study, [t for t in trials if t.state != optuna.trial.TrialState.FAIL])
    finished = [t for t in view if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 60 and running.number in {t.number for t in view}
    feasible = [
        t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())
    ]
    best10 = sorted(feasible, key=lambda t: -t.value)[:10]
    assert {t.number for t in best10} <= {t.number for t in finished}
    recent = sorted(t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE)[-40:]
    assert set(recent) <= {t.number for t in finished}


def test_history_best_must_be_under_the_cap():
    with pytest.raises(ValueError, match="history_best < history_cap"):
        BoundedTPESampler(history_cap=10, history_best=10)


def test_optunas_sqlite_connections_commit_in_wal_without_waiting_for_the_disk(tmp_path):
    """Optuna writes a trial's parameters one commit each: with SQLite's default (synchronous=FULL) each waits for
    the disk; the search's Optuna storages use the tuner's own settings (WAL, synchronous=NORMAL)."""
    from sqlalchemy import text

    from tuner.search.context import open_optuna_storage
    from tuner.search.heartbeat import open_worker_storage

    url = f"sqlite:///{tmp_path}/s.db"
    for storage in (open_optuna_storage(url), open_worker_storage(url)):
        with storage.engine.connect() as c:
            assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL (FULL is 2)
            assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"


class _WholeReads:
    """Counts the trials the study's storage hands out in whole-study lists (``get_all_trials`` with any finished
    state asked): what grows with the study at every read."""

    def __init__(self, storage) -> None:
        self.trials = 0
        inner = storage.get_all_trials

        def counted(study_id, deepcopy=True, states=None):
            out = inner(study_id, deepcopy=deepcopy, states=states)
            if states is None or any(s.is_finished() for s in optuna.trial.TrialState if s in states):
                self.trials += len(out)
            return out

        storage.get_all_trials = counted


def _indexed_study(tmp_path, sampler, pruner=None):
    from tuner.search.heartbeat import open_worker_storage
    from tuner.search.parallel import load_worker_study

    url = f"sqlite:///{tmp_path / 'h.db'}"
    optuna.create_study(study_name="s", storage=url, direction="maximize")
    return load_worker_study(open_worker_storage(url), "s", sampler, pruner)


def _small_cap_sampler():
    return BoundedTPESampler(seed=5, multivariate=True, group=True, constant_liar=True, history_cap=40, history_best=8)


def test_past_the_cap_an_ask_reads_no_whole_study_list_however_many_trials_it_holds(tmp_path):
    """Read through the search's indexed storage, the bounded history costs the trials that finished since the last
    ask: the trials an ask, its suggestions and its tell read in whole-study lists do not grow with the study (they
    were a pass over every trial, several times per ask)."""
    resolved = resolve(load_space("dsv4_flash"), H200)
    study = _indexed_study(tmp_path, _small_cap_sampler())
    reads = _WholeReads(study._storage)
    per_trial = {}
    for size in (60, 120):
        _fill(study, resolved, size - len(study.trials), start=len(study.trials))
        before = reads.trials
        _fill(study, resolved, 1, start=size)
        per_trial[size] = reads.trials - before
    assert per_trial[120] == per_trial[60], per_trial


def test_the_indexed_history_proposes_what_the_whole_read_proposes(tmp_path):
    """The same seed over the same objective: the indexed storage's incremental history (SQLite) and a whole read
    of every trial at every ask (Optuna's in-memory storage) propose the same configurations, past the cap too."""
    resolved = resolve(load_space("dsv4_flash"), H200)
    indexed = _indexed_study(tmp_path, _small_cap_sampler())
    whole = optuna.create_study(direction="maximize", sampler=_small_cap_sampler())
    assert _fill(indexed, resolved, 100) == _fill(whole, resolved, 100)


def test_the_sampler_leaves_optunas_modules_as_they_are():
    """The split of TPE's history is the sampler's own method, not a replacement of Optuna's module function (which
    every TPESampler of the process, and Optuna's next release, would see)."""
    from optuna.samplers._tpe import sampler as tpe

    import tuner.search.sampling  # noqa: F401 - importing it must change nothing of Optuna's

    assert not hasattr(tpe._split_trials, "__wrapped__")
    assert tpe._split_trials.__module__ == "optuna.samplers._tpe.sampler"


def _mixed(study, resolved, n, *, running=4):
    """``n`` trials with up to ``running`` of them running at once (the constant liar sees them), every fifth
    pruned after a report, every seventh infeasible; the proposals in order."""
    asked, open_ = [], []
    for i in range(n):
        t = study.ask()
        asked.append(suggest(t, resolved))
        open_.append((i, t, asked[-1]))
        if len(open_) > running:
            j, t, p = open_.pop(0)
            if j % 5 == 4:
                t.report(_value(p, j), 0)
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
                continue
            set_constraints(t, [1.0 + j % 3 if j % 7 == 6 else 0.0])
            study.tell(t, _value(p, j))
    return asked


def test_with_running_pruned_and_infeasible_trials_the_proposals_are_optunas():
    """The sampler's own split and its per-trial values (computed once per finished trial) give TPE the numbers
    Optuna's would: the same proposals with the constant liar's running trials, pruned and infeasible ones."""
    resolved = resolve(load_space("dsv4_flash"), H200)
    ours = optuna.create_study(direction="maximize", sampler=make_sampler(resolved, 11, parallel=True))
    kw = dict(
        seed=11, multivariate=True, group=True, constant_liar=True, n_startup_trials=ours.sampler._n_startup_trials
    )
    theirs = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(**kw))
    assert _mixed(ours, resolved, 90) == _mixed(theirs, resolved, 90)


def test_an_ask_reads_each_finished_trials_values_once_not_at_every_ask(monkeypatch):
    """A finished trial's parameters in TPE's internal form, and its place in the split (its constraints), are
    computed when it first comes into a sampler call; later asks reuse them: an ask's conversions do not grow with
    the history (under the cap they were every trial's, per parameter group, at every ask)."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import FrozenTrial

    resolved = resolve(load_space("dsv4_flash"), H200)
    calls = {"repr": 0, "constraints": 0}
    real_repr, real_constraints = CategoricalDistribution.to_internal_repr, FrozenTrial.constraints

    def to_internal_repr(self, value):
        calls["repr"] += 1
        return real_repr(self, value)

    def constraints(self):
        calls["constraints"] += 1
        return real_constraints.fget(self)

    monkeypatch.setattr(CategoricalDistribution, "to_internal_repr", to_internal_repr)
    monkeypatch.setattr(FrozenTrial, "constraints", property(constraints))
    study = optuna.create_study(direction="maximize", sampler=make_sampler(resolved, 2, parallel=True))
    per_ask = {}
    for size in (60, 150):
        _fill(study, resolved, size - len(study.trials), start=len(study.trials))
        before = dict(calls)
        t = study.ask()
        suggest(t, resolved)
        per_ask[size] = {k: calls[k] - before[k] for k in calls}
        study.tell(t, 1.0)
    assert per_ask[150] == per_ask[60], per_ask
    assert per_ask[150]["repr"] < 3 * len(resolved.params), per_ask  # the one trial new since the last ask
