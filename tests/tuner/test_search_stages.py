"""Stages and convergence (``tuner.search.stages``): the rule itself, a search that converges and ends early
with the export and the budget it left, and the command stage before the code changes."""

import math
from pathlib import Path

import optuna
import pytest
from spaces import FAKE_SPACE

from search_spaces import Hardware, load_space, resolve
from storage import Repo
from tuner.search import Progress
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search
from tuner.search.stages import MIN_GAIN, REPEAT_SHARE, StagePlan, converged, plan

CPU = Hardware()

STAGED_SPACE = """
name: fake-stages
target: fake_targets:FakeTarget
settings: {sleep_s: 0.0}
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  x:
    type: categorical
    server: {flag: --x}
    values: [0, 1, 2, 3]
    default: 0
  boost:
    type: categorical
    server: {none: no launch flag gives it (a code change), deploys_as: 0}
    values: [0, 4]
    default: 0
"""


class Lines(Progress):
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)


def _opts(tmp_path, url, text, **kw):
    p = tmp_path / "space.yaml"
    p.write_text(text)
    base = dict(
        budget_s=240,
        storage_url=url,
        study="s",
        space_path=str(p),
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=CPU,
        trial_timeout_s=20.0,
        confirm_top=0,
        refine_share=0.0,
    )
    base.update(kw)
    return SearchOptions(**base)


# -- the rule ------------------------------------------------------------------------------------------------
def test_no_gain_beyond_the_noise_over_the_stretch_with_repeats_crowding_converges():
    values = [10.0, 12.0, 12.5] + [12.1] * 6
    repeats = [False] * 3 + [True, False, True, False, True, False]
    v = converged(values, repeats, None, stretch=6, noise=0.05, maximize=True)
    assert v is not None and v.stretch == 6 and v.repeats == 3


def test_a_gain_beyond_the_noise_inside_the_stretch_does_not_converge():
    values = [10.0, 12.0, 12.5, 12.1, 12.1, 14.0, 12.1, 12.1, 12.1]
    repeats = [False, False, False, True, True, False, True, True, False]
    assert converged(values, repeats, None, stretch=6, noise=0.05, maximize=True) is None
    # the same gain inside the noise (15%) is no gain
    assert converged(values, repeats, None, stretch=6, noise=0.15, maximize=True) is not None


def test_without_repeats_it_takes_twice_the_stretch():
    values = [10.0, 12.0] + [11.0] * 6
    assert converged(values, [False] * 8, None, stretch=6, noise=0.01, maximize=True) is None
    values += [11.0] * 6
    v = converged(values, [False] * 14, None, stretch=6, noise=0.01, maximize=True)
    assert v is not None and v.stretch == 12


def test_the_stretch_grows_with_the_stage_and_zero_turns_it_off():
    values, repeats = [10.0] + [9.0] * 99, [False] + [True] * 99
    assert converged(values, repeats, None, stretch=0, noise=0.0, maximize=True) is None
    assert converged(values, repeats, None, stretch=5, noise=0.0, maximize=True).stretch == 20  # a fifth of 100


def test_a_stage_that_converged_hands_its_time_to_the_next_and_the_last_one_ends_the_search(tmp_path):
    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    stages = plan(resolved, deployable_only=False)
    assert [s.name for s in stages] == ["command", "code changes"]
    assert [p.name for p in stages[0].resolved.params] == ["x"] and stages[0].resolved.fixed["boost"] == 0
    sp = StagePlan(stages, stretch=4)

    class T:
        turned_away = 0  # a TrialSummary's: repeat proposals turned away before the trial

        def __init__(self, value, repeat_of=None):
            self.value, self.repeat_of, self.outcome, self.is_baseline = value, repeat_of, "ok", False

    trials = [T(10.0), T(12.0)] + [T(12.0, 1)] * 4
    line = sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1000.0, now=100.0)
    assert line.startswith("stage 'command' ends after 6 trials (converged") and "900" not in line
    assert "15.0 min left" in line and sp.current.name == "code changes" and not sp.done
    trials += [T(30.0)] + [T(30.0, 6)] * 2  # the new stage's own trials: fewer than the stretch
    assert sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1000.0, now=200.0) is None
    trials += [T(30.0, 6)] * 2
    line = sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1000.0, now=210.0)
    assert line.startswith("stage 'code changes' converged") and sp.done


