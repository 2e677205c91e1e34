"""The search's plug-in phase: after the trials, the plug-in's kernels timed beside SGLang's in a child process and
the records kept in the study; a measurement that fails is a warning line, never the search's end."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path: the child refuses without a GPU")
def test_a_failed_side_by_side_is_a_line_and_stores_nothing(caplog):
    from tuner.search.driver import _plugin_phase

    stored, said = [], []
    ctx = SimpleNamespace(
        best=SimpleNamespace(params={"glue": "sglang"}),
        target=SimpleNamespace(plugin_measurements=lambda params: [["--batches", "1"]]),
        options=SimpleNamespace(gpus=[0]),
        repo=SimpleNamespace(get_run=lambda name: stored.append(name)),
        run=SimpleNamespace(study_name="s"),
    )
    with caplog.at_level("WARNING"):
        _plugin_phase(ctx, SimpleNamespace(message=said.append))
    assert "the plug-in's side by side failed (the measurement exited with 2: error: no CUDA device" in caplog.text
    assert said[-1].startswith("the plug-in's side by side failed: the measurement exited with 2") and stored == []


def test_the_measurement_refuses_bad_arguments_with_the_flag_and_the_value():
    done = subprocess.run(
        [sys.executable, "-m", "tuner.export.sglang_plugin_measure", "--batches", "0", "16"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "error: --batches must be >= 1, but got [0, 16]" in done.stderr


def test_no_best_or_no_case_runs_nothing():
    from tuner.search.driver import _plugin_phase

    called = []
    target = SimpleNamespace(plugin_measurements=lambda params: called.append(params) or [])
    _plugin_phase(SimpleNamespace(best=None, target=target), None)
    _plugin_phase(SimpleNamespace(best=SimpleNamespace(params={"a": 1}), target=target), None)
    assert called == [{"a": 1}]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times GPU kernels")
def test_on_a_gpu_each_batch_gives_a_record_the_export_reads():
    from tuner.export.sglang_plugin import SideBySide
    from tuner.export.sglang_plugin_measure import QCase, measure

    said = []
    (rec,) = measure(QCase(batches=(16,), rep_ms=20, rounds=2, commit="test"), said.append)
    r = SideBySide.from_dict(rec)
    assert r.batch == 16 and r.shape == {"heads": 64, "head_dim": 512, "rope_dim": 64, "norm": True}
    assert r.rel_err <= 2e-2 and rec["graph_rel_err"] <= 2e-2 and len(r.ours_rounds_us) == 2
    assert r.baseline in ("sglang", "torch") and (r.baseline == "sglang") == (not any("torch" in s for s in said))


def test_a_childs_result_is_its_last_json_line_and_a_failure_names_its_last_line():
    from tuner.processes import json_output

    def done(rc, out, err=""):
        return subprocess.CompletedProcess(["x"], rc, out, err)

    assert json_output(done(0, 'log\n{"a": 1}\n{"b": 2}\n'), "it") == {"b": 2}
    with pytest.raises(ValueError, match=r"^it exited with 2: error: no CUDA device$"):
        json_output(done(2, '{"b": 2}\n', "warn\nerror: no CUDA device\n\n"), "it")
    with pytest.raises(ValueError, match=r"^it exited with 0: done$"):
        json_output(done(0, "done\n"), "it")
    with pytest.raises(ValueError, match=r"^it exited with 1: no output$"):
        json_output(done(1, ""), "it")
