"""Workload trials in a long-lived worker: the weights of a preset built once and reused, the same numbers as a fresh
process, and a trial that corrupts what the worker keeps (then crashes, runs out of memory, hangs, or says nothing)
never reaching the next trial's numbers. All on the CPU twin (tiny preset), in real processes."""

from __future__ import annotations

import time

import pytest
import torch
from spaces import TINY_SPACE_PATH

from search_spaces.loader import space_text
from tuner.execution.isolation import TrialJob, TrialProcess
from tuner.execution.persistent import PersistentWorker
from tuner.measurement import Measurement, Outcome
from tuner.targets.workload import model as model_mod
from tuner.targets.workload.model import DecodeModel, clear_weights
from tuner.targets.workload.numerics import step_output
from tuner.targets.workload.presets import get_preset

SPACE_PATH = TINY_SPACE_PATH
TINY = get_preset("dsv4-flash-tiny")
# short contexts so a CPU step takes milliseconds; a bf16 MHC so the output is not the baseline's own (and another
# weights key than OTHER's fp32 MoE)
CONFIG = {"context_length": 4096, "indexer_width": "live", "gemm_mhc": "bf16"}
OTHER = {"context_length": 16384, "indexer_width": "live", "gemm_moe": "fp32"}
SETTINGS = {"warmup": 1, "repeats": 2}
# the tiny space at two small levels: a loaded 2-core CPU steps batch 64 in seconds
SPACE_YAML = space_text(SPACE_PATH).replace("levels: [1, 16, 64]", "levels: [1, 4]")
assert "levels: [1, 4]" in SPACE_YAML


@pytest.fixture(autouse=True)
def numerics_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_NUMERICS_CACHE", str(tmp_path / "numerics"))
    clear_weights()
    yield
    clear_weights()


def _job(params, target="workload", timeout=120.0, settings=None):
    return TrialJob(
        target=target,
        space_yaml=SPACE_YAML,
        space_source=str(SPACE_PATH),
        params=dict(params),
        deadline=time.time() + timeout,
        settings={**SETTINGS, **(settings or {})},
    )


def _metric(m: Measurement, name: str, level: str = "") -> float | None:
    return m.metric(name, level)


def test_a_model_with_the_same_key_reuses_the_weights_and_gives_the_same_output():
    a = DecodeModel(TINY, CONFIG, "cpu", seed=0)
    out_a = step_output(a, 2, 512)
    b = DecodeModel(TINY, {**CONFIG, "gemm_proj": "fp32"}, "cpu", seed=0)  # other dtypes: other weights
    c = DecodeModel(TINY, {**CONFIG, "context_length": 8192}, "cpu", seed=0)  # same weights key
    d = DecodeModel(TINY, CONFIG, "cpu", seed=1)  # another seed: other weights
    assert not a.weights_reused and not b.weights_reused and not d.weights_reused
    assert c.weights_reused and c.w is a.w
    again = DecodeModel(TINY, CONFIG, "cpu", seed=0)
    clear_weights()
    fresh = DecodeModel(TINY, CONFIG, "cpu", seed=0)
    assert not fresh.weights_reused
    assert torch.equal(step_output(again, 2, 512), out_a)
    assert torch.equal(step_output(fresh, 2, 512), out_a)


def test_weights_written_into_after_they_were_built_are_drawn_again():
    a = DecodeModel(TINY, CONFIG, "cpu", seed=0)
    out = step_output(a, 2, 512)
    a.w.attn["csa"].q_b.weight[0, 0] += 1.0  # one stray store into the kept weights
    b = DecodeModel(TINY, CONFIG, "cpu", seed=0)
    assert not b.weights_reused and b.w is not a.w
    assert torch.equal(step_output(b, 2, 512), out)