def test_a_stage_that_spent_its_share_ends_without_converging(tmp_path):
    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    sp = StagePlan(plan(resolved, deployable_only=False), stretch=0)

    class T:
        turned_away = 0  # a TrialSummary's: repeat proposals turned away before the trial

        value, repeat_of, outcome, is_baseline = 10.0, None, "ok", False

    assert sp.observe([T()], maximize=True, noise=0.0, started=0.0, trials_end=100.0, now=49.0) is None
    line = sp.observe([T(), T()], maximize=True, noise=0.0, started=0.0, trials_end=100.0, now=50.0)
    assert "its share of the time is spent" in line and sp.current.name == "code changes"


def test_trials_the_target_refused_before_running_do_not_count_toward_convergence(tmp_path):
    """An H200 main job's code-changes stage "converged" after 80 trials of which 42 were refused before running
    (``invalid_config``, constraints, in no time) and 38 were pruned: not one whole measurement of a code change.
    Refused trials say nothing of the objective; pruned ones (measured, and worse) still count."""
    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    sp = StagePlan(plan(resolved, deployable_only=False), stretch=4)

    class T:
        turned_away, repeat_of, is_baseline = 0, None, False

        def __init__(self, value, outcome="ok"):
            self.value, self.outcome = value, outcome

    trials = [T(10.0), T(12.0)] + [T(None, "invalid_config")] * 8  # quiet for twice the stretch, none ran
    assert sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1000.0, now=10.0) is None
    assert sp.current.name == "command"
    trials += [T(None, "pruned")] * 8  # eight that ran and were worse: twice the stretch, no repeats
    line = sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1000.0, now=20.0)
    assert line.startswith("stage 'command' ends after 18 trials (converged: no better configuration")
    assert "in its last 8 trials" in line


def test_the_stages_share_the_time_left_once_the_baseline_s_runs_are_done(tmp_path):
    """Two baseline runs took 60 s of a 120-s time for trials: the command stage gets half of the 60 s left, not
    half of the 120 (it had ended before its first trial, and a CPU main job's command stage never ran)."""
    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    sp = StagePlan(plan(resolved, deployable_only=False), stretch=0)

    class T:
        turned_away = 0  # a TrialSummary's: repeat proposals turned away before the trial

        def __init__(self, baseline=False):
            self.value, self.repeat_of, self.outcome, self.is_baseline = 10.0, None, "ok", baseline

    trials = [T(True)]
    assert sp.observe(trials, maximize=True, noise=0.0, started=0.0, trials_end=120.0, now=30.0) is None
    trials.append(T(True))
    assert sp.observe(trials, maximize=True, noise=0.0, started=0.0, trials_end=120.0, now=60.0) is None
    trials.append(T())
    assert sp.observe(trials, maximize=True, noise=0.0, started=0.0, trials_end=120.0, now=75.0) is None
    assert sp.current.name == "command"  # 60 + 30 s is its end
    trials.append(T())
    line = sp.observe(trials, maximize=True, noise=0.0, started=0.0, trials_end=120.0, now=90.0)
    assert line.startswith("stage 'command' ends after 2 trials (its share of the time is spent)")


def _write(tmp_path, text):
    p = tmp_path / "rule.yaml"
    p.write_text(text)
    return p


# -- whole searches ------------------------------------------------------------------------------------------
def test_a_search_that_mapped_its_space_ends_early_with_the_export_and_the_budget_it_left(tmp_path, sqlite_url):
    small = FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]").replace(
        "values: [0, 1, 2, 3, 4, 5, 6, 7]", "values: [0, 1, 2]"
    )
    progress = Lines()
    res = run_search(_opts(tmp_path, sqlite_url, small, converge_after=4), progress)
    assert res.state == "finished"
    assert res.stop_reason.startswith("stage 'search' converged: no better configuration beyond the noise")
    assert "budget left" in res.stop_reason and res.elapsed_s < 200
    assert res.best_params["x"] == 2 and (tmp_path / "out" / "s" / "launch.sh").exists()
    assert any(line.startswith("stage 'search' converged") for line in progress.lines)
    # stored: an overnight search says why it ended to whoever reads the study later (`tuner status`, the API's feed)
    repo = Repo(sqlite_url)
    assert repo.end_reason(repo.get_run("s").id) == res.stop_reason


