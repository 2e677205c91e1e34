"""The kernel search end to end on a CPU: sub-studies in a real SQLite storage, trials in subprocesses, fake
kernels with known outcomes and the recorded H200 sweep replayed; files, nearest-key lookup, the cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernels.configs import config_path, lookup, read_config_file
from search_spaces import Hardware
from storage import Repo
from tuner.search.context import SearchOptions
from tuner.search.kernel_search import KernelCase, is_kernel_plan, kernel_phase, run_kernel_search, tune_cases

TINY = "kernel_tuning_fakes:TinyKernel"
REPLAY = "kernel_tuning_fakes:ReplayKernel"
CPU = Hardware()
SETTINGS = {"allow_cpu_interpreter": True}


def _options(tmp_path, sqlite_url, **kw) -> SearchOptions:
    base = dict(
        budget_s=120,
        storage_url=sqlite_url,
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=CPU,
        settings=dict(SETTINGS),
        confirm_top=2,
    )
    base.update(kw)
    return SearchOptions(**base)


def _outcomes(repo: Repo, study: str) -> dict[str, str]:
    run = repo.get_run(study)
    return {json.dumps(r.params): r.outcome for r in repo.list_trials(run.id)}


def test_tiny_kernel_failures_are_data_and_the_true_best_wins(tmp_path, sqlite_url):
    """crash (segfault) -> crash, wrong -> wrong_result (never the winner), rule -> invalid_config, search goes on."""
    t0 = time.time()
    res = tune_cases([KernelCase(TINY, {"batch": 1, "width": 8})], _options(tmp_path, sqlite_url), study="s")
    case = res.cases[0]
    outcomes = _outcomes(Repo(sqlite_url), case.study)
    assert outcomes[json.dumps({"X": 2})] == "crash"
    assert outcomes[json.dumps({"X": 3})] == "wrong_result"
    assert outcomes[json.dumps({"X": 5})] == "invalid_config"
    assert case.status == "tuned" and case.config == {"X": 4}, case
    assert case.time_us == pytest.approx(50.5) and case.default_time_us == pytest.approx(101.0)
    assert case.study == "s.tiny.batch=1,width=8"
    # the file: kernel x GPU ("cpu") x dtype x Triton version, keyed by the shape bucket
    path = config_path("tiny", "cpu", "bfloat16", directory=Path(res.config_dir))
    entry = read_config_file(path)["batch=1,width=8"]
    assert entry["config"] == {"X": 4} and entry["status"] == "tuned"
    assert time.time() - t0 < 90


def test_cache_reuses_an_earlier_result_and_retune_forces(tmp_path, sqlite_url):
    case = KernelCase(TINY, {"batch": 2, "width": 8})
    first = tune_cases([case], _options(tmp_path, sqlite_url, n_trials=3, confirm_top=0), study="c")
    assert first.cases[0].status in ("tuned", "default_kept")
    repo = Repo(sqlite_url)
    n_runs = len(repo.list_runs())
    again = tune_cases([case], _options(tmp_path, sqlite_url, n_trials=3, confirm_top=0), study="c")
    assert again.cases[0].status == "cached" and again.cases[0].config == first.cases[0].config
    assert len(repo.list_runs()) == n_runs  # no sub-study, no trial
    forced = tune_cases(
        [case],
        _options(tmp_path, sqlite_url, n_trials=2, confirm_top=0, settings={**SETTINGS, "retune": True}),
        study="c",
    )
    assert forced.cases[0].status != "cached" and forced.cases[0].study.endswith(".retune2")


def test_replayed_h200_sweep_and_nearest_key(tmp_path, sqlite_url, monkeypatch):
    """The recorded sweep behind the sparse_decode contract: baseline first, rules prune without a subprocess,
    the wrong (recorded best) config never wins; the file is what ``kernels.configs.lookup`` then loads."""
    from kernel_tuning_fakes import ReplayKernel

    k = ReplayKernel.instance
    shape = k.shapes()[0]
    res = tune_cases([KernelCase(REPLAY, shape)], _options(tmp_path, sqlite_url, n_trials=10, confirm_top=1), study="r")
    case = res.cases[0]
    repo = Repo(sqlite_url)
    trials = repo.list_trials(repo.get_run(case.study).id)
    assert trials[0].is_baseline and trials[0].params == k.default_config(shape)
    assert trials[0].value == pytest.approx(24.864, rel=1e-3)
    seeds = k.seed_configs(shape)  # the wave-filling starting points come right after the default
    assert seeds and [t.params for t in trials[1 : 1 + len(seeds)]] == seeds
    refused = [t for t in trials if t.outcome == "invalid_config"]
    assert refused, [t.outcome for t in trials]  # the recorded sweep's failures are refused by the rules
    assert all((t.duration_s or 0) < 1.0 for t in refused)  # no subprocess was spent on them
    assert case.status in ("tuned", "default_kept")
    assert tuple(case.config[c] for c in k.columns) != k.best
    assert case.time_us <= case.default_time_us
    (path,) = Path(res.config_dir).glob("sparse_decode__*.json")  # the file names the sub-study its entry came from
    assert (
        read_config_file(path)[case.shape_key]["source"]
        == f"kernel search study {case.study} (tuner search --target kernels)"
    )
    # nearest key: a batch-12 call of the real sparse_decode reads the batch-16 entry of this "GPU" ("cpu"), its split
    # count set for batch 12 (SparseDecodeKernel.adapt_config: the most splits within one wave)
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", res.config_dir)
    from kernels.configs import clear_cache
    from kernels.sparse_decode import SparseDecodeKernel

    clear_cache()
    at12 = {**shape, "batch": 12}
    assert lookup("sparse_decode", at12, "bfloat16") == {
        **case.config,
        "S": SparseDecodeKernel.instance.splits_in_one_wave(case.config, at12),
    }
    assert lookup("sparse_decode", {**shape, "heads": 32}, "bfloat16") == k.default_config({**shape, "heads": 32})
    clear_cache()


PLAN = """
name: tiny-plan
target: kernels
settings:
  dtype: float32
  allow_cpu_interpreter: true
  kernels:
    "kernel_tuning_fakes:TinyKernel": {dims: {width: 8}}
