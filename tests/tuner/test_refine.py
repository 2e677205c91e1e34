"""The search's refinement phase: one-change moves from the best so far, in a real study on a real store."""

from types import SimpleNamespace

import optuna
from spaces import FAKE_SPACE

from search_spaces import Hardware, load_space_text, resolve
from storage import Repo
from tuner.search import refine
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search
from tuner.search.refine import REFINE_ATTR, enqueue_next, moves, next_move
from tuner.search.sampling import params_key

SPACE = """
name: refine
target: fake_targets:FakeTarget
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  impl:
    type: categorical
    values: [torch, mma]
    default: torch
  splits:
    type: pow2
    low: 1
    high: 16
    default: 1
    when: {impl: [mma]}
  tile:
    type: categorical
    values: [16, 32, 64]
    default: 32
  buckets:
    type: categorical
    values: [a, b, c, d, e]
    default: a
  scale:
    type: float
    low: 0.5
    high: 2.0
    default: 1.0
"""


def _resolved(text=SPACE):
    return resolve(load_space_text(text), Hardware())


def _diff(a: dict, b: dict) -> set:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def test_moves_change_one_value_and_bring_children_in_at_their_defaults():
    res = _resolved()
    base = {"impl": "mma", "splits": 4, "tile": 32, "buckets": "a", "scale": 1.0}
    got = {(name, value): cfg for name, value, cfg in moves(res, base)}
    # pow2 steps to its neighbours, a categorical to every other value, a float not at all
    assert set(got) == {
        ("impl", "torch"),
        ("splits", 2),
        ("splits", 8),
        ("tile", 16),
        ("tile", 64),
        ("buckets", "b"),
        ("buckets", "c"),
        ("buckets", "d"),
        ("buckets", "e"),
    }
    assert got[("impl", "torch")] == {"impl": "torch", "tile": 32, "buckets": "a", "scale": 1.0}  # child dropped
    assert all(_diff(cfg, base) == {name} for (name, _), cfg in got.items() if name != "impl")
    up = {(n, v): c for n, v, c in moves(res, {"impl": "torch", "tile": 16, "buckets": "a", "scale": 1.0})}
    assert up[("impl", "mma")]["splits"] == 1  # the child comes in at its default


def _ctx(tmp_path, trials, refuse=(), step_spread=None):
    """A study on a real SQLite store holding ``trials`` = [(params, outcome, value)]; with ``step_spread``, each
    ok trial records steps of 10 ms that spread that share of a step."""
    from storage.types import MetricRow

    res = _resolved()
    repo = Repo(f"sqlite:///{tmp_path / 'r.db'}")
    repo.create_schema()
    run = repo.create_run("s", target="fake", budget_s=60)
    for i, (params, outcome, value) in enumerate(trials):
        full = res.walk(lambda p: params.get(p.name, p.default))
        repo.start_trial(run.id, i, full)
        rows = (
            [MetricRow(m, "c=1", v, "ms") for m, v in (("step_ms", 10.0), ("step_spread_ms", 10.0 * step_spread))]
            if step_spread is not None and outcome == "ok"
            else []
        )
        if outcome is not None:
            repo.finish_trial(run.id, i, outcome=outcome, value=value, metrics=rows)

    def check(cfg):
        return "refused by a rule" if any(cfg.get(k) == v for k, v in refuse) else None

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'r.db'}", study_name="s", direction="maximize")
    return SimpleNamespace(
        repo=repo,
        run=run,
        resolved=res,
        sampling_space=res,
        stored={},
        direction="maximize",
        target=SimpleNamespace(check=check, canonical_params=lambda p: p),
        study=study,
        options=SimpleNamespace(refine_share=0.25),
    )


