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
