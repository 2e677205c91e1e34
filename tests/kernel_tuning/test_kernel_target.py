"""The kernels target on a CPU: preflight refusal, rules before compile, the correctness gate, a real kernel."""

from __future__ import annotations

import time

import pytest
import yaml

from search_spaces import detect_hardware, load_space_text, resolve
from tuner.errors import SearchError
from tuner.measurement import Outcome
from tuner.search.kernel_search import KernelCase, kernel_space_yaml
from tuner.targets.kernels import KernelsTarget

TINY = "kernel_tuning_fakes:TinyKernel"


def _target(case: KernelCase, **settings) -> KernelsTarget:
    space = load_space_text(kernel_space_yaml(case, settings))
    return KernelsTarget(resolve(space, detect_hardware()), space.settings)


def test_generated_space_has_the_default_config_as_baseline():
    from kernels.registry import get_kernel

    for name in ("sparse_decode", "indexer", "gemm"):
        k = get_kernel(name)
        shape = k.shapes("v4flash")[0]
        space = load_space_text(kernel_space_yaml(KernelCase(name, shape)))
        assert space.defaults() == k.default_config(shape)
        assert {p.kernel for p in space.params} == {f"{name}.{f}" for f in k.config_space(shape)}
        assert space.objective.direction == "minimize" and space.objective.metric == "time_us"


def test_preflight_refuses_a_cpu_unless_allowed():
    case = KernelCase(TINY, {"batch": 1, "width": 8})
    report = _target(case).preflight()
    assert not report.ok and any("no CUDA GPU" in e and "allow_cpu_interpreter" in e for e in report.errors)
    report = _target(case, allow_cpu_interpreter=True).preflight()
    assert report.ok, report.errors
    assert any("interpreter" in x for x in report.will_not_run)


def test_preflight_names_a_bad_shape():
    report = _target(
        KernelCase("sparse_decode", {"batch": 1, "heads": 16, "d_qk": 64, "d_v": 64, "topk": 40, "num_rows": 97}),
        allow_cpu_interpreter=True,
    ).preflight()
    assert report.ok
    with pytest.raises(
        SearchError, match=r"shape \{'batch': 1, 'heads': 16\} does not fit kernel 'sparse_decode' \(KeyError: 'topk'\)"
    ):
        _target(KernelCase("sparse_decode", {"batch": 1, "heads": 16}))


def test_rules_prune_before_compile():
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    t = _target(KernelCase("sparse_decode", shape), allow_cpu_interpreter=True)
    assert t.check(t.kernel.default_config(shape)) is None
    why = t.check({"S": 1, "BLOCK_H": 64, "BLOCK_T": 128, "num_warps": 4, "num_stages": 3})
    assert why.startswith("shared_memory:")
    why = t.check({"S": 1, "BLOCK_H": 64, "BLOCK_T": 16, "num_warps": 4, "num_stages": 1})
    assert why.startswith("register_pressure:")


def test_correctness_gate_and_replay_value():
    t = _target(KernelCase(TINY, {"batch": 1, "width": 8}), allow_cpu_interpreter=True)
    m = t.evaluate({"X": 3}, time.time() + 60)
    assert m.outcome is Outcome.WRONG_RESULT and "tolerance" in m.reason and m.value is None
    m = t.evaluate({"X": 4}, time.time() + 60)
    assert m.outcome is Outcome.OK and m.value == pytest.approx(50.5)
    assert {"time_us", "spread", "achieved_GBps", "roofline_frac", "rel_error"} <= {r.metric for r in m.metrics}
    assert t.evaluate({"X": 5}, time.time() + 60).outcome is Outcome.INVALID_CONFIG


def test_real_kernel_in_the_interpreter():
    """sparse_decode on the tiny test shape through Triton's interpreter: correct, timed by wall clock."""
    from kernels.registry import get_kernel

    shape = get_kernel("sparse_decode").shapes("test")[0]
    t = _target(KernelCase("sparse_decode", shape, "float32"), allow_cpu_interpreter=True)
    m = t.evaluate({"S": 2, "BLOCK_H": 16, "BLOCK_T": 16, "num_warps": 4, "num_stages": 1}, time.time() + 120)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("rel_error") < 1e-3 and m.value > 0
    assert "interpreter" in m.reason


def test_launch_spec_remeasures_one_config():
    t = _target(KernelCase(TINY, {"batch": 1, "width": 8}), allow_cpu_interpreter=True)
    spec = t.launch_spec({"X": 4})
    assert spec.argv[1:3] == ["-m", "tuner.targets.kernels"]
    assert yaml.safe_load(spec.argv[spec.argv.index("--config") + 1]) == {"X": 4}


def test_kernel_trials_use_a_persistent_worker_unless_turned_off():
    case = KernelCase(TINY, {"batch": 1, "width": 8})
    assert _target(case).persistent_worker is True
    assert _target(case, persistent_worker=False).persistent_worker is False
    assert _target(case, persistent_worker="false").persistent_worker is False