def test_next_move_goes_from_the_best_every_parameter_first_most_promising_first(tmp_path):
    trials = [
        ({}, "ok", 10.0),
        ({"tile": 64}, "ok", 30.0),  # the best: every move starts here
        ({"tile": 16, "buckets": "e"}, "ok", 28.0),  # evidence for buckets=e (and a little for tile=16)
        ({"tile": 64, "buckets": "b"}, None, None),  # a move already running: tried
        ({"impl": "mma"}, "crash", None),
    ]
    ctx = _ctx(tmp_path, trials, refuse=[("impl", "mma")])
    best = ctx.repo.get_trial(ctx.run.id, 1).params
    seen = []
    while (m := next_move(ctx)).origin == 1:
        assert m.old == best[m.param] and _diff(m.params, best) == {m.param}
        seen.append((m.param, m.new))
        n = len(ctx.repo.list_trials(ctx.run.id))  # the search's enqueued trial runs it: now it is tried
        ctx.repo.start_trial(ctx.run.id, n, m.params)
        ctx.repo.finish_trial(ctx.run.id, n, outcome="ok", value=20.0)
        assert len(seen) < 10, seen
    # tile=32 (the first trial) and buckets=b (running) were tried, so each parameter had one move: round 1 holds
    # buckets=e, which the trials favour, before tile=16, which they rate a little below tile=64; then the moves no
    # trial speaks for, in the space's order. impl=mma is refused by the target. After the last, every move from
    # the best was tried: a local optimum, and the moves start from the next best (trial 2, 28.0).
    assert seen == [("buckets", "e"), ("tile", 16), ("buckets", "c"), ("buckets", "d")], seen
    second = ctx.repo.get_trial(ctx.run.id, 2).params
    assert m.origin == 2 and _diff(m.params, second) == {m.param}


def test_a_move_that_wins_becomes_the_origin_of_the_next(tmp_path):
    ctx = _ctx(tmp_path, [({}, "ok", 10.0), ({"tile": 64}, "ok", 12.0)])
    m = next_move(ctx)
    ctx.repo.start_trial(ctx.run.id, 2, m.params)
    ctx.repo.finish_trial(ctx.run.id, 2, outcome="ok", value=50.0)
    first = next_move(ctx)
    assert first.origin == 2
    # enqueued (by another worker, say) but not yet started: not made twice
    enqueue_next(ctx)
    assert first.params != next_move(ctx).params


def test_search_spends_its_last_share_on_moves_from_the_best(tmp_path, sqlite_url):
    text = FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")
    space = tmp_path / "space.yaml"
    space.write_text(text)
    opts = SearchOptions(
        budget_s=120,
        storage_url=sqlite_url,
        study="s",
        space_path=str(space),
        seed=1,
        out_dir=str(tmp_path / "out"),
        hardware=Hardware(),
        trial_timeout_s=5.0,
        confirm_top=0,
        n_trials=10,
        refine_share=0.4,
    )
    res = run_search(opts)
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    numbers = [t.number for t in study.trials if REFINE_ATTR in t.user_attrs]
    by_number = {t.number: t for t in res.trials}
    keys = [params_key(t.params) for t in res.trials]
    for n in range(6, 10):  # the last 40% of the 10 trials: moves, while any of the 8 configurations is untried
        assert n in numbers or len(set(keys[:n])) == 8, n
    assert set(range(6, 10)) & set(numbers)
    for n in numbers:
        origin = by_number[study.trials[n].user_attrs[REFINE_ATTR]]
        before = [t for t in res.trials if t.number < n and t.outcome == "ok"]
        assert origin.value == max(t.value for t in before)  # from the best so far
        assert _diff(by_number[n].params, origin.params) == {"x"}  # one change
        assert keys[n] not in keys[:n]  # never a configuration already tried
    # the fake's value grows with x: the phase can only keep or raise the best
    assert res.best_value >= max(t.value for t in res.trials[:6] if t.value is not None)


