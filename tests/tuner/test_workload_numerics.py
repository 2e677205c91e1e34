"""The workload's numerics gate: each trial's step output against the precise reference's, on fixed inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from search_spaces import Hardware, load_space, load_space_text, resolve
from storage import Repo
from tuner.errors import SettingsError
from tuner.measurement import Outcome
from tuner.targets.workload import numerics as nm
from tuner.targets.workload.target import WorkloadTarget

FAST = {"warmup": 0, "repeats": 1}


def tiny_target(**settings):
    return WorkloadTarget(resolve(load_space("dsv4_flash_tiny"), Hardware()), {**FAST, **settings})


def test_dtype_family_is_the_least_precise_gemm_and_bf16_on_a_gpu():
    knobs = {"gemm_proj": "fp32", "gemm_indexer": "fp32", "gemm_moe": "bf16", "gemm_mhc": "tf32"}
    assert nm.dtype_family(knobs, torch.device("cpu")) == "bf16"
    assert nm.dtype_family({**knobs, "gemm_moe": "fp32", "gemm_mhc": "fp32"}, torch.device("cpu")) == "fp32"
    assert nm.dtype_family({**knobs, "gemm_proj": "fp8"}, torch.device("cpu")) == "fp8"
    assert nm.dtype_family({**knobs, "kv_cache_dtype": "fp8_e4m3"}, torch.device("cuda")) == "fp8"
    assert nm.dtype_family({**knobs, "kv_cache_dtype": "bf16"}, torch.device("cuda")) == "bf16"
    assert nm.dtype_family({k: "fp32" for k in knobs}, torch.device("cuda")) == "bf16"
    assert nm.DEFAULT_TOLERANCE["fp8"] > nm.DEFAULT_TOLERANCE["bf16"] > nm.DEFAULT_TOLERANCE["fp32"]


def test_rel_err_is_infinite_for_a_non_finite_output():
    ref = torch.ones(2, 4, dtype=torch.float64)
    assert nm.rel_err(ref, ref) == 0.0
    assert math.isclose(nm.rel_err(ref * 1.01, ref), 0.01, rel_tol=1e-9)
    assert nm.rel_err(ref * float("nan"), ref) == math.inf


def test_the_reference_is_the_precise_configuration_not_the_baseline_and_is_cached(tmp_path, monkeypatch):
    # the tiny space's baseline runs bf16 projections and MoE: measured against the baseline itself it was 0 and an
    # fp32 configuration carried the baseline's own bf16 error; against the precise reference it is the other way
    monkeypatch.setenv("TUNER_NUMERICS_CACHE", str(tmp_path / "cache"))
    t = tiny_target()
    base = t.resolved.defaults()
    assert base["gemm_proj"] == "bf16" and base["gemm_moe"] == "bf16"
    m = t.evaluate(base, deadline=1e18)
    assert m.outcome is Outcome.OK and 0 < m.metric("numerics_rel_err") < nm.DEFAULT_TOLERANCE["bf16"]
    assert m.metric("numerics_baseline_err") == m.metric("numerics_rel_err")
    files = list((tmp_path / "cache").glob("*.pt"))
    assert len(files) == 2  # the baseline trial wrote the reference's output and its own for the later trials
    precise = {**base, "gemm_proj": "fp32", "gemm_moe": "fp32"}
    p = t.evaluate(precise, deadline=1e18)
    assert p.metric("numerics_rel_err") == 0.0 and p.metric("numerics_baseline_err") == m.metric("numerics_rel_err")
    changed = {**base, "gemm_moe": "fp32"}
    from_cache = t.evaluate(changed, deadline=1e18).metric("numerics_rel_err")
    for f in files:
        f.unlink()
    recomputed = t.evaluate(changed, deadline=1e18).metric("numerics_rel_err")
    assert 0 < from_cache < nm.DEFAULT_TOLERANCE["bf16"] and from_cache == recomputed


def test_a_default_tolerance_widens_to_the_baselines_own_error_and_a_set_one_holds_as_written():
    # on an H200 the baseline is SGLang's fp8 path (fp8 linears, fp8 cache, DeepGEMM indexer): a configuration as
    # close to the precise reference as the deployment itself is never wrong_result under the defaults
    assert nm.tolerance_for("fp8", {}, 0.0) == nm.DEFAULT_TOLERANCE["fp8"]
    assert nm.tolerance_for("fp8", {}, 0.35) == pytest.approx(nm.BASELINE_MARGIN * 0.35)
    assert nm.tolerance_for("bf16", {}, 0.01) == nm.DEFAULT_TOLERANCE["bf16"]
    assert nm.tolerance_for("fp8", {"fp8": 0.2}, 0.35) == 0.2


def test_beyond_the_tolerance_the_trial_is_wrong_result_with_its_error_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_NUMERICS_CACHE", str(tmp_path / "cache"))
    t = tiny_target(numerics_tolerance={"bf16": 1e-4})
    m = t.evaluate({**t.resolved.defaults(), "gemm_proj": "fp32"}, deadline=1e18)
    assert m.outcome is Outcome.WRONG_RESULT and m.value is None
    assert m.metric("numerics_rel_err") > 1e-4 and m.metric("numerics_tolerance") == 1e-4
    assert "tolerance 0.0001 (bf16 family" in m.reason


def test_an_unknown_dtype_family_is_refused_naming_it():
    with pytest.raises(SettingsError, match="numerics_tolerance.*unknown dtype family 'fp9'"):
        tiny_target(numerics_tolerance={"fp9": 0.1})


GATE_SPACE = """
name: numerics-gate
description: bf16 MoE GEMMs (8 significant bits) where the space asks for agreement with fp32 to 0.4%
target: workload
preset: dsv4-flash-tiny
settings: {live_context: 512, warmup: 0, repeats: 2, numerics_tolerance: {bf16: 0.004}}
objective: {metric: tok_s, combine: geomean, levels: [1, 16]}
params:
  indexer_width: {type: categorical, values: [static, live], default: static, server: {none: twin only}}
  gemm_moe: {type: categorical, values: [fp32, bf16], default: fp32, server: {none: the checkpoint's}}
  gemm_proj: {type: categorical, values: [fp32], default: fp32, server: {none: the checkpoint's}}
  gemm_mhc: {type: categorical, values: [fp32], default: fp32, server: {none: fp32 in code}}
"""


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_knob_that_breaks_numerics_is_wrong_result_and_the_fast_correct_values_win(tmp_path):
    (tmp_path / "gate.yaml").write_text(GATE_SPACE)
    load_space_text(GATE_SPACE)  # valid as written
    r = tuner(
        "search",
        "--space",
        "gate.yaml",
        "--budget",
        "5m",
        "--n-trials",
        "8",
        "--seed",
        "0",
        "--confirm-top",
        "0",
        "-o",
        "out",
        "--study",
        "gate",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    repo = Repo(f"sqlite:///{tmp_path / 'tuner.db'}")
    run = repo.get_run("gate")
    trials = [t for t in repo.list_trials(run.id, with_measurements=True) if t.repeat_of is None]
    err = {t.number: next(m.value for m in t.measurements if m.metric == "numerics_rel_err") for t in trials}
    bf16 = [t for t in trials if t.params["gemm_moe"] == "bf16"]
    fp32 = [t for t in trials if t.params["gemm_moe"] == "fp32"]
    assert bf16 and fp32
    assert all(t.outcome == "wrong_result" and t.value is None and err[t.number] > 0.004 for t in bf16)
    assert all(t.outcome == "ok" and err[t.number] <= 1e-3 for t in fp32)
    best = repo.get_trial(run.id, run.best_trial_number)
    assert best.params["gemm_moe"] == "fp32"
    live = [t for t in fp32 if t.params["indexer_width"] == "live"]
    if live:  # the fast correct value: the live width scores 512/4 rows instead of the cap's 32K
        assert best.params["indexer_width"] == "live"
    # shown by status, best and explain
    r = tuner("status", "--study", "gate", cwd=tmp_path)
    assert r.returncode == 0 and "num. err" in r.stdout, r.stdout
    r = tuner("best", "--study", "gate", cwd=tmp_path)
    assert r.returncode == 0 and "numerics: output differs from the precise reference's by" in r.stdout
    doc = json.loads(tuner("best", "--json", "--study", "gate", cwd=tmp_path).stdout)
    assert doc["metrics"]["numerics_rel_err"] <= 1e-3
    r = tuner("explain", "--no-profile", "--study", "gate", cwd=tmp_path)
    assert r.returncode == 0 and "## Numerics" in r.stdout and "was wrong_result" in r.stdout, r.stdout


@pytest.mark.parametrize("knob", ["gemm_proj", "gemm_moe", "gemm_mhc"])
def test_every_gemm_dtype_knob_changes_the_step_output(knob):
    """Each GEMM family whose result flows into the hidden state reaches the step's output, so the gate can see what
    its dtype does to the numbers (an H200 seed study found the MHC-pre GEMM's output dropped: `gemm_mhc` changed the
    time but never the output). The indexer's GEMM is left out: it only chooses rows, so its dtype changes the output
    only where it flips a choice (on the H200 preset it does: 0.010-0.018 for bf16, benchmarks/numerics_gpu.py)."""
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import get_preset

    preset = get_preset("dsv4-flash-tiny")
    outs = [nm.step_output(DecodeModel(preset, {knob: dt}, "cpu", seed=3), 2, 512) for dt in ("fp32", "bf16")]
    assert 0 < nm.rel_err(outs[1], outs[0]) < nm.DEFAULT_TOLERANCE["bf16"]


def test_a_cached_baseline_output_from_other_code_is_not_reused(monkeypatch):
    """The cache key covers the source that computes a step: after a change to the twin's model (as the MHC fix of
    2026-11-30 was) a trial must not compare itself with the old code's baseline output."""
    from tuner.targets.workload.presets import get_preset

    preset, dev = get_preset("dsv4-flash-tiny"), torch.device("cpu")
    key = nm.cache_key(preset, {}, seed=0, batch=2, live_context=512, device=dev)
    assert key == nm.cache_key(preset, {}, seed=0, batch=2, live_context=512, device=dev)
    monkeypatch.setattr(nm, "code_digest", lambda: "other source")
    assert key != nm.cache_key(preset, {}, seed=0, batch=2, live_context=512, device=dev)