def test_the_command_stage_runs_the_deployable_values_first_then_the_code_changes(tmp_path, sqlite_url):
    progress = Lines()
    res = run_search(_opts(tmp_path, sqlite_url, STAGED_SPACE, converge_after=4), progress)
    ended = next(i for i, line in enumerate(progress.lines) if line.startswith("stage 'command' ends"))
    assert "converged" in progress.lines[ended] or "exhausted" in progress.lines[ended]
    run = Repo(sqlite_url).get_run("s")
    recs = Repo(sqlite_url).list_trials(run.id)
    first_boost = next(r.number for r in recs if r.params["boost"] == 4)
    command_trials = [r for r in recs if r.number < first_boost and not r.is_baseline]
    assert len(command_trials) >= 4 and all(r.params["boost"] == 0 for r in command_trials)
    assert res.best_params == {"x": 3, "boost": 4}  # the code change is found after the command's values
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    assert len(study.trials) == len(recs)


OPENING_SPACE = (
    STAGED_SPACE
    + """  knob:
    type: categorical
    server: {none: a code change the fake target ignores, deploys_as: 0}
    values: [0, 1, 2]
    default: 0
"""
)


class Order(Progress):
    """Messages and trial starts, in the order they came."""

    def __init__(self):
        self.events = []

    def message(self, text):
        self.events.append(("message", text))

    def trial_started(self, number, params):
        self.events.append(("trial", number))


def test_the_code_changes_stage_opens_with_one_change_moves_from_the_command_s_best(tmp_path, sqlite_url):
    """What each code change buys on top of the command is measured first: the code-changes stage opens with
    one-change moves from the best so far (the command stage's, then any move that beat it), as many as there were
    untried moves from the command's best, before TPE samples the whole space (whose samples change many values at
    once: on an H200 none of 38 measured ones beat the command, one change away from it)."""
    from tuner.search.refine import REFINE_ATTR

    order = Order()
    run_search(_opts(tmp_path, sqlite_url, OPENING_SPACE, converge_after=4, refine_share=0.25), order)
    at = next(i for i, (k, v) in enumerate(order.events) if k == "message" and v.startswith("stage 'command' ends"))
    second = [n for k, n in order.events[at + 1 :] if k == "trial"]
    before = {n for k, n in order.events[:at] if k == "trial"}
    repo = Repo(sqlite_url)
    recs = {r.number: r for r in repo.list_trials(repo.get_run("s").id)}
    key = ("x", "boost", "knob")

    def cfg(n):
        return tuple(recs[n].params[k] for k in key)

    tried = {cfg(n) for n in before}
    best = max((recs[n] for n in before if recs[n].outcome == "ok"), key=lambda r: r.value)
    b = cfg(best.number)
    values = ([0, 1, 2, 3], [0, 4], [0, 1, 2])
    one_change = {b[:i] + (v,) + b[i + 1 :] for i, vs in enumerate(values) for v in vs if v != b[i]}
    untried = one_change - tried
    assert {(b[0], 4, 0), (b[0], 0, 1), (b[0], 0, 2)} <= untried  # the code changes, each alone
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    attrs = {t.number: t.user_attrs for t in study.trials}
    opened = second[: len(untried)]
    assert all(REFINE_ATTR in attrs[n] for n in opened), [(n, cfg(n)) for n in opened]
    for n in opened:  # each one value away from the trial it moved from
        origin = cfg(attrs[n][REFINE_ATTR])
        assert sum(a != c for a, c in zip(origin, cfg(n))) == 1, (origin, cfg(n))
    assert cfg(opened[0]) in untried  # the first from the command stage's best


