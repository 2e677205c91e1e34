"""A proposal that repeats a timed configuration is turned away before it becomes a trial (issue 48): the storage
takes back a trial's unwritten values (``LocalTrialsMixin.drop_params``), ``sampling.suggest`` samples the trial
again, and the search counts what was turned away where it counted repeats (convergence, refining, the tally)."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from search_spaces import Hardware, load_space, resolve
from storage import Repo
from tuner.search import sampling
from tuner.search.context import SearchOptions, open_optuna_storage
from tuner.search.driver import run_search
from tuner.search.heartbeat import open_worker_storage
from tuner.search.local_trials import cached, drop_params, flush_params
from tuner.search.results import TrialSummary, trial_tally
from tuner.search.sampling import MAX_TURNED_AWAY, TURNED_AWAY_ATTR, discard_proposal, suggest
from tuner.search.stages import REPEAT_SHARE, StretchTrack, converged

optuna.logging.set_verbosity(optuna.logging.WARNING)

CPU = Hardware()

SPACE = """
name: turn-away
target: fake_targets:FakeTarget
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  x: {type: int, low: 0, high: 20, default: 0}
  y: {type: categorical, values: [0, 1, 2], default: 0}
"""


def _p(trial: optuna.Trial) -> dict:
    return {f"p{i}": trial.suggest_categorical(f"p{i}", [1, 2, 3, 4]) for i in range(4)}


def _db_params(url: str, trial_id: int) -> dict:
    return optuna.storages.RDBStorage(url).get_trial(trial_id).params


@pytest.fixture(params=["search", "worker"])
def storage(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    return open_optuna_storage(url) if request.param == "search" else open_worker_storage(url)


def _study(storage, sampler=None) -> optuna.Study:
    return optuna.create_study(
        study_name="s", storage=cached(storage), sampler=sampler or optuna.samplers.RandomSampler(seed=0)
    )


# -- the storage ------------------------------------------------------------------------------------------------
def test_a_trial_s_unwritten_values_are_dropped_and_refused_once_one_is_in_the_database(storage):
    study = _study(storage)
    first = study.ask()
    _p(first)  # the study's first value of each parameter is written at once: nothing of it can be taken back
    assert _db_params(storage.url, first._trial_id) and not drop_params(study._storage, first._trial_id)
    assert study._storage.get_trial(first._trial_id).params == first.params  # refused: nothing changed
    study.tell(first, 1.0)

    trial = study.ask()
    trial.set_user_attr("worker", "w0")  # kept for the next write too; an attribute is not a proposal
    _p(trial)
    assert study._storage.get_trial(trial._trial_id).params  # the copy holds them, the database not yet
    assert drop_params(study._storage, trial._trial_id)
    held = study._storage.get_trial(trial._trial_id)
    assert held.params == {} and held.distributions == {}
    flush_params(study._storage, trial._trial_id)  # the dropped values are no longer pending: none is written
    assert _db_params(storage.url, trial._trial_id) == {}
    assert optuna.storages.RDBStorage(storage.url).get_trial(trial._trial_id).user_attrs == {"worker": "w0"}

    trial._cached_frozen_trial.params, trial._cached_frozen_trial.distributions = {}, {}
    again = _p(trial)
    flush_params(study._storage, trial._trial_id)
    assert _db_params(storage.url, trial._trial_id) == again
    assert not drop_params(study._storage, trial._trial_id)  # written: refused, and the copy keeps them
    assert study._storage.get_trial(trial._trial_id).params == again
    study.tell(trial, 2.0)
    assert not drop_params(study._storage, trial._trial_id)  # finished: not this process's running trial any more


def test_a_storage_that_writes_each_value_at_once_takes_none_back(tmp_path):
    study = optuna.create_study(storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}"))
    trial = study.ask()
    _p(trial)
    assert not drop_params(study._storage, trial._trial_id) and not discard_proposal(trial)
    assert not drop_params(optuna.storages.InMemoryStorage(), 0)


# -- Optuna's private fields the turn-away resets (Optuna 5.1) ----------------------------------------------------
def test_optuna_keeps_a_trial_s_proposal_where_the_turn_away_resets_it(tmp_path):
    """``discard_proposal`` resets ``Trial._relative_params``, ``Trial.relative_search_space`` and
    ``Trial._cached_frozen_trial``'s params and distributions: an Optuna that renames or stops reading them fails
    here, not silently in a search (a turned-away proposal's values would come back)."""
    calls = []

    class Counting(optuna.samplers.TPESampler):
        def sample_relative(self, study, trial, search_space):
            calls.append(trial.number)
            return super().sample_relative(study, trial, search_space)

    study = _study(open_optuna_storage(f"sqlite:///{tmp_path / 'o.db'}"), Counting(seed=0, multivariate=True))
    for _ in range(12):  # past TPE's start-up trials: a joint (relative) proposal
        t = study.ask()
        study.tell(t, sum(_p(t).values()))
    trial = study.ask()
    for name in ("_relative_params", "relative_search_space", "_cached_frozen_trial"):
        assert name in vars(trial), f"optuna.Trial has no {name} any more: see sampling.discard_proposal"
    assert trial._relative_params is None and trial.relative_search_space is None  # sampled at the first suggestion
    first = _p(trial)
    assert trial._relative_params == first and set(trial.relative_search_space) == set(first)
    assert trial._cached_frozen_trial.params == first and set(trial._cached_frozen_trial.distributions) == set(first)
    # a suggestion whose name the cached trial holds returns its value without sampling; a reset one samples again
    n = len(calls)
    trial._cached_frozen_trial.params = {**first, "p0": 4 if first["p0"] != 4 else 1}
    assert trial.suggest_categorical("p0", [1, 2, 3, 4]) == trial._cached_frozen_trial.params["p0"]
    assert len(calls) == n
    assert discard_proposal(trial)
    assert trial._relative_params is None and trial.relative_search_space is None
    assert trial.params == {} and trial.distributions == {}
    _p(trial)
    assert len(calls) == n + 1  # the joint proposal was sampled again


# -- suggest ---------------------------------------------------------------------------------------------------
def _resolved(tmp_path):
    p = tmp_path / "space.yaml"
    p.write_text(SPACE)
    return resolve(load_space(str(p)), CPU)


def test_every_proposal_a_repeat_turns_away_at_most_the_cap_and_the_last_one_stands_settled(tmp_path, caplog):
    resolved = _resolved(tmp_path)
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = _study(open_optuna_storage(url), optuna.samplers.RandomSampler(seed=3))
    suggest(study.ask(), resolved)  # the study's first values: the next trials' are deferred
    trial = study.ask()
    asked = []

    def repeat_of(params):
        asked.append(dict(params))
        return 0

    with caplog.at_level("DEBUG", logger="tuner.search.sampling"):
        params = suggest(trial, resolved, repeat_of=repeat_of)
    assert len(asked) == MAX_TURNED_AWAY  # the proposal after the last one turned away stands unasked
    assert len({tuple(sorted(a.items())) for a in asked + [params]}) > 1  # sampled anew each time (63 configurations)
    assert trial.user_attrs[TURNED_AWAY_ATTR] == MAX_TURNED_AWAY
    assert sum("turned away" in r.getMessage() for r in caplog.records) == MAX_TURNED_AWAY
    assert _db_params(url, trial._trial_id) == params  # only the one that stood was written
    # a second call (run_one after the worker's lease) returns what the first settled and turns nothing away
    assert suggest(trial, resolved, repeat_of=repeat_of) == params
    assert trial.user_attrs[TURNED_AWAY_ATTR] == MAX_TURNED_AWAY and _db_params(url, trial._trial_id) == params


def test_a_new_proposal_stands_and_a_trial_with_nothing_turned_away_has_no_attribute(tmp_path):
    resolved = _resolved(tmp_path)
    study = _study(open_optuna_storage(f"sqlite:///{tmp_path / 'o.db'}"), optuna.samplers.RandomSampler(seed=3))
    suggest(study.ask(), resolved)
    trial = study.ask()
    seen = []
    params = suggest(trial, resolved, repeat_of=lambda p: seen.append(p) or None)
    assert seen == [params] and TURNED_AWAY_ATTR not in trial.user_attrs


# -- the whole search --------------------------------------------------------------------------------------------
def _search(tmp_path, name: str, **kw):
    space = tmp_path / f"{name}.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / f'{name}.db'}"
    opts = SearchOptions(
        budget_s=300,
        storage_url=url,
        study="s",
        space_path=str(space),
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=CPU,
        trial_timeout_s=10.0,
        confirm_top=0,
        export=False,
        converge_after=0,
        refine_share=0.01,  # no window in 30 trials: refining moves only where TPE re-proposed a timed configuration
        **kw,
    )
    return run_search(opts), url


def _check_stored(url: str) -> dict[int, int]:
    """Every trial as Optuna and the tuner's tables hold it: the same values, one row per value, a finished state
    that says what the outcome says. Returns the turned-away counts by trial number."""
    repo = Repo(url)
    run = repo.get_run("s")
    recs = {r.number: r for r in repo.list_trials(run.id)}
    study = optuna.load_study(study_name="s", storage=url)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == len(recs)
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT trial_id, param_name FROM trial_params")).all()
    assert len(rows) == len(set(rows))  # no value written twice (a turned-away one and its successor)
    per_trial: dict[int, int] = {}
    for trial_id, _ in rows:
        per_trial[trial_id] = per_trial.get(trial_id, 0) + 1
    for t in trials:
        rec = recs[t.number]
        assert t.params == rec.params, t.number  # no value of a discarded proposal in the database
        assert per_trial.get(t._trial_id, 0) == len(t.params)
        assert rec.state != "running"
        if rec.outcome == "ok":
            assert t.state == TrialState.COMPLETE and t.value == pytest.approx(rec.value)
        elif rec.outcome == "pruned":
            assert t.state == TrialState.PRUNED
        else:
            assert t.state in (TrialState.COMPLETE, TrialState.FAIL)
        assert (t.user_attrs.get("repeat_of") is None) == (rec.repeat_of is None)
    return {t.number: t.user_attrs[TURNED_AWAY_ATTR] for t in trials if TURNED_AWAY_ATTR in t.user_attrs}


# 52 s for both on 2 cores: the slow pass (CI runs it) keeps the README's test command within 12 minutes
@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_seeded_search_records_fewer_repeats_and_counts_what_it_turned_away(tmp_path, monkeypatch, workers):
    """The same seeded search, with the turn-away off (the cap at 0: every repeat proposal recorded as a trial, as
    before) and on: fewer recorded repeats, the turned-away proposals on their trials, nothing of them stored."""
    n = 30
    monkeypatch.setattr(sampling, "MAX_TURNED_AWAY", 0)
    before, url_before = _search(tmp_path, "before", n_trials=n, workers=workers)
    assert _check_stored(url_before) == {}
    monkeypatch.setattr(sampling, "MAX_TURNED_AWAY", MAX_TURNED_AWAY)
    after, url_after = _search(tmp_path, "after", n_trials=n, workers=workers)
    turned = _check_stored(url_after)

    repeats_before = sum(t.repeat_of is not None for t in before.trials)
    repeats_after = sum(t.repeat_of is not None for t in after.trials)
    assert repeats_before >= 4, "the test needs TPE to repeat itself without the turn-away"
    assert repeats_after < repeats_before, (repeats_before, repeats_after)
    assert turned and all(0 < k <= MAX_TURNED_AWAY for k in turned.values())
    # the summaries carry them (with workers: read back from Optuna), and the tally says how many
    assert {t.number: t.turned_away for t in after.trials if t.turned_away} == turned
    assert f"{sum(turned.values())} proposals turned away as repeats" in trial_tally(after.trials)
    # a trial whose proposals were turned away (its own one new) is followed by a refining move, as a repeat is
    stored = optuna.load_study(study_name="s", storage=url_after).trials
    moves = {t.number for t in stored if "tuner_refine_of" in t.user_attrs}
    followed = [t.number for t in after.trials if t.turned_away and t.repeat_of is None and t.number + 1 in moves]
    if workers == 1:  # one worker: its next ask is the next trial
        assert followed, (turned, moves)
    else:
        assert moves


# -- what the repeats signalled ------------------------------------------------------------------------------------
def test_the_convergence_share_counts_turned_away_proposals_over_all_proposals():
    values = [10.0, 12.0] + [11.0] * 8  # nothing beats 12 in the last 8 trials
    # no trial recorded as a repeat; 3 proposals turned away over the stretch: 3 of 11 proposals >= a quarter
    turned = [0, 0] + [1, 0, 1, 0, 1, 0, 0, 0]
    v = converged(values, [False] * 10, None, stretch=8, noise=0.01, maximize=True, turned_away=turned)
    assert v is not None and (v.stretch, v.repeats, v.proposals) == (8, 3, 11)
    assert "3 of their 11 proposals repeats" in v.line()
    # 2 repeat proposals are a quarter of 8 trials but not of their 9 proposals: only the longer stretch would do
    turned = [0, 0] + [1] + [0] * 7
    repeats = [False] * 9 + [True]
    assert converged(values, repeats, None, stretch=8, noise=0.01, maximize=True, turned_away=turned) is None
    assert 2 < REPEAT_SHARE * 9
    # without turned-away proposals the rule is what it was: a quarter of the stretch's trials
    assert converged(values, [False] * 8 + [True] * 2, None, stretch=8, noise=0.01, maximize=True).repeats == 2


def test_the_track_appended_trial_by_trial_agrees_with_the_share_written_out():
    import random

    rng = random.Random(11)
    for _ in range(40):
        stretch = rng.choice([3, 5, 8])
        track, reps, props = StretchTrack(10.0, True), [], []
        for i in range(rng.randint(1, 80)):
            r, k = rng.random() < 0.15, rng.choice([0, 0, 0, 1, 2, MAX_TURNED_AWAY])
            reps.append(int(r) + k)
            props.append(1 + k)
            track.append(9.0, r, k)  # never a gain: the share alone decides at the first stretch
            n, w = i + 1, max(stretch, -(-(i + 1) // 5))
            got = track.verdict(stretch=stretch, noise=0.0)
            if n < w:
                assert got is None
                continue
            share_met = sum(reps[n - w :]) >= REPEAT_SHARE * sum(props[n - w :])
            if share_met:
                assert (got.stretch, got.repeats, got.proposals) == (w, sum(reps[n - w :]), sum(props[n - w :]))
            elif n >= 2 * w:
                assert got is not None and got.stretch == 2 * w and got.proposals == sum(props[n - 2 * w :])
            else:
                assert got is None


def test_the_tally_says_how_many_proposals_were_turned_away():
    trials = [
        TrialSummary(0, {"x": 0}, "ok", 1.0, is_baseline=True),
        TrialSummary(1, {"x": 1}, "ok", 2.0, turned_away=3),
        TrialSummary(2, {"x": 1}, "ok", 2.0, repeat_of=1, turned_away=MAX_TURNED_AWAY),
    ]
    assert trial_tally(trials) == (
        f"2 configurations: ok 2 (3 trials: 1 repeat not run again; {3 + MAX_TURNED_AWAY} proposals turned away as "
        "repeats)"
    )
    assert trial_tally(trials[:2]) == "2 configurations: ok 2 (3 proposals turned away as repeats)"
    assert trials[1].reproposed and trials[2].reproposed and not trials[0].reproposed
