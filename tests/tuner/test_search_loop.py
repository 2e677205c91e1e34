"""The search loop against a fake target: baseline first, failures as data, deadline, resume."""

import time

import optuna
import pytest
from spaces import FAKE_SPACE

from search_spaces import Hardware
from storage import Repo
from tuner.errors import SearchError
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search

CPU = Hardware()


def _space(tmp_path, text=FAKE_SPACE, name="space.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _opts(tmp_path, url, **kw):
    base = dict(
        budget_s=120,
        storage_url=url,
        study="s",
        space_path=_space(tmp_path, name="default.yaml"),
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=CPU,
        trial_timeout_s=3.0,
        confirm_top=0,
    )
    base.update(kw)
    return SearchOptions(**base)


def test_baseline_first_then_search_finds_better(tmp_path, sqlite_url):
    res = run_search(
        _opts(
            tmp_path,
            sqlite_url,
            n_trials=14,
            space_path=_space(tmp_path, FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")),
        )
    )
    assert res.trials[0].is_baseline and res.trials[0].params == {"mode": "ok", "x": 0}
    # the fake at x=0 gives 10 tok/s at c=1 and 20 at c=4: geomean sqrt(200)
    assert res.baseline_value == pytest.approx(200**0.5, rel=1e-9)
    assert res.best_value > res.baseline_value  # x > 0 is better by construction
    assert res.speedup > 1.0
    repo = Repo(sqlite_url)
    run = repo.get_run("s")
    assert run.state == "finished" and run.baseline_value == pytest.approx(res.baseline_value)
    recs = repo.list_trials(run.id, with_measurements=True)
    assert len(recs) == 14
    assert {m.level for m in recs[0].measurements if m.metric not in ("trial_time_s", "worker_trial")} == {"c=1", "c=4"}
    assert {m.level for m in recs[0].measurements if m.metric == "trial_time_s"} == {
        "spawn"
    }  # the child stores its start
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    assert len(study.trials) == 14
    assert (tmp_path / "out" / "s" / "launch.sh").exists()


@pytest.mark.parametrize(
    "mode,outcome,reason_part",
    [
        ("crash", "crash", "SIGSEGV"),
        ("hang", "timeout", "deadline"),
        ("oom", "oom", "out of memory"),
        ("raise", "crash", "ZeroDivisionError"),
    ],
)
def test_a_failed_baseline_is_stored_classified_and_ends_the_search(tmp_path, sqlite_url, mode, outcome, reason_part):
    """A failed trial is data (its outcome class and reason stored, told to Optuna as infeasible); when it is the
    baseline, nothing can be compared, so the search stops at once and says why (it ran 12 doomed launches before)."""
    space = _space(tmp_path, FAKE_SPACE.replace("default: ok", f"default: {mode}"))
    t0 = time.time()
    res = run_search(_opts(tmp_path, sqlite_url, n_trials=3, space_path=space, trial_timeout_s=2.0))
    assert time.time() - t0 < 30
    first = res.trials[0]
    assert first.is_baseline and first.outcome == outcome and first.value is None
    assert reason_part.lower() in first.reason.lower()
    assert len(res.trials) == 1 and res.state == "failed"
    assert "the baseline (trial 0) failed" in res.stop_reason and reason_part.lower() in res.stop_reason.lower()
    repo = Repo(sqlite_url)
    run = repo.get_run("s")
    rec = repo.get_trial(run.id, 0)
    assert rec.outcome == outcome and rec.state == "failed" and run.state == "failed"
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    ft = study.trials[0]
    assert ft.user_attrs["outcome"] == outcome
    assert ft.user_attrs["constraints"][0] == 1.0  # told as infeasible, so TPE learns to avoid it


def test_a_failed_trial_after_the_baseline_is_data_and_the_search_goes_on(tmp_path, sqlite_url):
    space = _space(
        tmp_path, FAKE_SPACE.replace("settings: {sleep_s: 0.0}", "settings: {sleep_s: 0.0, fail_fast_after: 0}")
    )
    res = run_search(_opts(tmp_path, sqlite_url, n_trials=12, space_path=space, trial_timeout_s=2.0))
    outcomes = [t.outcome for t in res.trials]
    assert outcomes[0] == "ok" and len(res.trials) == 12 and res.state == "finished"
    first_failure = next(i for i, o in enumerate(outcomes) if o not in ("ok", "pruned"))
    assert "ok" in outcomes[first_failure + 1 :]  # it went on, and later trials succeeded


def test_a_run_of_identical_failures_ends_the_search_naming_the_reason(tmp_path, sqlite_url):
    """Every configuration but the defaults crashes the same way (a broken environment): after
    ``fail_fast_after`` such trials in a row the search stops, naming that failure, instead of using its budget."""
    space = _space(
        tmp_path,
        FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]").replace(
            "settings: {sleep_s: 0.0}", "settings: {sleep_s: 0.0, crash_unless_x: 0, fail_fast_after: 3}"
        ),
    )
    res = run_search(_opts(tmp_path, sqlite_url, n_trials=20, space_path=space, trial_timeout_s=5.0))
    ran = [t for t in res.trials if t.repeat_of is None]
    assert ran[0].outcome == "ok" and [t.outcome for t in ran[-3:]] == ["crash"] * 3
    assert res.state == "failed" and len(res.trials) < 20
    assert "3 trials in a row failed the same way, crash" in res.stop_reason and "SIGSEGV" in res.stop_reason