objective: {metric: time_us, direction: minimize, combine: level, levels: [1, 2], level: 1, unit: us}
params:
  batch: {type: categorical, values: [1, 2], default: 1}
"""


def test_plan_search_and_dry_run(tmp_path, sqlite_url):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    opts = _options(tmp_path, sqlite_url, space_path=str(plan), n_trials=3, confirm_top=0, settings={})
    assert is_kernel_plan(opts) and is_kernel_plan(SearchOptions(budget_s=1, target="kernels"))
    dry = run_kernel_search(SearchOptions(**{**opts.__dict__, "dry_run": True}))
    assert dry.state == "dry_run" and dry.preflight.ok and len(dry.preflight.will_run) == 2
    res = run_kernel_search(opts)
    assert [c.shape_key for c in res.cases] == ["batch=1,width=8", "batch=2,width=8"]
    assert all(c.study.startswith("tiny-plan.tiny.") for c in res.cases)
    assert len(read_config_file(config_path("tiny", "cpu", "float32", directory=Path(res.config_dir)))) == 2
    assert any("TinyKernel [batch=1,width=8]" in line for line in res.summary_lines())


def test_preflight_refuses_cpu_without_the_setting(tmp_path, sqlite_url):
    from tuner.errors import SearchError

    with pytest.raises(SearchError, match="no CUDA GPU"):
        tune_cases([KernelCase(TINY, {"batch": 1, "width": 8})], _options(tmp_path, sqlite_url, settings={}), study="x")


def test_kernel_phase_inside_a_system_search(tmp_path, sqlite_url, monkeypatch):
    """A workload-style search hands the shapes its params produce to kernel_phase; the configs dir is applied."""
    from tuner.search.context import open_context

    monkeypatch.delenv("TUNER_KERNEL_CONFIG_DIR", raising=False)
    space = tmp_path / "fake.yaml"
    space.write_text(FAKE_SPACE)
    ctx = open_context(
        _options(
            tmp_path,
            sqlite_url,
            space_path=str(space),
            settings={"kernel_phase_settings": {"allow_cpu_interpreter": True}},
        )
    )
    shapes = [(TINY, {"batch": 1, "width": 8}), (TINY, {"batch": 1, "width": 8}, "bfloat16")]
    res = kernel_phase(ctx, shapes, budget_s=60)
    assert len(res.cases) == 1 and res.cases[0].study.startswith(f"{ctx.run.study_name}.kernels.tiny.")
    import os

    assert os.environ["TUNER_KERNEL_CONFIG_DIR"] == res.config_dir


FAKE_SPACE = """
name: fake
target: fake_targets:FakeTarget
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  x: {type: categorical, values: [0, 1, 2], default: 0}
"""


def test_more_cases_than_the_budget_holds_tunes_the_first_ones(tmp_path, sqlite_url, monkeypatch):
    """An even share under MIN_SHARE_S each would tune nothing: the first cases get MIN_SHARE_S, the rest keep defaults."""
    import time

    import tuner.search.kernel_search as ks

    monkeypatch.delenv("TUNER_KERNEL_CONFIG_DIR", raising=False)  # no cache hits from other tests
    shares = []

    def one_second_case(case, options, study, progress=None, ahead=None):
        shares.append(options.budget_s)
        time.sleep(1.0)
        return ks.KernelCaseResult(case.kernel, dict(case.shape), case.dtype, case.shape_key, "default_kept")

    monkeypatch.setattr(ks, "tune_case", one_second_case)
    monkeypatch.setattr(ks, "MIN_SHARE_S", 2.0)  # the rule, at a scale a unit test can wait for
    cases = [KernelCase(TINY, {"batch": 1, "width": w}) for w in (8, 16, 24, 32, 40, 48, 56, 64)]
    res = tune_cases(cases, _options(tmp_path, sqlite_url, budget_s=9, confirm_top=0), study="many")
    status = [c.status for c in res.cases]
    assert status[0] == "default_kept" and status[-1] == "skipped", status
    assert shares and all(s >= ks.MIN_SHARE_S - 1e-9 for s in shares)  # never a share too small to tune anything
    assert "not tuned (defaults kept)" in res.stop_reason


def test_a_config_tpe_proposes_again_is_followed_by_a_move_from_the_best(tmp_path, sqlite_url):
    """Kernel search: the ask after a repeat takes a one-change move from the best (``tuner.search.refine``) while any
    runnable config is left untried; X=5 is refused by the kernel's rule, so no move goes there."""
    import optuna

    from tuner.search.kernel_search import tune_case
    from tuner.search.refine import REFINE_ATTR

    opts = _options(tmp_path, sqlite_url, n_trials=12, confirm_top=0, seed=2)
    tune_case(KernelCase(TINY, {"batch": 1, "width": 8}), opts, "m")
    repo = Repo(sqlite_url)
    trials = repo.list_trials(repo.get_run("m").id)
    study = optuna.load_study(study_name="m", storage=sqlite_url)
    repeats = [t.number for t in trials if "not run again" in (t.reason or "")]
    assert repeats, "the test needs TPE to repeat itself in a 6-config space"
    runnable = {1, 2, 3, 4, 6}
    checked = 0
    for n in repeats:
        tried = {t.params["X"] for t in trials[: n + 1]}
        if n + 1 < len(trials) and runnable - tried:
            attrs = study.trials[n + 1].user_attrs
            assert REFINE_ATTR in attrs and trials[n + 1].params["X"] in runnable - tried, (n, attrs)
            checked += 1
    assert checked, "no repeat happened while a config was left untried"


