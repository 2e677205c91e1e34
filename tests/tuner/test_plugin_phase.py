"""The search's plug-in phase: after the trials, the plug-in's kernels timed beside SGLang's in a child process and
the records kept in the study; a measurement that fails is a warning line, never the search's end."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tuner.budget import Deadline


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
        deadline=Deadline.start_now(3600),
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


def test_a_search_that_will_time_a_plugin_ends_its_trials_early_enough_for_it():
    from tuner.search.driver import PLUGIN_KEEP_S, _keep_time_for_plugin

    def ctx(budget_s, cases, n_trials=None):
        return SimpleNamespace(
            options=SimpleNamespace(budget_s=budget_s, n_trials=n_trials),
            resolved=SimpleNamespace(defaults=lambda: {"glue": "triton"}),
            target=SimpleNamespace(plugin_measurements=lambda params: cases),
            deadline=Deadline.start_now(budget_s),
        )

    hour = ctx(3600, [["--batches", "1"]])
    before = hour.deadline.trials_end
    _keep_time_for_plugin(hour)
    assert before - hour.deadline.trials_end == pytest.approx(PLUGIN_KEEP_S)
    assert hour.deadline.end == before + hour.deadline.reserve_s  # the budget itself is unchanged
    short = ctx(300, [["--batches", "1"]])  # at most a tenth of a short budget
    before = short.deadline.trials_end
    _keep_time_for_plugin(short)
    assert before - short.deadline.trials_end == pytest.approx(30.0)
    for other in (ctx(3600, []), ctx(3600, [["--batches", "1"]], n_trials=20)):  # nothing to time; a trial count
        before = other.deadline.trials_end
        _keep_time_for_plugin(other)
        assert other.deadline.trials_end == before


def test_a_plugin_phase_without_time_left_in_the_budget_is_one_line_and_runs_nothing(caplog, monkeypatch):
    from tuner.search import driver

    ran, said = [], []
    monkeypatch.setenv("TUNER_COMMIT", "test")  # no git call
    monkeypatch.setattr(driver.subprocess, "run", lambda *a, **k: ran.append(a))
    late = Deadline(start=0.0, budget_s=100.0, reserve_s=2.0)  # ended long ago
    ctx = SimpleNamespace(
        best=SimpleNamespace(params={"glue": "sglang"}),
        target=SimpleNamespace(plugin_measurements=lambda params: [["--batches", "1"]]),
        options=SimpleNamespace(gpus=[]),
        deadline=late,
    )
    with caplog.at_level("WARNING"):
        driver._plugin_phase(ctx, SimpleNamespace(message=said.append))
    assert ran == []
    assert said == [
        "the plug-in's side by side was not run: 0 s of the budget left before the export (it needs up to 300 s); "
        "the export ships no plug-in kernel; a longer --budget runs it"
    ]


def test_a_plugin_phase_that_ran_says_how_long_it_took_beside_the_time_kept_for_it(monkeypatch):
    """The H200 main job's logs said the phase ran, not how long: whether 90 s is the right keep stayed unknown."""
    import json

    from tuner.search import driver

    record = {
        "target": "q",
        "batch": 1,
        "shape": {},
        "dtypes": {},
        "ours_us": 5.0,
        "sglang_us": 6.0,
        "rel_err": 0.0,
        "gpu": "NVIDIA H200",
        "arch": "sm_90",
        "date": "2026-12-04",
        "commit": "test",
        "sglang": "0.5.23",
    }
    done = subprocess.CompletedProcess([], 0, stdout=json.dumps({"records": [record, record]}) + "\n", stderr="")
    monkeypatch.setenv("TUNER_COMMIT", "test")
    monkeypatch.setattr(driver.subprocess, "run", lambda *a, **k: done)
    stored, said = [], []
    from tuner.export import sglang_plugin

    monkeypatch.setattr(sglang_plugin, "store_records", lambda repo, study, records, source: stored.extend(records))
    ctx = SimpleNamespace(
        best=SimpleNamespace(params={"glue": "sglang"}),
        target=SimpleNamespace(plugin_measurements=lambda params: [["--batches", "1"]]),
        options=SimpleNamespace(gpus=[]),
        repo=None,
        run=SimpleNamespace(study_name="s"),
        deadline=Deadline.start_now(3600).keep(90.0),
    )
    driver._plugin_phase(ctx, SimpleNamespace(message=said.append))
    assert len(stored) == 2
    assert said[-1].startswith("the plug-in's side by side took ") and said[-1].endswith(
        " s (90 s kept for it): 2 record(s)"
    ), said


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