def test_no_refinement_when_its_share_is_zero(tmp_path, sqlite_url):
    space = tmp_path / "space.yaml"
    space.write_text(FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"))
    opts = SearchOptions(
        budget_s=120,
        storage_url=sqlite_url,
        study="s",
        space_path=str(space),
        seed=1,
        out_dir=str(tmp_path / "out"),
        hardware=Hardware(),
        trial_timeout_s=5.0,
        confirm_top=0,
        n_trials=6,
        refine_share=0.0,
    )
    run_search(opts)
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    assert not any(REFINE_ATTR in t.user_attrs for t in study.trials)


def test_a_parameter_that_already_had_moves_waits_its_round():
    from tuner.search.refine import _order

    cands = [(0.5, "buckets", "e", {}), (-0.1, "tile", 16, {}), (0.0, "buckets", "c", {})]
    assert [c[2] for c in _order(cands, {})] == ["e", 16, "c"]  # round 0 by gain, then buckets' second
    assert [c[2] for c in _order(cands, {"buckets": 1})] == [16, "e", "c"]  # buckets had a move already


def test_a_configuration_proposed_again_is_followed_by_a_move_from_the_best(tmp_path, sqlite_url):
    space = tmp_path / "space.yaml"  # 8 configurations in all: TPE repeats itself well before 14 trials
    space.write_text(FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"))
    opts = SearchOptions(
        budget_s=120,
        storage_url=sqlite_url,
        study="s",
        space_path=str(space),
        seed=1,
        out_dir=str(tmp_path / "out"),
        hardware=Hardware(),
        trial_timeout_s=5.0,
        confirm_top=0,
        n_trials=14,
        refine_share=0.01,
    )  # the window: only the last trial
    res = run_search(opts)
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # no move left queued for a later ask
    repeats = [t.number for t in res.trials if "not run again" in t.reason]
    assert repeats, "the test needs TPE to repeat itself"
    for n in repeats:
        run_before = {params_key(t.params) for t in res.trials[: n + 1]}
        if n + 1 < len(res.trials) and len(run_before) < 8:
            assert REFINE_ATTR in study.trials[n + 1].user_attrs, n
            assert "not run again" not in res.trials[n + 1].reason


def _block_warps_space():
    """A two-parameter kernel space (BLOCK, warps) for the chooser's tests."""
    from search_spaces.hardware import Hardware
    from search_spaces.loader import load_space_text
    from search_spaces.resolve import resolve

    return resolve(
        load_space_text("""
name: t
target: kernels
objective: {metric: time_us, direction: minimize, combine: level, levels: [1], level: 1}
params:
  BLOCK: {type: categorical, values: [16, 32, 64], default: 32}
  warps: {type: categorical, values: [2, 4, 8], default: 4}
"""),
        Hardware(),
    )


def test_choose_move_reads_plain_records_and_honours_check_and_asked():
    """The chooser the search and the kernel-search replay (benchmarks/tuner_efficiency.py) share: the best record is
    the origin, a repeat's copied value never is, refused and asked configurations are skipped."""
    from types import SimpleNamespace as R

    from tuner.search.refine import choose_move
    from tuner.search.sampling import params_key

    resolved = _block_warps_space()
    recs = [
        R(number=0, params={"BLOCK": 32, "warps": 4}, outcome="ok", value=10.0, repeat_of=None),
        R(number=1, params={"BLOCK": 64, "warps": 4}, outcome="ok", value=8.0, repeat_of=None),
        R(number=2, params={"BLOCK": 16, "warps": 2}, outcome="ok", value=1.0, repeat_of=0),
        R(number=3, params={"BLOCK": 16, "warps": 8}, outcome="failed", value=None, repeat_of=None),
    ]
    m = choose_move(resolved, recs, "minimize", lambda c: None)
    assert m.origin == 1 and {**m.params} != {"BLOCK": 64, "warps": 4}
    assert sum(m.params[k] != v for k, v in {"BLOCK": 64, "warps": 4}.items()) == 1
    refuse_block = choose_move(resolved, recs, "minimize", lambda c: "no" if c["BLOCK"] != 64 else None)
    assert refuse_block.param == "warps"
    asked = {params_key({"BLOCK": 64, "warps": w}) for w in (2, 8)}
    # every move from the best refused or asked, none from the next (32, 4) allowed, the repeat never an origin
    assert choose_move(resolved, recs, "minimize", lambda c: "no" if c["BLOCK"] != 64 else None, asked) is None
    from_next = choose_move(resolved, recs, "minimize", lambda c: "no" if c["BLOCK"] != 32 else None)
    assert from_next.origin == 0 and from_next.param == "warps" and from_next.params["BLOCK"] == 32


def test_no_move_goes_to_a_configuration_that_runs_the_same_thing_as_a_tried_one():
    """With the target's canonical form (here: warps is a no-op once BLOCK is 64), a one-change move that only
    changes warps from the best (BLOCK 64) is a tried configuration: the chooser takes a BLOCK move instead."""
    from types import SimpleNamespace as R

    from tuner.search.refine import choose_move

    resolved = _block_warps_space()

    def canonical(p):
        return {**p, "warps": 4} if p["BLOCK"] == 64 else p

    recs = [
        R(number=0, params={"BLOCK": 32, "warps": 4}, outcome="ok", value=10.0, repeat_of=None),
        R(number=1, params={"BLOCK": 64, "warps": 4}, outcome="ok", value=8.0, repeat_of=None),
        R(number=2, params={"BLOCK": 16, "warps": 2}, outcome="ok", value=20.0, repeat_of=None),
    ]
    plain = choose_move(resolved, recs, "minimize", lambda c: None)
    assert plain.origin == 1 and plain.param == "warps"  # warps 2 and 8 score as untried: the plain chooser goes there
    same = choose_move(resolved, recs, "minimize", lambda c: None, canonical=canonical)
    assert same.origin == 1 and same.param == "BLOCK" and same.params["warps"] == 4


def test_undo_moves_come_first_each_change_of_the_best_back_to_its_default(tmp_path):
    """On an H200 the best was beaten 1.15-1.30x by undoing five of its own changes, and the refinement never moved
    back toward a default. Here the trials favour buckets=c and tile=16, yet the first moves from the best undo its
    changes one at a time (impl, tile, buckets back to their defaults), before any other move."""
    trials = [
        ({}, "ok", 10.0),
        ({"impl": "mma", "splits": 4, "tile": 64, "buckets": "e"}, "ok", 30.0),  # the best: 3 changes + a child
        ({"tile": 16, "buckets": "c"}, "ok", 28.0),
    ]  # evidence for buckets=c and tile=16
    ctx = _ctx(tmp_path, trials)
    best = ctx.repo.get_trial(ctx.run.id, 1).params
    defaults = ctx.resolved.defaults()
    seen = []
    for _ in range(4):
        m = next_move(ctx)
        assert m.origin == 1
        seen.append((m.param, m.new))
        # one change undone (impl back to torch drops its child splits)
        assert _diff(m.params, best) == ({"impl", "splits"} if m.param == "impl" else {m.param})
        n = len(ctx.repo.list_trials(ctx.run.id))
        ctx.repo.start_trial(ctx.run.id, n, m.params)
        ctx.repo.finish_trial(ctx.run.id, n, outcome="ok", value=20.0)
    assert {p for p, _ in seen[:3]} == {"impl", "tile", "buckets"}, seen
    assert all(new == defaults[p] for p, new in seen[:3]), seen
    assert seen[3][0] not in defaults or seen[3][1] != defaults[seen[3][0]], seen  # then the rest


def test_a_move_that_ties_within_the_noise_with_fewer_changes_is_kept_as_the_origin(tmp_path):
    """A configuration 1.7% below the best, inside the best's measured 3% step noise, with one change where the
    best has three: the moves go on from it (it is kept), not from the best."""
    trials = [({}, "ok", 10.0), ({"impl": "mma", "tile": 64, "buckets": "e"}, "ok", 30.0), ({"tile": 64}, "ok", 29.5)]
    ctx = _ctx(tmp_path, trials, step_spread=0.03)
    assert next_move(ctx).origin == 2
    (tmp_path / "b").mkdir()
    outside = _ctx(tmp_path / "b", [({}, "ok", 10.0), trials[1], ({"tile": 64}, "ok", 28.0)], step_spread=0.03)
    assert next_move(outside).origin == 1  # 6.7% below: not a tie, the best stays the origin


def test_stored_trials_reads_the_study_once_then_only_what_changed_and_waits_for_a_gap_a_while(tmp_path, monkeypatch):
    monkeypatch.setattr(refine, "RECENT", 3)
    ctx = _ctx(tmp_path, [({}, "ok", 10.0), ({"tile": 64}, None, None), ({"tile": 32}, "ok", 11.0)])
    repo = ctx.repo
    calls = []

    class Spy:
        def list_trials(self, *a, **k):
            calls.append(("all",))
            return repo.list_trials(*a, **k)

        def trials_from(self, run_id, above, also=()):
            calls.append(("from", above, sorted(also)))
            return repo.trials_from(run_id, above, also)

    ctx.repo = Spy()
    first = refine.stored_trials(ctx)
    assert [(r.number, r.state) for r in first] == [(0, "complete"), (1, "running"), (2, "complete")]
    repo.finish_trial(ctx.run.id, 1, outcome="ok", value=12.0)
    for n in (3, 5):  # 4 is asked but not stored yet (its worker waits for a GPU)
        repo.start_trial(ctx.run.id, n, {"n": n})
        repo.finish_trial(ctx.run.id, n, outcome="ok", value=float(n))
    second = refine.stored_trials(ctx)  # above the complete prefix (2), and trial 1, running when last read
    assert [(r.number, r.value) for r in second] == [(0, 10.0), (1, 12.0), (2, 11.0), (3, 3.0), (5, 5.0)]
    repo.start_trial(ctx.run.id, 4, {"n": 4})
    third = refine.stored_trials(ctx)  # the gap at 4 holds the prefix at 3: trial 4 arrives
    assert [r.number for r in third] == [0, 1, 2, 3, 4, 5] and third[4].state == "running"
    for n in (7, 8, 9):  # 6 never comes (its worker died before storing it)
        repo.start_trial(ctx.run.id, n, {"n": n})
        repo.finish_trial(ctx.run.id, n, outcome="ok", value=float(n))
    refine.stored_trials(ctx)
    refine.stored_trials(ctx)  # 6 is more than RECENT behind the newest (9): it no longer holds the prefix back
    assert calls == [("all",), ("from", 2, [1]), ("from", 3, []), ("from", 5, [4]), ("from", 6, [4])]


def _random_records(rng, resolved, n, *, positive=True):
    """``n`` records as the store holds them: ok ones (some tying in value), failures, repeats, running ones."""
    from types import SimpleNamespace as R

    out = []
    for i in range(n):
        params = resolved.walk(lambda p: rng.choice(list(p.choices())) if p.type != "float" else p.default)
        kind = rng.random()
        outcome, state = ("ok", "complete") if kind < 0.6 else ("crash", "failed") if kind < 0.8 else (None, "running")
        value = (rng.choice([1.0, 2.5, rng.uniform(0.1, 40.0)]) * (1 if positive else rng.choice([-1, 1]))) or 1.0
        repeat = rng.choice([None, None, None, 0]) if outcome == "ok" else None
        out.append(
            R(number=i, params=params, outcome=outcome, value=value if outcome else None, state=state, repeat_of=repeat)
        )
    return out


def test_the_move_index_kept_record_by_record_chooses_as_a_read_of_every_record():
    """The index refining keeps up to date (records added, running ones finishing, one changed) gives the moves,
    origins and per-value means of the records read whole: the means to the last bit."""
    import random
    from types import SimpleNamespace as R

    from tuner.search.refine import MoveIndex, StoredTrials, _value_scores, choose_move

    resolved = _resolved()
    defaults = resolved.defaults()
    for seed, positive in ((0, True), (1, True), (2, False)):
        rng = random.Random(seed)
        records = _random_records(rng, resolved, 300, positive=positive)
        stored, index = StoredTrials(), MoveIndex(resolved, None, "maximize")
        for step in range(0, 300, 30):
            for r in records[step : step + 30]:
                stored.put(r)
            for r in rng.sample(records[: step + 30], 5):  # running ones finish; a record read again changes
                if r.state == "running":
                    r = R(**{**vars(r), "state": "complete", "outcome": "ok", "value": rng.uniform(0.1, 40.0)})
                    records[r.number] = r
                stored.put(r)
            index.sync(stored)
            now = [stored[n] for n in stored.numbers]
            ok = [r for r in now if r.outcome == "ok" and r.repeat_of is None]
            means = _value_scores(ok, 1.0)
            assert means and all(index.scores().get(k) == v for k, v in means.items())
            for noise in (0.0, 0.3):
                for check in (lambda c: None, lambda c: "no" if c["tile"] == 16 else None):
                    whole = choose_move(resolved, now, "maximize", check, defaults=defaults, noise=noise)
                    kept = choose_move(resolved, [], "maximize", check, defaults=defaults, noise=noise, index=index)
                    assert whole == kept, (seed, step)


def test_a_move_reads_the_records_that_changed_not_every_record(tmp_path, monkeypatch):
    """Keying a record (its configuration's identity, a JSON dump) is what a move cost per record: after the first,
    a move keys the records that changed since the last one and its candidate moves, however many the study holds."""
    keyed = []
    real_key = refine._key
    monkeypatch.setattr(refine, "_key", lambda *a: keyed.append(1) or real_key(*a))
    per_move = {}
    for size in (20, 80):
        trials = [({"tile": [16, 32, 64][i % 3], "buckets": "abcde"[i % 5]}, "ok", float(i % 11)) for i in range(size)]
        (tmp_path / str(size)).mkdir()
        ctx = _ctx(tmp_path / str(size), trials)
        next_move(ctx)
        ctx.repo.start_trial(ctx.run.id, size, {"tile": 16, "buckets": "b"})
        ctx.repo.finish_trial(ctx.run.id, size, outcome="ok", value=3.0)
        keyed.clear()
        next_move(ctx)
        per_move[size] = len(keyed)
    assert per_move[80] == per_move[20], per_move