def test_configs_that_run_the_same_program_are_timed_once(tmp_path, sqlite_url):
    """TwinKernel's ORDER changes nothing at one row block (its canonical_config): every config whose program was
    already timed is a repeat of that trial, told its value and not run, so at most four programs ever run."""
    from tuner.search.kernel_search import tune_case

    opts = _options(tmp_path, sqlite_url, n_trials=16, confirm_top=0, seed=3)
    tune_case(KernelCase("kernel_tuning_fakes:TwinKernel", {"batch": 1, "rows": 1}), opts, "twins")
    repo = Repo(sqlite_url)
    trials = sorted(repo.list_trials(repo.get_run("twins").id), key=lambda t: t.number)
    ran: dict[int, int] = {}  # X -> the trial that timed that program
    twins = 0
    for t in trials:
        x = t.params["X"]
        if t.repeat_of is None and not t.is_baseline:
            assert x not in ran, f"trial {t.number} ran X={x} again (trial {ran[x]} timed that program)"
            ran[x] = t.number
        elif t.repeat_of is not None and x in ran and t.params["ORDER"] != trials[ran[x]].params["ORDER"]:
            assert t.repeat_of == ran[x] and t.value == trials[ran[x]].value, t
            twins += 1
        if t.is_baseline:
            ran.setdefault(x, t.number)
    assert twins, "the test needs the search to ask for a twin of a timed config"
    assert len([t for t in trials if t.repeat_of is None]) <= 4


def test_retimes_rerun_each_top_program_under_the_params_it_was_timed_with(tmp_path, sqlite_url):
    """The re-timing at the end takes the top programs, not configurations: a twin told a copied value is not among
    them, so no program is timed again under its twin's params (seen on an H200: both GROUP_M twins of one GEMM
    program re-timed)."""
    import optuna

    from tuner.search.kernel_search import tune_case

    opts = _options(tmp_path, sqlite_url, n_trials=16, confirm_top=3, seed=3)
    tune_case(KernelCase("kernel_tuning_fakes:TwinKernel", {"batch": 1, "rows": 1}), opts, "retime")
    repo = Repo(sqlite_url)
    trials = {t.number: t for t in repo.list_trials(repo.get_run("retime").id)}
    attrs = {t.number: t.user_attrs for t in optuna.load_study(study_name="retime", storage=sqlite_url).trials}
    retimed = [t for n, t in trials.items() if "tuner_confirm_of" in attrs.get(n, {})]
    assert retimed, "the test needs the search to re-time its top configs"
    timed = [t for n, t in trials.items() if t.repeat_of is None and n not in {r.number for r in retimed}]
    for r in retimed:
        first = [t for t in timed if t.params["X"] == r.params["X"]]
        assert first and r.params == first[0].params, (r.number, r.params, [t.params for t in first])