def test_fail_fast_counts_only_trials_that_ran_and_failed_alike():
    from tuner.search.context import TrialSummary
    from tuner.search.failfast import FailFast

    ff = FailFast(3)
    assert ff.observe(TrialSummary(0, {}, "ok", 1.0, is_baseline=True)) is None
    for n, reason in enumerate(["OSError: port 30001 busy", "OSError: port 30002 busy"], start=1):
        assert ff.observe(TrialSummary(n, {}, "crash", None, reason)) is None
    assert ff.observe(TrialSummary(3, {}, "invalid_config", None, "violates constraint `x`")) is None  # neither
    assert ff.observe(TrialSummary(4, {}, "crash", None, "copy", repeat_of=1)) is None  # a copy is no run
    assert "3 trials in a row" in ff.observe(TrialSummary(5, {}, "crash", None, "OSError: port 30417 busy"))
    ff = FailFast(3)
    for n, reason in enumerate(["OSError: a", "ValueError: b", "OSError: a"]):
        assert ff.observe(TrialSummary(n, {}, "crash", None, reason)) is None  # different failures: no run
    assert FailFast(0).observe(TrialSummary(9, {}, "timeout", None, "slow")) is None
    assert (
        FailFast(3).observe(
            TrialSummary(0, {}, "timeout", None, "stopped at the search's deadline after 3s", is_baseline=True)
        )
        is None
    )  # the search's own cut says nothing


def test_search_ends_by_the_deadline_and_times_out_the_running_trial(tmp_path, sqlite_url):
    space = _space(tmp_path, FAKE_SPACE.replace("default: ok", "default: hang"))
    t0 = time.time()
    res = run_search(_opts(tmp_path, sqlite_url, budget_s=6.0, space_path=space, trial_timeout_s=60.0))
    took = time.time() - t0
    assert took <= 6.0 + 30.0  # overshoot at most max(2% of budget, 30 s)
    assert took >= 3.0
    assert res.trials[-1].outcome == "timeout"
    assert "deadline" in res.trials[-1].reason
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)


def test_second_search_on_same_study_needs_resume(tmp_path, sqlite_url):
    run_search(_opts(tmp_path, sqlite_url, n_trials=3))
    with pytest.raises(SearchError, match="--resume"):
        run_search(_opts(tmp_path, sqlite_url, n_trials=3))
    res = run_search(_opts(tmp_path, sqlite_url, n_trials=3, resume=True))
    assert [t.number for t in res.trials] == list(range(6))
    assert sum(t.is_baseline for t in res.trials) == 1  # the baseline is not run again
    with pytest.raises(SearchError, match="no study"):
        run_search(_opts(tmp_path, sqlite_url, n_trials=1, resume=True, study="other"))


def test_repeated_configuration_is_not_run_again(tmp_path, sqlite_url):
    space = _space(
        tmp_path,
        FAKE_SPACE.replace("values: [0, 1, 2, 3, 4, 5, 6, 7]", "values: [0, 1]").replace(
            "values: [ok, crash, hang, oom, raise]", "values: [ok]"
        ),
    )
    res = run_search(_opts(tmp_path, sqlite_url, n_trials=8, space_path=space))
    repeats = [t for t in res.trials if "not run again" in t.reason]
    assert repeats, "a 2-point space sampled 8 times must repeat"
    assert all(t.duration_s < 1.0 for t in repeats)