def test_a_reused_worker_gives_the_numbers_of_a_fresh_process_and_stores_where_the_time_went():
    fresh = TrialProcess(_job(CONFIG)).wait()
    assert fresh.outcome is Outcome.OK, fresh.reason
    w = PersistentWorker()
    try:
        runs = [w.start(_job(p)).wait() for p in (OTHER, CONFIG, OTHER, CONFIG)]
        assert all(m.outcome is Outcome.OK for m in runs), [m.reason for m in runs]
        assert w.started_processes == 1
        first, reused = runs[1], runs[3]
        assert [_metric(m, "worker_trial") for m in runs] == [0.0, 1.0, 2.0, 3.0]
        assert _metric(first, "weights_reused") == 0.0 and _metric(reused, "weights_reused") == 1.0
        # the numerics gate's error is a deterministic function of the configuration's output: identical
        err = _metric(fresh, "numerics_rel_err")
        assert err is not None and err > 0
        assert _metric(first, "numerics_rel_err") == err and _metric(reused, "numerics_rel_err") == err
        for m in (fresh, reused):
            phases = {
                lv: _metric(m, "trial_time_s", lv)
                for lv in ("spawn", "build", "numerics", "compile", "capture", "measure")
            }
            assert all(v is not None and v >= 0 for v in phases.values()), phases
            assert sum(phases.values()) <= m.duration_s + 0.5
        # a fresh process pays its interpreter and imports before the evaluation; a reused one does not
        assert _metric(reused, "trial_time_s", "spawn") < _metric(fresh, "trial_time_s", "spawn")
    finally:
        w.stop()


# each fault spawns two workers (torch, weights, numerics): the crash runs in the fast suite, the others under `slow`
@pytest.mark.parametrize(
    "fault,outcome",
    [
        ("crash", Outcome.CRASH),
        pytest.param("oom", Outcome.OOM, marks=pytest.mark.slow),
        pytest.param("hang", Outcome.TIMEOUT, marks=pytest.mark.slow),
    ],
)
def test_a_trial_that_corrupts_the_worker_and_fails_does_not_reach_the_next_trial(fault, outcome):
    w = PersistentWorker()
    try:
        before = w.start(_job(CONFIG)).wait()
        assert before.outcome is Outcome.OK, before.reason
        t = w.start(
            _job({"fault": fault}, target="workload_faults:FaultyWorkload", timeout=8.0 if fault == "hang" else 120.0)
        )
        pid = t.pid
        assert t.wait().outcome is outcome
        after = w.start(_job(CONFIG))
        assert after.pid != pid  # a fresh process
        m = after.wait()
        assert m.outcome is Outcome.OK, m.reason
        assert _metric(m, "worker_trial") == 0.0 and _metric(m, "weights_reused") == 0.0
        assert _metric(m, "numerics_rel_err") == _metric(before, "numerics_rel_err")
    finally:
        w.stop()


@pytest.mark.slow  # a worker and its weights built twice; the rule it relies on (kept weights written into are
# drawn again) is checked in-process, fast, by test_weights_written_into_after_they_were_built_are_drawn_again
def test_a_trial_that_corrupts_the_kept_weights_silently_does_not_reach_the_next_trial():
    w = PersistentWorker()
    try:
        before = w.start(_job(CONFIG)).wait()
        silent = w.start(_job({"fault": "silent"}, target="workload_faults:FaultyWorkload"))
        pid = silent.pid
        assert silent.wait().outcome is Outcome.OK
        after = w.start(_job(CONFIG))
        assert after.pid == pid  # the same process: its weights were found changed and drawn again
        m = after.wait()
        assert m.outcome is Outcome.OK, m.reason
        assert _metric(m, "weights_reused") == 0.0
        assert _metric(m, "numerics_rel_err") == _metric(before, "numerics_rel_err")
    finally:
        w.stop()


def test_a_numerics_failure_retires_the_worker():
    w = PersistentWorker()
    try:
        wrong = w.start(_job(CONFIG, settings={"numerics_tolerance": {"bf16": 1e-9}}))
        pid = wrong.pid
        m = wrong.wait()
        assert m.outcome is Outcome.WRONG_RESULT, m.reason
        assert not w.alive()
        nxt = w.start(_job(CONFIG))
        assert nxt.pid != pid and nxt.wait().outcome is Outcome.OK
    finally:
        w.stop()


