"""The CPU parts of benchmarks/sparse_decode_prefetch.py: which configs a case times, and the report's verdicts."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def sdp():
    with benchmark_script("sparse_decode_prefetch") as module:
        yield module


def test_each_case_times_the_shipped_config_the_default_and_the_sweeps_fastest_once(sdp):
    sweep = json.loads(sdp.SWEEP.read_text())
    shipped = {"S": 1, "BLOCK_H": 32, "BLOCK_T": 128, "num_warps": 4, "num_stages": 2}
    default = {"S": 1, "BLOCK_H": 32, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    configs = sdp.case_configs("bfloat16", 64, sweep, shipped, default)
    assert configs[:2] == [shipped, default]
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)
    table = next(c for c in sweep["cases"] if c["dtype"] == "bfloat16" and c["shape"]["batch"] == 64)
    fastest = min((r for r in table["rows"] if r["status"] == "ok"), key=lambda r: r["time_us"])["config"]
    assert fastest in configs
    assert {c["BLOCK_H"] for c in configs} == {16, 32, 64}  # each head tile's fastest
    assert all(c["num_warps"] in (4, 8) for c in configs)
    # batch 16 with an fp8 cache was not swept: it takes the fp8 tables of batch 1 and 64
    fp8_16 = sdp.case_configs("float8_e4m3fn", 16, sweep, shipped, default)
    assert len(fp8_16) > len(configs) - 2


def _case(batch, on, off, identical=True):
    cfg = {"S": 2, "BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    return {"dtype": "bfloat16", "shape": {"batch": batch}, "floor_us": 3.0, "torch_us": 47.0, "shipped": cfg,
            "default": cfg, "configs": [{"config": cfg, "status": "ok", "us_on": on, "us_off": off,
                                         "bit_identical": identical}]}


def test_report_states_the_goal_met_or_missed_by_how_much_and_flags_differing_outputs(sdp):
    meta = {"date": "2026-11-30 15:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "commit": "abc1234",
            "copy_tb_s": 4.27}
    text = sdp.report({"meta": meta, "cases": [_case(16, 11.5, 20.3), _case(64, 30.0, 37.2, identical=False)]}, "x.json")
    row16 = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 16 |"))
    row64 = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 64 |"))
    assert "| met |" in row16 and "1.77x" in row16 and "| yes |" in row16
    assert "missed by 13.0 µs (goal 17)" in row64 and row64.endswith("| NO |")
    assert "2026-11-30 15:00 UTC" in text and "abc1234" in text and "NVIDIA H200" in text
