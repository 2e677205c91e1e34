"""Local worker threads ask for and sample their next trial while their current one runs (``worker_loop(ahead=
True)``, what ``tuner search --workers N`` / ``--gpus`` runs): TPE's time overlaps the trial instead of idling the
worker between trials (issue 48). A trial asked ahead and never run is told FAIL and leaves no record."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import optuna
from optuna.trial import TrialState

from search_spaces import Hardware
from storage import Repo
from tuner.search import parallel
from tuner.search.context import SearchOptions, open_optuna_storage
from tuner.search.driver import run_search
from tuner.search.heartbeat import Heartbeat

SPACE = """
name: ask-ahead
target: fake_targets:FakeTarget
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  x: {type: int, low: 0, high: 20, default: 0}
  y: {type: categorical, values: [0, 1, 2], default: 0}
"""


def test_worker_threads_sample_their_next_trial_while_the_current_one_runs(tmp_path, monkeypatch):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 's.db'}"
    sampled: list[tuple[int, str, bool]] = []  # trial, thread, whether another trial of the study was running
    real = parallel.propose

    def propose(ctx, trial):
        running = [
            t for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.number != trial.number
        ]
        sampled.append((trial.number, threading.current_thread().name, bool(running)))
        return real(ctx, trial)

    monkeypatch.setattr(parallel, "propose", propose)
    opts = SearchOptions(
        budget_s=300,
        storage_url=url,
        study="s",
        space_path=str(space),
        out_dir=str(tmp_path / "out"),
        seed=2,
        hardware=Hardware(),
        trial_timeout_s=10.0,
        confirm_top=0,
        export=False,
        converge_after=0,
        workers=2,
        n_trials=16,
        settings={
            "sleep_s": 1.0
        },  # a trial long enough that the next one is sampled while it runs, on a loaded box too
    )
    result = run_search(opts)
    ahead = [s for s in sampled if s[1].startswith("ask-ahead-")]
    assert len(ahead) >= 10, sampled  # all but each worker's first few: asked while that worker's trial ran
    assert all(s[2] for s in ahead)  # each while a trial was running
    # the study as the tuner's tables hold it: every trial finished, one record each, none left running
    study = optuna.load_study(study_name="s", storage=url)
    repo = Repo(url)
    recs = {r.number: r for r in repo.list_trials(repo.get_run("s").id)}
    trials = study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert sorted(recs) == sorted(t.number for t in trials if t.state != TrialState.FAIL)
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 16
    assert result.state == "finished"


def test_a_trial_asked_ahead_and_never_run_is_told_fail_and_its_heartbeat_stops(tmp_path):
    storage = open_optuna_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat=True)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    trial = study.ask()
    beat = Heartbeat(storage, trial._trial_id, 0.05)
    beat.__enter__()
    done: Future = Future()
    done.set_result(parallel._Asked("ask", trial, beat, {}))
    parallel._abandon(type("Ctx", (), {"study": study})(), done)
    assert study.get_trials(deepcopy=False)[0].state == TrialState.FAIL
    assert not beat._thread.is_alive()
    nothing: Future = Future()
    nothing.set_result(parallel._Asked("done"))
    parallel._abandon(type("Ctx", (), {"study": study})(), nothing)  # no trial was asked: nothing to fail
    assert len(study.get_trials(deepcopy=False)) == 1