def test_dry_run_touches_no_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'never.db'}"
    res = run_search(_opts(tmp_path, url, dry_run=True))
    assert res.state == "dry_run" and res.preflight.ok
    assert not (tmp_path / "never.db").exists()


def test_unreachable_storage_is_a_clear_error(tmp_path):
    from storage import StorageError

    with pytest.raises(StorageError, match="cannot be reached"):
        run_search(_opts(tmp_path, "postgresql://nobody@127.0.0.1:1/none", n_trials=1))


def test_baseline_and_confirmation_runs_are_never_pruned(tmp_path, sqlite_url, monkeypatch):
    """A pruner that prunes every odd-numbered trial: the baseline and the re-runs that confirm the winner still run
    whole (a pruned confirmation would leave the winner a single lucky timing)."""
    import tuner.search.context as search
    from tuner.search.context import BASELINE_ATTR, CONFIRM_ATTR

    class OddPruner(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number % 2 == 1 or trial.number == 0

    monkeypatch.setattr(search, "make_pruner", OddPruner)
    space = _space(tmp_path, FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"), "ok.yaml")
    run_search(_opts(tmp_path, sqlite_url, budget_s=25.0, space_path=space, confirm_top=3))
    trials = optuna.load_study(study_name="s", storage=sqlite_url).trials
    confirms = [t for t in trials if CONFIRM_ATTR in t.user_attrs]
    assert len(confirms) >= 2  # at least one has an odd number: the pruner wanted it
    assert any(t.number % 2 for t in confirms)
    for t in confirms + [t for t in trials if t.user_attrs.get(BASELINE_ATTR)]:
        assert t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("outcome") == "ok", t
    assert any(t.state == optuna.trial.TrialState.PRUNED for t in trials)  # the pruner did prune the others


def _summary(n, x, value):
    from tuner.search.context import TrialSummary

    return TrialSummary(n, {"x": x}, "ok", value)


def _pick(ctx):
    from tuner.search.winner import group_runs, pick_best

    return pick_best(group_runs(ctx.trials, ctx.key_of), maximize=ctx.direction == "maximize", tolerance=0.10)[0]


def test_a_single_lucky_timing_never_beats_a_confirmed_median():
    """Seen in the README's 2-minute CPU run: the top three fell back on their re-runs, and the fourth, timed once,
    was reported as the winner. Now it is re-run first, and only configurations timed twice can win."""
    from types import SimpleNamespace

    from tuner.search.confirm import unconfirmed_leader
    from tuner.search.sampling import params_key

    def pick_best(ctx):
        return _pick(ctx)

    trials = [
        _summary(0, 1, 100.0),
        _summary(1, 2, 130.0),
        _summary(2, 3, 120.0),
        _summary(3, 4, 118.0),
        _summary(4, 2, 100.0),
        _summary(5, 3, 108.0),
    ]  # 2 and 3 re-run lower; 4 was timed once
    ctx = SimpleNamespace(trials=trials, direction="maximize", better=lambda a, b: a > b, key_of=params_key)
    assert unconfirmed_leader(ctx).params == {"x": 4}
    assert pick_best(ctx).params == {"x": 2} and pick_best(ctx).median == 115.0  # median of 130 and 100
    ctx.trials.append(_summary(6, 4, 119.0))  # the challenger, confirmed
    assert unconfirmed_leader(ctx) is None and pick_best(ctx).params == {"x": 4}
    # nothing timed twice: the best single timing is the best there is
    ctx.trials = trials[:4]
    assert unconfirmed_leader(ctx) is None and pick_best(ctx).params == {"x": 2}
    # minimized objectives the same way round
    low = SimpleNamespace(
        trials=[_summary(0, 1, 10.0), _summary(1, 1, 12.0), _summary(2, 2, 9.0)],
        direction="minimize",
        better=lambda a, b: a < b,
        key_of=params_key,
    )
    assert unconfirmed_leader(low).params == {"x": 2} and pick_best(low).params == {"x": 1}


def test_confirmation_re_runs_the_new_leader(monkeypatch):
    """confirm_top re-runs its top picks, then the single timing that overtook them, before the search ends."""
    from types import SimpleNamespace

    import tuner.search.confirm as search
    from tuner.search.sampling import params_key

    later = {2: 100.0, 3: 108.0, 4: 119.0, 1: 95.0}  # what a re-run of each x measures
    trials = [_summary(0, 1, 100.0), _summary(1, 2, 130.0), _summary(2, 3, 120.0), _summary(3, 4, 118.0)]
    queued = []
    study = SimpleNamespace(enqueue_trial=lambda params, user_attrs: queued.append(params), ask=lambda: None)
    ctx = SimpleNamespace(
        trials=trials,
        direction="maximize",
        better=lambda a, b: a > b,
        study=study,
        key_of=params_key,
        options=SimpleNamespace(confirm_top=2, n_trials=None),
        stop=SimpleNamespace(is_set=lambda: False),
        deadline=SimpleNamespace(remaining_for_trials=lambda: 1e9),
        resolved=None,
        baseline=None,
        target=SimpleNamespace(config=SimpleNamespace(noise_tolerance=0.10)),
    )
    monkeypatch.setattr(search, "suggestable", lambda resolved, params: dict(params))

    def run_one(ctx_, trial, progress):
        x = queued[-1]["x"]
        ctx_.trials.append(_summary(len(ctx_.trials), x, later[x]))

    monkeypatch.setattr(search, "run_one", run_one)
    search.confirm_top(ctx, None)
    assert [q["x"] for q in queued] == [2, 3, 4]  # the top two, then the one that overtook them
    assert _pick(ctx).params == {"x": 4}


def test_the_best_so_far_reads_each_trial_once_however_often_it_is_asked():
    """``SearchContext.best`` (asked three times per goodput trial) reads on from where it stopped, and a list
    cleared and refilled (the history read again after the workers) from its start."""
    from types import SimpleNamespace

    from tuner.search.context import SearchContext

    class T:
        reads = 0

        def __init__(self, number, value, outcome="ok"):
            self.number, self._outcome, self.value = number, outcome, value

        @property
        def outcome(self):
            T.reads += 1
            return self._outcome

    space = SimpleNamespace(space=SimpleNamespace(objective=SimpleNamespace(direction="maximize")))
    ctx = SearchContext(*[None] * 9)
    ctx.resolved = space
    for i in range(300):
        ctx.trials.append(T(i, float(i % 50), "ok" if i % 4 else "crash"))
        T.reads = 0
        best = ctx.best
        assert ctx.best is best and T.reads == 1
    assert best.number == 49 and best.value == 49.0  # of equal values, the earlier
    ctx.trials.clear()
    ctx.trials += [T(0, 3.0), T(1, 5.0), T(2, 4.0)]
    assert ctx.best.number == 1


def test_the_baseline_s_median_keys_each_trial_once_however_often_it_is_asked():
    """The baseline's median, spread and readiness (asked after every trial by the per-trial line and the live
    panel) group the trials read since the last call: each trial's configuration keyed once, the answers those of
    grouping every trial again."""
    from types import SimpleNamespace

    from tuner.search.context import SearchContext
    from tuner.search.winner import baseline_of, group_runs

    keyed = []
    space = SimpleNamespace(space=SimpleNamespace(objective=SimpleNamespace(direction="maximize")))
    ctx = SearchContext(*[None] * 9)
    ctx.resolved = space
    ctx.target = SimpleNamespace(
        canonical_params=lambda p: keyed.append(1) or p, config=SimpleNamespace(baseline_runs=2), baseline_runs=2
    )

    def summary(i, base, value, outcome="ok", repeat_of=None):
        return SimpleNamespace(
            number=i,
            params={"x": 0 if base else 1 + i % 5},
            outcome=outcome,
            value=value,
            is_baseline=base,
            repeat_of=repeat_of,
        )

    for i in range(200):
        base = i in (0, 1, 150)  # the baseline's runs (the first crashed), one more late (a re-run)
        ctx.trials.append(summary(i, base, 10.0 + (i % 7), "ok" if i % 9 else "crash", 0 if i % 13 == 5 else None))
        keyed.clear()
        got = (ctx.baseline_value, ctx.baseline_spread, ctx.ratios_ready)
        assert len(keyed) <= 1 + 3 * 3  # this trial, and per question the baseline's (three) runs grouped again
        want = baseline_of(group_runs(ctx.trials, lambda p: p.__repr__()))
        assert got == ((want.median, want.spread, len(want.values) >= 2) if want else (None, None, False)), i
    assert ctx.ratios_ready and baseline_of(group_runs(ctx.trials, repr)).numbers == (1, 150)
