"""The CPU parts of benchmarks/sparse_decode_variants.py: which configs a case times, and the report's verdicts."""

from __future__ import annotations

import gzip
import json

import pytest
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def sdv():
    with benchmark_script("sparse_decode_variants") as module:
        yield module


def test_each_case_times_the_shipped_config_the_default_and_the_sweeps_fastest_once(sdv):
    sweep = json.loads(gzip.decompress(sdv.SWEEP.read_bytes()))  # the stored sweep table is gzip-compressed
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

    data = json.loads((ROOT / "benchmarks/results/sparse_decode_prefetch/h200/2026-11-30_5e448d4.json").read_text())
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
    # one wave: S=16 (ten 64-row splits, 80 programs within 132), the row of ten splits
    assert row == "| bfloat16 | 2 | 10 (80) | 10.0 | 8 (64) | 8.0 | 1.25x | 16 | 1.25x | 1.10x | 1.10x | 1.25x |"


def _h200_sms(monkeypatch):
    """The tl.dot rule counts this machine's SMs; these tests read the H200's (132, what a CPU assumes)."""
    import kernels.sparse_decode as sd

    sms = sd.device_limits(None)["sms"]
    monkeypatch.setattr(sd, "one_wave", lambda: sms)


def test_the_tl_dot_one_wave_split_rule_picks_the_fastest_split_count_in_every_stored_h200_case(tmp_path, monkeypatch):
    """SparseDecodeKernel.adapt_config's split count against the H200 run it was read off (936ffa3: every split count
    at batches 2-96 with the nearest tuned key's tiles, bf16 and fp8): within 1% of the fastest in each of the 18
    cases, and the stored report is what the script writes from the stored JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from kernels.sparse_decode import SparseDecodeKernel, split_rows

    _h200_sms(monkeypatch)
    root = Path(__file__).resolve().parents[2]
    stored = root / "benchmarks/results/sparse_decode_batches/h200/2026-12-01_936ffa3.json"
    data = json.loads(stored.read_text())
    kernel = SparseDecodeKernel.instance
    cases: dict = {}
    for r in data["rows"]:
        if r["way"].startswith("S=") and r.get("us"):
            cases.setdefault((r["dtype"], r["batch"]), []).append(r)
    assert len(cases) == 18
    for (dtype, batch), rows in cases.items():
        tiles = rows[0]["config"]
        tuned_batch = min((1, 16, 64), key=lambda b: abs(b - batch))
        shape = {"batch": batch, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
        s = kernel.adapt_config(dict(tiles), {**shape, "batch": tuned_batch}, shape)["S"]
        picked = next(r for r in rows if r["splits"] == split_rows(640, s, tiles["BLOCK_T"])[1])
        assert picked["us"] <= 1.01 * min(r["us"] for r in rows), (dtype, batch, s)
    out = tmp_path / "b.md"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "sparse_decode_batches.py"), "--report-from",
                        str(stored), "--out", str(out)], capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (root / "benchmarks/results/sparse_decode_batches/h200/2026-12-01_936ffa3.md").read_text()


def test_the_tl_dot_kernel_keeps_a_config_at_its_own_batch_and_sets_only_the_split_count_at_another(monkeypatch):
    from kernels.sparse_decode import SparseDecodeKernel

    _h200_sms(monkeypatch)
    kernel = SparseDecodeKernel.instance
    tuned = {"S": 2, "BLOCK_H": 16, "BLOCK_T": 128, "num_warps": 8, "num_stages": 2}
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
    assert kernel.adapt_config(tuned, shape, shape) is tuned
    # 24 requests x 4 head tiles: two splits make 192 programs, one 96
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 24}) == {**tuned, "S": 1}
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 7}) == {**tuned, "S": 4}  # 84 programs
    assert kernel.adapt_config(tuned, shape, {**shape, "batch": 200})["S"] == 1  # no split count fits: one