def test_worker_threads_move_past_an_exhausted_stage_and_end_when_the_last_is_exhausted(tmp_path, sqlite_url):
    """Three worker threads, convergence off, a 4 x 2 space: the command stage's 4 values are spent long before its
    share of 4 minutes, the code changes' 8 soon after. The threads move the plan on once (not once each) and end
    the search with the export; they re-asked repeats until each stage's share ran out (half the budget idle)."""
    progress = Lines()
    res = run_search(_opts(tmp_path, sqlite_url, STAGED_SPACE, converge_after=0, workers=3), progress)
    moved = [line for line in progress.lines if line.startswith("stage 'command' ends")]
    assert len(moved) == 1 and "its space is exhausted" in moved[0], progress.lines
    assert res.state == "finished" and res.elapsed_s < 120, (res.elapsed_s, res.stop_reason)
    assert res.stop_reason.startswith("search space exhausted"), res.stop_reason
    # spent is the rule's own word: the last 25 proposals, every thread's in finishing order, repeated timed ones
    # (with refining off, TPE may leave a configuration untried); and the search still exported its best
    assert all(t.repeat_of is not None for t in res.trials[-25:]), [t.repeat_of for t in res.trials[-25:]]
    assert res.best_params["boost"] == 4 and (tmp_path / "out" / "s" / "launch.sh").exists()


def test_repeats_in_a_row_count_the_current_stage_s_trials_and_none_for_a_worker_process_s_plan(tmp_path):
    from types import SimpleNamespace

    from tuner.search.stages import repeats_in_a_row

    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    trials = [SimpleNamespace(repeat_of=None)] * 3 + [SimpleNamespace(repeat_of=1)] * 30
    search = StagePlan(plan(resolved, deployable_only=False))
    assert repeats_in_a_row(SimpleNamespace(stages=search, trials=trials)) == (30, 0)
    search.index, search.first = 1, 20  # the next stage started at trial 20: its 13 repeats so far
    assert repeats_in_a_row(SimpleNamespace(stages=search, trials=trials)) == (13, 1)
    worker = StagePlan(plan(resolved, deployable_only=False), follower=True)  # `tuner worker`: the search decides
    assert repeats_in_a_row(SimpleNamespace(stages=worker, trials=trials)) == (0, 0)


@pytest.mark.parametrize("deployable_only,names", [(False, ["command", "code changes"]), (True, ["command"])])
def test_the_dry_run_shows_the_planned_stages_and_their_shares(tmp_path, sqlite_url, deployable_only, names):
    settings = {"deployable_only": True} if deployable_only else {}
    res = run_search(_opts(tmp_path, sqlite_url, STAGED_SPACE, dry_run=True, settings=settings))
    stages = [v for k, v in res.preflight.facts.items() if k.startswith("stage ")]
    assert [s.split(":")[0] for s in stages] == names
    assert ("50% of the time for trials (about 2 min)" in stages[0]) == (not deployable_only)
    assert "convergence" in res.preflight.facts


# -- the export's "this command" from the command stage -------------------------------------------------------
def _store(repo, run, number, params, value):
    repo.start_trial(run.id, number, params)
    repo.finish_trial(run.id, number, outcome="ok", value=value, duration_s=1.0)


@pytest.mark.parametrize("projected_value,expect_command_stage", [(None, True), (12.0, True), (25.0, False)])
def test_this_command_is_the_command_stages_best_when_it_measured_better_than_the_bests_values_as_a_command(
    sqlite_url, projected_value, expect_command_stage
):
    from spaces import tiny_workload_run

    from tuner.targets.workload.deploy import command_config, command_stage_best

    def best_command(repo, run, space, arch, projected):
        return command_stage_best(repo, run.id, run.direction != "minimize", space, arch, projected)

    repo, run, space = tiny_workload_run(sqlite_url, "staged", 600)
    arch = "sm_90"
    defaults = command_config(space, space.defaults(), arch).params  # what the command runs by default
    command_best = {**defaults, "context_length": 4096}
    best = {**defaults, "context_length": 65536, "indexer_width": "live"}  # indexer_width=live: a code change
    assert not command_config(space, command_best, arch).changes and command_config(space, best, arch).changes
    _store(repo, run, 0, defaults, 10.0)
    _store(repo, run, 1, command_best, 20.0)
    _store(repo, run, 2, best, 30.0)
    projected = command_config(space, best, arch)
    if projected_value is not None:  # the side-by-side run of the best with its code changes taken out
        _store(repo, run, 3, projected.params, projected_value)
    got = best_command(repo, run, space, arch, projected)
    assert (got is not None and got.number == 1) == expect_command_stage
    assert best_command(repo, run, space, arch, command_config(space, command_best, arch)) is None  # deployable