def test_the_workload_runs_in_a_persistent_worker_unless_its_setting_says_not():
    from search_spaces import detect_hardware, load_space, resolve
    from tuner.targets.workload.target import WorkloadTarget

    resolved = resolve(load_space(str(SPACE_PATH)), detect_hardware())
    assert WorkloadTarget(resolved).persistent_worker
    assert not WorkloadTarget(resolved, {"persistent_worker": False}).persistent_worker
    assert model_mod.WEIGHT_CACHE_SIZE >= 1


def test_status_shows_each_trials_time_split_and_the_studys_median_per_phase(tmp_path):
    import subprocess
    import sys

    from storage import Repo
    from storage.types import MetricRow

    repo = Repo(f"sqlite:///{tmp_path / 'tuner.db'}")
    repo.create_schema()
    run = repo.create_run(
        "twin",
        target="workload",
        budget_s=60,
        objective="geomean",
        space_name="dsv4-flash-tiny",
        space_yaml=SPACE_PATH.read_text(),
    )
    splits = [
        {"spawn": 4.2, "build": 0.5, "numerics": 1.0, "compile": 0.3, "capture": 0.0, "measure": 2.0},
        {"spawn": 0.01, "build": 0.02, "numerics": 0.2, "compile": 0.0, "capture": 0.0, "measure": 1.8},
        {"spawn": 0.03, "build": 0.04, "numerics": 0.4, "compile": 0.1, "capture": 0.0, "measure": 1.6},
    ]
    for n, split in enumerate(splits):
        repo.start_trial(run.id, n, {"context_length": 4096}, is_baseline=n == 0)
        repo.finish_trial(
            run.id,
            n,
            outcome="ok",
            value=10.0 + n,
            duration_s=sum(split.values()) + 0.1,
            metrics=[MetricRow("trial_time_s", k, v, "s") for k, v in split.items()],
        )
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "status", "--study", "twin", "--storage", f"sqlite:///{tmp_path / 'tuner.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "COLUMNS": "250"},
    )
    assert out.returncode == 0, out.stderr
    assert "spawn/build/num/compile/capture/measure s" in out.stdout
    assert "4.2/0.5/1.0/0.3/0.00/2.0" in out.stdout and "0.01/0.02/0.2/0.00/0.00/1.8" in out.stdout
    assert (
        "time per trial (median s over 3 trials): spawn 0.03, build 0.04, numerics 0.4, compile 0.1, "
        "capture 0.00, measure 1.8"
    ) in out.stdout


GPU_CONFIG = {
    "context_length": 4096,
    "attention_impl": "mma",
    "glue": "compile",
    "moe_impl": "triton",
    "cuda_graph_buckets": "pow2:8",
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels, torch.compile and CUDA graphs need a GPU")
def test_gpu_a_reused_worker_gives_the_numbers_of_a_fresh_process_and_pays_the_compile_once():
    fresh = TrialProcess(_job(GPU_CONFIG, timeout=300)).wait()
    assert fresh.outcome is Outcome.OK, fresh.reason
    w = PersistentWorker()
    try:
        first, other, again = (w.start(_job(p, timeout=300)).wait() for p in (GPU_CONFIG, OTHER, GPU_CONFIG))
        assert all(m.outcome is Outcome.OK for m in (first, other, again)), [first.reason, other.reason, again.reason]
        assert w.started_processes == 1 and _metric(again, "weights_reused") == 1.0
        assert (
            _metric(again, "numerics_rel_err")
            == _metric(first, "numerics_rel_err")
            == _metric(fresh, "numerics_rel_err")
        )

        def paid(m):  # start, build, and compile (the numerics step's first call compiles too): paid once a worker
            return sum(_metric(m, "trial_time_s", k) or 0.0 for k in ("spawn", "build", "numerics", "compile"))

        assert paid(again) < 0.5 * paid(fresh), (paid(again), paid(fresh))
        assert again.duration_s < fresh.duration_s
    finally:
        w.stop()
