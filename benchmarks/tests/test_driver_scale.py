"""benchmarks/driver_scale.py: the stand-in target, a real (small) run of the driver with its live API reader, and
the report written from the stored JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.driver_scale import Timers, main, report, run_one, space_text, surface
from search_spaces import load_space_text

ROOT = Path(__file__).resolve().parents[2]


def test_the_surface_is_fixed_and_the_knobs_move_it():
    params = {"context_length": 8192, "attention_impl": "mma", "kv_cache_dtype": "bf16"}
    a, b = surface(params, [1, 16]), surface(params, [1, 16])
    assert a == b and a[16] > a[1]
    assert surface({**params, "context_length": 32768}, [1])[1] != a[1]
    assert surface({**params, "kv_cache_dtype": "fp8_e4m3"}, [1])[1] != a[1]


def test_the_stand_ins_space_is_the_main_spaces_parameters_and_rules():
    space = load_space_text(space_text(0.5), source="driver_scale")
    main_space = load_space_text((ROOT / "search_spaces" / "dsv4_flash.yaml").read_text(), source="dsv4_flash")
    assert [p.name for p in space.params] == [p.name for p in main_space.params]
    assert [c.name for c in space.constraints] == [c.name for c in main_space.constraints]
    assert space.target == "benchmarks.driver_scale:SleepTarget" and space.settings == {"trial_s": 0.5}


def test_the_timers_count_nested_calls_once_and_bucket_by_trials_finished():
    t = Timers(bucket=2)

    class Box:
        def outer(self):
            return self.inner()

        def inner(self):
            return 1

    t.wrap(Box, "outer", "storage")
    t.wrap(Box, "inner", "storage")
    calls = []
    t.add = lambda kind, s, cpu=0.0: calls.append((t.finished // t.bucket, kind))  # what reaches the sums, per call
    try:
        Box().outer()
        t.finished = 2
        Box().inner()
    finally:
        t.uninstall()
    assert calls == [(0, "storage"), (1, "storage")]  # outer's inner call is inside outer: counted once
    assert Box.outer.__qualname__.endswith("Box.outer")  # unwrapped again


def test_the_report_is_written_from_the_stored_json(tmp_path):
    row = {
        "bucket": 0,
        "trials": 500,
        "wall_s": 60.0,
        "ask_ms": 30.0,
        "tell_ms": 10.0,
        "storage_ms": 10.0,
        "driver_ms": 50.0,
        "idle_share": 0.04,
        "ran": 480,
        "trials_per_min": 500.0,
        "api_requests": 100,
        "api_p99_ms": 80.0,
        "api_median_ms": 20.0,
    }
    data = {
        "date": "2026-12-03 06:00 UTC",
        "commit": "abc1234",
        "machine": "vm (2 CPUs)",
        "load_at_start": 3.0,
        "python": "3.11.7",
        "command": "python benchmarks/driver_scale.py run",
        "trial_s_real": 2.0,
        "bucket": 500,
        "runs": [
            {
                "storage": "sqlite",
                "workers": 8,
                "trials": 500,
                "trial_s": 0.5,
                "wall_s": 60.0,
                "state": "interrupted",
                "stop_reason": "stopped at 500",
                "outcomes": {"ok": 480, "pruned": 20},
                "api_errors": 0,
                "rows": [row],
            }
        ],
    }
    src = tmp_path / "x.json"
    src.write_text(json.dumps(data))
    assert main(["report", "--from", str(src)]) == 0
    text = (tmp_path / "x.md").read_text()
    assert text == report(data, src)
    assert "| 0-500 | 30.0 | 10.0 | 10.0 | 50.0 | 2.50% | 480 | 4.0% | - | 500 | 80 | 20 |" in text
    assert "sqlite, 8 workers: 500 trials of 0.5 s" in text and str(src) in text


@pytest.mark.slow
def test_a_small_run_of_the_real_driver_records_every_figure(tmp_path, sqlite_url):
    res = run_one(sqlite_url, 2, 12, 0.05, 0, tmp_path, say=lambda *_: None, bucket=6)
    assert res["trials"] >= 12 and res["stop_reason"] == "stopped by the benchmark at 12 trials"
    rows = res["rows"]
    assert [r["bucket"] for r in rows][:2] == [0, 1]
    assert all(sum(r[k] for r in rows) > 0 for k in ("ask_ms", "tell_ms", "storage_ms")), rows
    assert all(r["driver_ms"] > 0 and 0 <= r["idle_share"] <= 1 for r in rows), rows
    assert sum(r["api_requests"] for r in rows) > 0 and res["api_errors"] == 0