def test_a_command_that_measured_no_gain_beyond_the_noise_is_not_exported_the_baseline_is(sqlite_url):
    """On an H200 the command stage's best was a context cap of 262144, 0.2% over SGLang's defaults whose two runs
    spread 0.2% too: the export then cut the server's context from 1M for nothing. Among the commands within the
    noise of the best, the one with the fewest changes from the baseline is the command."""
    from spaces import tiny_workload_run

    from tuner.targets.workload.deploy import command_config, command_stage_best, deployment

    repo, run, space = tiny_workload_run(sqlite_url, "parsimonious", 600)
    arch = "sm_90"
    defaults = command_config(space, space.defaults(), arch).params
    for number, value in ((0, 10.0), (1, 10.2)):  # the baseline, run twice: 2% apart
        repo.start_trial(run.id, number, defaults, is_baseline=True)
        repo.finish_trial(run.id, number, outcome="ok", value=value, duration_s=1.0)
    capped = {**defaults, "context_length": 4096}
    _store(repo, run, 2, capped, 10.15)  # the best command by 0.5%: within the noise
    best = {**defaults, "context_length": 65536, "indexer_width": "live"}  # a code change
    _store(repo, run, 3, best, 30.0)
    projected = command_config(space, best, arch)
    got = command_stage_best(repo, run.id, True, space, arch, projected)
    assert got is not None and got.number == 0 and got.parsimony.switched
    dep = deployment(space, best, arch, None, staged=got)
    assert dep.params["context_length"] == defaults["context_length"]
    assert "x the space's default configuration" in dep.predictions  # the tiny preset has no deployment map
    assert any("the fewest changes from the baseline" in line for line in dep.lines), dep.lines
    _store(repo, run, 4, capped, 13.0)  # the cap re-run far beyond the noise: now it is the command
    _store(repo, run, 5, capped, 13.1)
    assert command_stage_best(repo, run.id, True, space, arch, projected).number == 2


def test_the_predictions_say_their_base_is_sglangs_default_path_where_the_map_covers_the_gpu():
    from tuner.targets.workload.deploy import deployment

    space = load_space(str(Path(__file__).resolve().parents[2] / "search_spaces" / "dsv4_flash.yaml"))
    on_h200 = deployment(space, space.defaults(), "sm_90", None)
    assert "x the baseline, SGLang's default path on sm_90 as the twin ran it" in on_h200.predictions
    elsewhere = deployment(space, space.defaults(), None, None)
    assert "x the space's default configuration" in elsewhere.predictions


def test_the_search_stores_each_stage_it_moves_to_and_a_worker_process_follows_it(tmp_path, sqlite_url):
    """`tuner worker` processes on other hosts sampled the whole space while the search was in its command stage:
    the search now stores each move (a `stage_started` event) and a worker's plan follows the stored stage."""
    from types import SimpleNamespace

    from tuner.search.stages import follow_stage

    run_search(_opts(tmp_path, sqlite_url, STAGED_SPACE))
    repo = Repo(sqlite_url)
    run = repo.get_run("s")
    moves = [e.payload for e in repo.events_after(run.id) if e.kind == "stage_started"]
    assert moves and moves[0]["index"] == 1 and moves[0]["name"] == "code changes"
    assert repo.current_stage(run.id) == 0  # the search ended: a resumed one starts its stages again

    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)
    worker = SimpleNamespace(
        stages=StagePlan(plan(resolved, deployable_only=False), follower=True), repo=repo, run=run, trials=[1, 2]
    )
    follow_stage(worker)
    assert worker.stages.current.name == "command"
    repo.add_stage(run.id, 1, "code changes", "stage 'command' ends ...")
    follow_stage(worker)
    assert worker.stages.current.name == "code changes" and worker.stages.first == 2
    # a follower never ends a stage on its own
    assert worker.stages.observe([], maximize=True, noise=0.0, started=0.0, trials_end=1.0, now=5.0) is None


