"""The CPU parts of benchmarks/sparse_decode_variants.py: which configs a case times, and the report's verdicts."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def sdv():
    with benchmark_script("sparse_decode_variants") as module:
        yield module


def test_each_case_times_the_shipped_config_the_default_and_the_sweeps_fastest_once(sdv):
    sweep = json.loads(sdv.SWEEP.read_text())
    shipped = {"S": 1, "BLOCK_H": 32, "BLOCK_T": 128, "num_warps": 4, "num_stages": 2}
    default = {"S": 1, "BLOCK_H": 32, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    configs = sdv.case_configs("bfloat16", 64, sweep, shipped, default)
    assert configs[:2] == [shipped, default]
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)
    table = next(c for c in sweep["cases"] if c["dtype"] == "bfloat16" and c["shape"]["batch"] == 64)
    fastest = min((r for r in table["rows"] if r["status"] == "ok"), key=lambda r: r["time_us"])["config"]
    assert fastest in configs
    assert {c["BLOCK_H"] for c in configs} == {16, 32, 64}  # each head tile's fastest
    assert all(c["num_warps"] in (4, 8) for c in configs)
    with_grid = sdv.case_configs("bfloat16", 64, sweep, shipped, default, grid=True)
    assert with_grid[: len(configs)] == configs and len(with_grid) > len(configs)
    # batch 16 with an fp8 cache was not swept: it takes the fp8 tables of batch 1 and 64
    assert len(sdv.case_configs("float8_e4m3fn", 16, sweep, shipped, default)) > len(configs) - 2


def _case(batch, base, v2, ok=True):
    cfg = {"S": 2, "BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    row = {"config": cfg, "us": {"base": base, **({"v_split=2": v2} if ok else {})},
           "status": {"base": "ok", "v_split=2": "ok" if ok else "out_of_resources"}}
    return {"dtype": "bfloat16", "shape": {"batch": batch}, "floor_us": 3.0, "torch_us": 47.0, "shipped": cfg,
            "default": cfg, "configs": [row]}


META = {"date": "2026-11-30 15:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "commit": "abc1234",
        "copy_tb_s": 4.27, "variants": ["base", "v_split=2"], "grid": True}


def test_report_states_each_variants_ratio_and_the_goal_met_or_missed_by_how_much(sdv):
    text = sdv.report({"meta": META, "cases": [_case(16, 20.3, 11.5), _case(64, 37.2, 30.0)]}, "x.json")
    row16 = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 16 |"))
    row64 = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 64 |"))
    assert "| 11.5 | 1.77x |" in row16 and "| met |" in row16 and "v_split=2: S=2" in row16
    assert "missed by 13.0 µs (goal 17)" in row64
    assert "2026-11-30 15:00 UTC" in text and "abc1234" in text and "NVIDIA H200" in text


def test_a_variant_that_failed_is_shown_with_its_outcome_and_left_out_of_the_best(sdv):
    text = sdv.report({"meta": META, "cases": [_case(64, 37.2, None, ok=False)]}, "x.json")
    row = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 64 |"))
    assert "| — | — |" in row and "base: S=2" in row
    assert "v_split=2: out_of_resources" in text


def test_the_first_runs_json_reads_as_base_and_prefetch(sdv):
    from benchmark_scripts import ROOT

    data = json.loads((ROOT / "benchmarks/results/data/sparse_decode_prefetch_h200.json").read_text())
    text = sdv.report(data, "sparse_decode_prefetch_h200.json")
    assert "prefetch_next best µs" in text and "commit 5e448d4" in text
    row64 = next(line for line in text.splitlines() if line.startswith("| bfloat16 | 64 |"))
    assert "0.90x" in row64  # the prefetch's best against the shipped kernel's, as first reported


def test_the_tl_dot_batches_report_finds_the_nearest_configs_row_by_its_splits_and_states_each_ratio(tmp_path):
    """benchmarks/sparse_decode_batches.py's report from a stored JSON: the nearest tuned config's row is the split
    count that partitions the rows as its S does (S=16 and S=10 both make ten 64-row splits of 640), its time against
    the fastest split count, and the merge's start at exit and without PDL against early."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tiles = {"BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 8, "num_stages": 2}
    rows = [{"dtype": "bfloat16", "batch": 2, "way": f"S={s}", "config": {**tiles, "S": s}, "splits": n,
             "programs": 8 * n, "nearest_S": 16, "err": 0.002, "us": us}
            for s, n, us in ((1, 1, 20.0), (2, 2, 12.0), (4, 4, 9.0), (8, 8, 8.0), (10, 10, 10.0))]
    rows += [{"dtype": "bfloat16", "batch": 2, "way": f"{who}:{way}", "config": {**tiles, "S": s}, "us": us,
              "programs": 8 * s} for who, s in (("nearest", 16), ("best_S", 8))
             for way, us in (("early", 10.0), ("at_exit", 11.0), ("plain", 12.5))]
    stored = tmp_path / "b.json"
    stored.write_text(json.dumps({"meta": {"date": "2026-12-01", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0",
                                           "commit": "c1a88e2", "rep_ms": 20.0}, "rows": rows}))
    out = tmp_path / "b.md"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "sparse_decode_batches.py"), "--report-from",
                        str(stored), "--out", str(out)], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    row = next(line for line in out.read_text().splitlines() if line.startswith("| bfloat16 | 2 |"))
    assert row == "| bfloat16 | 2 | 10 (80) | 10.0 | 8 (64) | 8.0 | 1.25x | 1.10x | 1.10x | 1.25x |"