def test_the_rule_kept_trial_by_trial_agrees_with_the_rule_over_the_whole_stage_read_again():
    """:class:`StretchTrack` (appended one trial at a time, as the plan keeps it) against the rule written out over
    the stage's lists: random stages with failures, repeats, ties, NaN and infinities, both directions."""
    import random

    from tuner.search.stages import StretchTrack

    def written_out(values, repeats, best_before, stretch, noise, maximize):  # the rule as it read before
        n = len(values)
        stretch = max(stretch, math.ceil(0.2 * n))
        if n < stretch:
            return None
        gain = max(noise, MIN_GAIN)

        def best_of(vals, start):
            out = start
            for v in vals:
                if v is not None and math.isfinite(v) and (out is None or (v > out if maximize else v < out)):
                    out = v
            return out

        def quiet(w):
            ref = best_of(values[: n - w], best_before)
            return ref is not None and not any(
                v is not None and not r and (v > ref * (1 + gain) if maximize else v < ref * (1 - gain))
                for v, r in zip(values[n - w :], repeats[n - w :], strict=True)
            )

        if not quiet(stretch):
            return None
        if sum(repeats[n - stretch :]) >= REPEAT_SHARE * stretch:
            return (stretch, sum(repeats[n - stretch :]))
        if n >= 2 * stretch and quiet(2 * stretch):
            return (2 * stretch, sum(repeats[n - 2 * stretch :]))
        return None

    rng = random.Random(7)
    checked = converging = 0
    for _ in range(60):
        maximize, stretch, noise = rng.random() < 0.5, rng.choice([3, 5, 8]), rng.choice([0.0, 0.02, 0.2])
        best_before = rng.choice([None, 10.0, -3.0])
        track, values, repeats = StretchTrack(best_before, maximize), [], []
        for _ in range(rng.randint(1, 120)):
            v = rng.choice([None, 10.0, 10.1, rng.uniform(-20, 20), math.nan, math.inf, -math.inf, 9.0])
            r = rng.random() < 0.3
            values.append(v)
            repeats.append(r)
            track.append(v, r)
            got = track.verdict(stretch=stretch, noise=noise)
            want = written_out(values, repeats, best_before, stretch, noise, maximize)
            assert (got.stretch, got.repeats) == want if want else got is None, (values, repeats)
            checked += 1
            converging += want is not None
    assert checked > 1000 and converging > 100


def test_observing_a_trial_reads_the_trials_since_the_last_observation_not_the_whole_stage(tmp_path):
    """The plan after each trial reads the trials it has not read yet: the trial summaries it touches per
    observation do not grow with the stage (it re-read the stage and everything before it)."""
    resolved = resolve(load_space(str(_write(tmp_path, STAGED_SPACE))), CPU)

    class T:
        turned_away = 0  # a TrialSummary's: repeat proposals turned away before the trial

        reads = 0

        def __init__(self, value, repeat_of=None):
            self._value, self.repeat_of, self.outcome, self.is_baseline = value, repeat_of, "ok", False

        @property
        def value(self):
            T.reads += 1
            return self._value

    sp = StagePlan(plan(resolved, deployable_only=False), stretch=40)
    trials, per_trial = [], {}
    for i in range(400):
        trials.append(T(10.0 * 1.02**i, None if i % 3 else 0))  # each new one a gain: no convergence
        T.reads = 0
        sp.observe(trials, maximize=True, noise=0.01, started=0.0, trials_end=1e9, now=1.0)
        per_trial[i] = T.reads
    assert not sp.done and sp.index == 0
    assert per_trial[399] == per_trial[100], per_trial
