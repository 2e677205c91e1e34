"""The sparse-decode benchmarks' CPU parts: which configs they time, and their reports from stored runs (byte for byte
where a stored report exists). Moved here from tests/kernels: tests/ does not import benchmarks/."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.profile_sparse_decode import source_summary  # noqa: E402
from kernels import get_kernel  # noqa: E402

SD = get_kernel("sparse_decode")
FP8 = "float8_e4m3fn"
V4 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}


def _h200_sms(monkeypatch):
    """The tl.dot rule counts this machine's SMs; these tests read the H200's (132, what a CPU assumes)."""
    import kernels.sparse_decode as sd

    sms = sd.device_limits(None)["sms"]
    monkeypatch.setattr(sd, "one_wave", lambda: sms)


def test_the_rule_before_2026_12_01_launched_a_second_wave_at_108_of_the_batches_up_to_132():
    """``benchmarks/sparse_decode_wgmma_batches.py`` keeps the wgmma default's rule from before 2026-12-01 (split count
    rounded up), which launched more than 132 programs at 108 of the batches up to 132."""
    from benchmarks.sparse_decode_wgmma_batches import default_before, programs

    assert sum(programs(default_before(b, 640), b) > 132 for b in range(1, 133)) == 108


def test_the_wgmma_benchmark_times_every_partition_at_both_tile_sizes():
    """S=2 splits 640 rows into 320-row halves at BLOCK_T 32 and at 64: both are timed (they were deduplicated as one,
    so 64-row tiles were never timed at S = 1, 2, 5, 10), and S = 16 repeats S = 10's partition at 64-row tiles."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs

    configs = wgmma_configs()
    at = {(c["S"], c["BLOCK_T"]) for c in configs if c["STAGES"] == 2}
    assert {(1, 64), (2, 64), (5, 64), (10, 64), (1, 32), (2, 32), (20, 32)} <= at
    assert (16, 64) not in at and (8, 64) not in at
    assert all(64 * 1024 + c["STAGES"] * c["BLOCK_T"] * 1024 <= 227 * 1024 for c in configs)


def test_the_wgmma_benchmark_times_the_shipped_tl_dot_config_and_the_previous_runs_fastest_plain_configs():
    """The tl.dot side of the side-by-side (CPU: the stored previous run): the shipped config first, then up to TOP
    fastest configs of the plain loop from benchmarks/results/sparse_decode_ahead/h200/2026-11-30_77f77f3.json, none
    twice. (A refactor once dropped TOP; only a linter caught it.)"""
    from benchmarks.sparse_decode_wgmma import PREVIOUS, TOP, tldot_configs

    shipped = {"S": 4, "BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    got = tldot_configs(16, shipped)
    assert got[0] == (shipped, {})
    plain = [c for c, o in got[1:] if not o]
    assert len(plain) == len(got) - 1 and 1 <= len(plain) <= TOP
    assert len({json.dumps(x, sort_keys=True) for x in got}) == len(got)
    prev = json.loads(PREVIOUS.read_text())
    case = next(c for c in prev["cases"] if c["dtype"] == "bfloat16" and c["shape"]["batch"] == 16)
    fastest = min((r for r in case["configs"] if "base" in r["us"]), key=lambda r: r["us"]["base"])
    assert fastest["config"] in plain


def test_the_wgmma_benchmark_skips_configs_of_more_than_two_waves():
    """At batch 64 on 132 SMs: 2 splits of two programs (256) are timed, 3 splits of two (384) and 5 of one (320) are
    not."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs
    from kernels.sparse_decode import split_rows

    at64 = wgmma_configs(64, sms=132)
    got = {(c["S"], c["BLOCK_T"], c["V_SPLIT"]) for c in at64}
    assert (2, 64, 2) in got and (4, 32, 1) in got and (1, 64, 2) in got
    assert (3, 64, 2) not in got and (5, 64, 1) not in got
    assert all(64 * split_rows(640, c["S"], c["BLOCK_T"])[1] * c["V_SPLIT"] <= 2 * 132 for c in at64)
    assert len(wgmma_configs(1)) > len(at64)


def test_the_wgmma_benchmark_space_option_narrows_the_sweep_and_refuses_values_outside_the_kernels_space(tmp_path):
    """--space replaces some keys' values (here: ring depths 2 and 4, one or two programs a split) and keeps both schedules (WS 0 and 1) as twins,
    SPLIT_WG only where it runs (WS, two programs a split or more, an even ring); a value outside the kernel's space
    (a removed switch too) is a one-line error, exit 2, before anything is measured."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs

    narrow = wgmma_configs(16, sms=132, space={"STAGES": [2, 4], "V_SPLIT": [1, 2]})
    assert {c["STAGES"] for c in narrow} == {2, 4} and {c["V_SPLIT"] for c in narrow} == {1, 2}
    assert {json.dumps({**c, "WS": 0}, sort_keys=True) for c in narrow if c["WS"] and not c["SPLIT_WG"]} == {
        json.dumps(c, sort_keys=True) for c in narrow if not c["WS"]
    }
    split = [c for c in narrow if c["SPLIT_WG"]]  # a warp-specialised schedule of two or more programs a split
    assert split and all(c["WS"] == 1 and c["V_SPLIT"] > 1 and c["STAGES"] % 2 == 0 for c in split)
    assert len(narrow) < len(wgmma_configs(16, sms=132))
    with pytest.raises(ValueError, match=r"WS=\[2\] not in the kernel's space"):
        wgmma_configs(16, space={"WS": [2]})
    with pytest.raises(ValueError, match=r"SEESAW=\[0\] not in the kernel's space"):
        wgmma_configs(16, space={"SEESAW": [0]})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    for bad in ('{"WS": [2]}', '{"WS": 1}', "[1]", "{"):
        r = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "sparse_decode_wgmma.py"),
                "--json",
                str(tmp_path / "x.json"),
                "--space",
                bad,
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, (bad, r.stderr)
        assert not (tmp_path / "x.json").exists()


def test_the_wgmma_report_states_the_single_partition_schedules_best_beside_the_best():
    """The WS and SPLIT_WG columns: from a stored run whose configs have neither key (all single-partition), the
    WS=0 and SPLIT_WG=0 bests are the best, ratios of 1.00x; a WS=1 row twice as fast halves both, then a SPLIT_WG=1
    row twice as fast again halves the best once more (SPLIT_WG=0 best / best: 2.00x)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import report

    data = json.loads(
        (ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json").read_text()
    )
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:13] == ["30.8", "30.8", "30.8", "1.18x", "1.00x", "1.00x", "1.00x"], line
    case = next(c for c in data["cases"] if c["batch"] == 64)
    best = min((r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r), key=lambda r: r["us"])
    case["rows"].append({**best, "config": {**best["config"], "WS": 1}, "us": best["us"] / 2})
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:9] == ["30.8", "15.4", "15.4"] and line.split(" | ")[11:13] == ["2.00x", "1.00x"], line
    case["rows"].append({**best, "config": {**best["config"], "WS": 1, "SPLIT_WG": 1}, "us": best["us"] / 4})
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:9] == ["30.8", "15.4", "7.7"] and line.split(" | ")[11:13] == ["4.00x", "2.00x"], line


def test_the_workload_share_report_counts_only_sparse_decode_kernels():
    sys.path.insert(0, str(ROOT))
    from benchmarks.workload_attention_share import is_sparse_decode, report

    assert is_sparse_decode("_sparse_decode_wgmma_kernel") and is_sparse_decode("_combine_kernel")
    assert not is_sparse_decode("_indexer_kernel") and not is_sparse_decode("void cutlass::Kernel<sparse_decode>")
    data = {
        "meta": {"date": "d", "gpu": "g", "torch": "t", "triton": "tr", "commit": "c", "live_context": 512},
        "rows": [{"impl": "wgmma", "batch": 64, "step_kernels_us": 1000.0, "sparse_decode_us": 200.0}],
    }
    assert "| wgmma | 64 | 1000 | 200 | 20.0% | 1.250x |" in report(data, "x.json")


def test_the_benchmarks_report_a_stored_json_on_any_machine_and_refuse_to_measure_without_a_gpu(tmp_path):
    """benchmarks/report_cli.py, as sparse_decode_wgmma.py uses it: --report-from writes the report of the stored run;
    no --json and no --report-from, or --json on a machine without CUDA, exit 2 with one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "benchmarks" / "sparse_decode_wgmma.py"
    data = ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json"
    r = subprocess.run(
        [sys.executable, str(script), "--report-from", str(data), "--out", str(tmp_path / "r.md")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and "| 64 | 11.80 |" in (tmp_path / "r.md").read_text()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--report-from" in r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run(
            [sys.executable, str(script), "--json", str(tmp_path / "x.json")], capture_output=True, text=True, env=env
        )
        assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and not (tmp_path / "x.json").exists()


def test_a_benchmark_run_stores_what_its_measure_returns_and_reports_from_it(tmp_path, monkeypatch):
    """report_cli.run, once ``measure`` returns its data (on a GPU, here a stand-in measure with CUDA said present):
    the data is stored at --json, whatever measure wrote there as it went, and the report is written from it; a
    measure that returns None (its one-line error printed) stores and reports nothing, exit 2."""
    from benchmarks.report_cli import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    data = {"meta": {"date": "d"}, "rows": [{"us": 1.5}]}

    def measure(args, json_path):
        json_path.write_text('{"partial": true}')  # what a run cut short would have kept
        return data

    out, stored = tmp_path / "r.md", tmp_path / "x.json"
    assert (
        run(["--json", str(stored), "--out", str(out)], "doc", out, lambda d, src: f"{d['rows']} from {src}\n", measure)
        == 0
    )
    assert json.loads(stored.read_text()) == data
    assert out.read_text() == f"[{{'us': 1.5}}] from {stored}\n"
    none = tmp_path / "none.json"
    assert (
        run(
            ["--json", str(none), "--out", str(tmp_path / "n.md")],
            "doc",
            out,
            lambda d, src: "",
            lambda args, path: None,
        )
        == 2
    )
    assert not none.exists() and not (tmp_path / "n.md").exists()


def test_the_workload_report_states_the_wgmma_attention_against_the_hand_written_best_from_its_stored_run(tmp_path):
    """benchmarks/workload_gpu.py --report-from: the ratio to the hand-written best measured in the same run, from the
    stored JSON (the README quotes it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    data = ROOT / "benchmarks" / "results" / "workload" / "h200" / "2026-12-01_e53ca92_attention_wgmma.json"
    out = tmp_path / "w.md"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workload_gpu.py"), "--report-from", str(data), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert (
        "hand-written best, attention_impl=wgmma / hand-written best, measured side by side: c=1 0.991, "
        "c=16 0.999, c=64 1.004; geomean 0.998"
    ) in text
    assert (
        text
        == (ROOT / "benchmarks" / "results" / "workload" / "h200" / "2026-12-01_e53ca92_attention_wgmma.md").read_text()
    )


def test_checked_ways_checks_and_times_each_way_with_its_own_arguments_and_keeps_no_time_for_a_wrong_one():
    """``benchmarks.common.checked_ways`` (the benchmarks' loop over the ways they time side by side): each way's
    keyword arguments reach the launch, its error is kept, its time only where the result was within tolerance, and
    ``say`` hears every way in order. On the CPU: the launch runs and is checked for real against the kernel's
    reference; only the timing (CUDA graphs) is replaced by a fixed number."""
    import benchmarks.common as bk

    i = SD.make_inputs(dict(SD.shapes("v4flash")[0], batch=2, topk=64, num_rows=512), "float32", "cpu", seed=3)
    heard, calls = [], []

    def launch(inputs, out, scale=1.0):
        calls.append(scale)
        return out.copy_(SD.reference(inputs) * scale)

    real = bk._time
    bk._time = lambda fn, sets, rep_ms: type("T", (), {"median_us": 7.5})()
    try:
        row = bk.checked_ways(
            SD,
            {"right": {}, "wrong": {"scale": 1.5}},
            launch,
            [i],
            (i,),
            1.0,
            {"batch": 2},
            lambda way, us: heard.append((way, us)),
        )
    finally:
        bk._time = real
    assert row["batch"] == 2 and row["right_err"] < 1e-6 and row["right_us"] == 7.5
    assert abs(row["wrong_err"] - 0.5) < 1e-3 and "wrong_us" not in row
    assert heard == [("right", 7.5), ("wrong", "wrong_result")] and 1.5 in calls


def test_the_batches_benchmark_puts_each_batchs_config_now_beside_before(tmp_path, monkeypatch):
    """benchmarks/sparse_decode_wgmma_batches.py: at batch 24 the frozen rule from before launches 144 programs and the
    default now 96; a batch-16 tuned config runs as tuned before (192 programs) and with its splits set now (96); its
    report states each way's time, programs and before / now."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.sparse_decode_wgmma_batches as bb
    from kernels import configs
    from kernels.configs import write_config_file

    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    configs.clear_cache()
    wg = get_kernel("sparse_decode_wgmma")
    shape = dict(SD.shapes("v4flash")[0], batch=16)
    tuned = {**wg.default_config(shape), "S": 4, "V_SPLIT": 2, "WS": 1}
    write_config_file("sparse_decode_wgmma", configs.gpu_name(), "bfloat16", {wg.shape_key(shape): {"config": tuned}})
    got = bb.configs_for(24, dict(shape, batch=24), None)
    configs.clear_cache()
    assert {w: bb.programs(c, 24) for w, c in got.items()} == {
        "tuned_before": 192,
        "tuned_now": 96,
        "default_before": 144,
        "default_now": 96,
    }
    rows = [
        {"batch": 24, "way": w, "config": c, "programs": bb.programs(c, 24), "err": 0.002, "us": us}
        for (w, c), us in zip(got.items(), (30.0, 20.0, 27.0, 20.0))
    ]
    text = bb.report(
        {"meta": {"date": "d", "gpu": "NVIDIA H200", "torch": "t", "triton": "3.6.0", "commit": "abc"}, "rows": rows},
        "x.json",
    )
    assert "| 24 | 30.0 (192) | 20.0 (96) | 1.50x | 27.0 (144) | 20.0 (96) | 1.35x |" in text


def test_the_wgmma_rates_report_projects_each_schedules_products_from_the_stored_rates(tmp_path):
    """benchmarks/wgmma_rates.py: the products' time of a schedule is its pairs x (scores' product + PV product) at
    the two-programs-an-SM rates, halved (two warpgroups share the SM); a missing rate leaves the cell empty."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.wgmma_rates as wr

    rows = [
        {
            "mode": m,
            "N": n,
            "K": k,
            "per_sm": ps,
            "reps": 1,
            "us": 1.0,
            "err": 1e-3,
            "tflops": 100.0,
            "ns_per_product": ns,
        }
        for m, n, k, ps, ns in (
            ("SS", 32, 512, 2, 1000.0),
            ("RS", 256, 32, 2, 500.0),
            ("SS", 32, 512, 1, 1.0),
            ("RS", 128, 64, 2, 700.0),
        )
    ]
    data = {"meta": {"date": "d", "gpu": "G", "sms": 132, "torch": "t", "triton": "tr", "commit": "c"}, "rows": rows}
    assert wr.projection(data, 32, 256, 32, 20) == 20 * 1500.0 / 2 / 1e3
    assert wr.projection(data, 32, 256, 64, 10) is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "wgmma_rates.py"),
            "--report-from",
            str(path),
            "--out",
            str(tmp_path / "r.md"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "r.md").read_text()
    assert "| 64 x 32 x 512 | 64 x 256 x 32 | 20 + 20 | 15.0 |" in text
    assert "| 64 x 32 x 512 | 64 x 128 x 64 | 20 + 20 | 17.0 |" in text
    assert "| 64 x 32 x 512 | 64 x 256 x 64 | 10 + 10 | - |" in text


def test_the_workload_report_compares_a_found_bests_attention_variant_with_that_found_best(tmp_path):
    """A --study-best run with --attention-impl: the found best's wgmma variant is stated against the found best as
    measured in the same run (its "base"), the hand-written best's variant against the hand-written best."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.workload_gpu import DEFAULT, HAND_BEST

    found = "best found by `s` (trial 3, stored 100.00)"
    found_knobs = {**DEFAULT, "attention_impl": "mma", "context_length": 32768}
    levels = ["c=1", "c=64"]
    cases = [
        {"name": "default", "knobs": DEFAULT, "tok_s": {"c=1": 10.0, "c=64": 50.0}, "wall_s": 1},
        {"name": "hand-written best", "knobs": HAND_BEST, "tok_s": {"c=1": 40.0, "c=64": 400.0}, "wall_s": 1},
        {
            "name": "hand-written best, attention_impl=wgmma",
            "knobs": {**HAND_BEST, "attention_impl": "wgmma"},
            "tok_s": {"c=1": 44.0, "c=64": 400.0},
            "wall_s": 1,
        },
        {"name": found, "knobs": found_knobs, "tok_s": {"c=1": 20.0, "c=64": 200.0}, "wall_s": 1},
        {
            "name": f"{found}, attention_impl=wgmma",
            "knobs": {**found_knobs, "attention_impl": "wgmma"},
            "base": found,
            "tok_s": {"c=1": 25.0, "c=64": 180.0},
            "wall_s": 1,
        },
    ]
    data = {
        "gpu": "G",
        "date": "d",
        "commit": "c",
        "torch": "t",
        "triton": "tr",
        "preset": "dsv4-flash",
        "repeats": 3,
        "levels": levels,
        "cases": cases,
        "compared": [found, "hand-written best, attention_impl=wgmma", f"{found}, attention_impl=wgmma"],
    }
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "w.md"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workload_gpu.py"), "--report-from", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert (
        f"{found}, attention_impl=wgmma / {found}, measured side by side: c=1 1.250, c=64 0.900; geomean 1.061" in text
    )
    assert (
        "hand-written best, attention_impl=wgmma / hand-written best, measured side by side: c=1 1.100, c=64 1.000"
        in text
    )
    assert f"{found} / hand-written best, measured side by side: c=1 0.500, c=64 0.500" in text


def test_the_kernels_benchmark_plans_the_wgmma_kernel_only_where_it_can_run(monkeypatch):
    """benchmarks/kernels.py: a sparse_decode_wgmma job (V4-Flash shapes, bf16, each batch's default config first,
    then a sample of the canonical space) where the kernel says it can run, none where it cannot."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk
    from kernels.sparse_decode_wgmma import SparseDecodeWgmmaKernel, default_config

    monkeypatch.setattr(SparseDecodeWgmmaKernel, "unavailable", lambda self: "no sm_90 here")
    assert not [j for j in bk.plan(quick=True, gemm_sweep=False) if j["kernel"] == "sparse_decode_wgmma"]
    monkeypatch.setattr(SparseDecodeWgmmaKernel, "unavailable", lambda self: None)
    job = next(j for j in bk.plan(quick=True, gemm_sweep=False) if j["kernel"] == "sparse_decode_wgmma")
    assert job["dtype"] == "bfloat16" and [s["batch"] for s in job["shapes"]] == [1, 16, 64]
    defaults = [default_config(b, 640) for b in (1, 16, 64)]
    assert job["configs"][:3] == defaults and len(job["configs"]) > 20
    assert {c["WS"] for c in job["configs"]} == {0, 1}
    assert {c["STAGES"] for c in job["configs"][3:]} == {2}  # the sample: one ring depth (a default may have another)


def test_the_kernels_benchmark_times_the_wgmma_kernels_previous_schedule_at_its_best_config_once():
    """The previous version of the wgmma kernel is its single-partition schedule: the best config with WS flipped is
    timed unless the sweep already timed the same program (its canonical twin), and the WS=0 best counts it."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk

    shape = dict(get_kernel("sparse_decode_wgmma").shapes("v4flash")[2])  # batch 64
    best = {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "STORE_CVT": 1, "WS": 1}
    timed = []

    def trial(cfg, tag):
        timed.append((cfg, tag))
        return {"config": cfg, "tag": tag, "outcome": "ok", "time_us": 31.0}

    row = {
        "trials": [
            {"config": best, "tag": "sweep", "outcome": "ok", "time_us": 28.5},
            {"config": {**best, "S": 2, "V_SPLIT": 1, "WS": 0}, "tag": "sweep", "outcome": "ok", "time_us": 33.0},
        ]
    }
    bk._prev_schedule_rows(row, shape, trial, best)
    assert timed == [({**best, "WS": 0, "SPLIT_WG": 0}, "other_schedule")]  # keys it predates: defaults
    assert row["other_schedule"]["time_us"] == 31.0 and row["prev_best_us"] == 31.0
    timed.clear()
    bk._prev_schedule_rows(row, shape, trial, {**best, "SPLIT_WG": 1})  # the newest schedule: SPLIT_WG flipped,
    assert timed == [] and row["other_schedule"]["time_us"] == 28.5  # which the sweep timed (best, SPLIT_WG 0)


def test_the_kernels_report_puts_the_wgmma_kernel_beside_the_tl_dot_best_torch_floor_and_its_previous_schedule():
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk

    shape = dict(get_kernel("sparse_decode_wgmma").shapes("v4flash")[2])
    key = get_kernel("sparse_decode").shape_key(shape)
    base = {
        "dtype": "bfloat16",
        "shape": shape,
        "key": key,
        "floor_us": 11.8,
        "bound": "memory",
        "torch_us": 108.0,
        "n_ok": 1,
        "n_failed": 0,
        "trials": [],
    }
    rows = [
        dict(base, kernel="sparse_decode", default_us=40.0, best_us=36.0, best_config={"S": 2}),
        dict(
            base,
            kernel="sparse_decode_wgmma",
            default_us=29.0,
            shipped_us=28.0,
            best_us=27.0,
            best_config={"S": 1, "WS": 1},
            other_schedule={"time_us": 30.0},
            prev_best_us=29.7,
        ),
    ]
    meta = {
        "gpu": "NVIDIA H200",
        "date": "d",
        "sms": 132,
        "torch": "t",
        "triton": "3.6.0",
        "cuda": "c",
        "commit": "abc",
        "bw": 4.2e12,
        "flops": 7e14,
        "wall_s": 1.0,
        "precompile_s": 0.0,
    }
    text = bk.report(rows, meta)
    line = next(x for x in text.splitlines() if x.startswith("| 64 | 11.80 | 108.0 | 36.0 |"))
    cells = line.split(" | ")
    assert cells[4:13] == ["29.0", "28.0", "27.0", "30.0", "29.7", "1.33x", "1.10x", "4.0x", "2.29x"], cells
    assert "missed: 10.0 µs over 17" in line
    assert "- sparse decode wgmma B=64 <= 17 us: 27.0 us" in text


def test_the_wgmma_report_states_what_each_switch_gains_over_the_configs_timed_both_ways():
    """switch_gains: per batch, (time with the switch off) / (time with it on) over the configs timed both ways; WS
    also by the tiles a program walks. A stored run with no WS key has no such table; a WS=1 twin of every batch-64
    config at half the time reads 2.000x everywhere."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import switch_gains

    data = json.loads(
        (ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json").read_text()
    )
    assert switch_gains(data) == []
    case = next(c for c in data["cases"] if c["batch"] == 64)
    timed = [r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r]
    for r in timed:
        r["config"]["WS"] = 0
        case["rows"].append({**r, "config": {**r["config"], "WS": 1}, "us": r["us"] / 2})
    lines = switch_gains(data)
    assert lines[1].startswith("WS=1 against WS=0")
    rows = [x.strip("| ").split(" | ") for x in lines if x.startswith("| 64 |")]
    assert rows[0][1:4] == ["all", str(len(timed)), "2.000x"] and all(r[3:6] == ["2.000x"] * 3 for r in rows)
    assert {r[1] for r in rows[1:]} <= {"1 tile", "2 tiles", "3 tiles", "4+ tiles"} and len(rows) > 2
    # MERGE had two on-values (MERGE=2 until 3d94924), each set against MERGE=0: a MERGE=2 twin of batch 16's
    # configs at a third of the time
    case16 = next(c for c in data["cases"] if c["batch"] == 16)
    timed16 = [r for r in case16["rows"] if r["kernel"] == "wgmma" and "us" in r and not r["config"].get("MERGE")]
    for r in timed16:
        r["config"]["MERGE"] = 0
    case16["rows"] += [{**r, "config": {**r["config"], "MERGE": 2}, "us": r["us"] / 3} for r in timed16]
    lines = switch_gains(data)
    at = lines.index(next(x for x in lines if x.startswith("MERGE=2 against MERGE=0")))
    assert not any(x.startswith("MERGE=1 against") for x in lines)  # no MERGE=1 twin was timed
    rows = [x.strip("| ").split(" | ") for x in lines[at:] if x.startswith("| 16 |")]
    assert timed16 and rows[0][1:6] == ["all", str(len(timed16)), "3.000x", "3.000x", "3.000x"]


@pytest.mark.parametrize("batch, pairs, median", [(16, 64, "0.949x"), (1, 69, "0.900x")])
def test_the_stored_spread_merge_runs_are_reported_byte_for_byte_with_merge2_against_merge0(
    tmp_path, batch, pairs, median
):
    """The two H200 runs of MERGE=2 (the spread merge, removed after them) are reported from their JSON exactly as
    committed, and the report sets MERGE=2 against MERGE=0 over every config timed both ways."""
    name = Path("benchmarks") / "results" / "sparse_decode_wgmma_merge2" / "h200" / f"2026-12-02_3057f3e_b{batch}"
    out = tmp_path / "r.md"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "sparse_decode_wgmma.py"),
            "--report-from",
            str(ROOT / f"{name}.json"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert text == (ROOT / f"{name}.md").read_text()
    lines = text.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("MERGE=2 against MERGE=0")))
    assert next(x for x in lines[at:] if x.startswith(f"| {batch} | all |")).startswith(
        f"| {batch} | all | {pairs} | {median} |"
    )


def test_the_fp8_benchmark_reports_its_stored_run_and_rewrites_the_shipped_fp8_tuned_file_from_it(tmp_path):
    """The stored H200 run's report is regenerated byte for byte, and the shipped fp8 tuned file of the wgmma kernel
    is exactly what ``--write-tuned`` writes from that run (the sweep's fastest config a batch, each passing the fp8
    rules, none slower than the default it was timed beside)."""
    stored = ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_fp8" / "h200" / "2026-12-01_4ac0e78.json"
    shipped = ROOT / "kernels" / "tuned" / "sparse_decode_wgmma__NVIDIA_H200__float8_e4m3fn__triton-3.6.0.json"
    out = tmp_path / "r.md"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "sparse_decode_wgmma_fp8.py"),
            "--report-from",
            str(stored),
            "--out",
            str(out),
            "--write-tuned",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    assert (
        out.read_text()
        == (ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_fp8" / "h200" / "2026-12-01_4ac0e78.md").read_text()
    )
    assert (tmp_path / shipped.name).read_text() == shipped.read_text()
    k = get_kernel("sparse_decode_wgmma")
    for key, entry in json.loads(shipped.read_text()).items():
        shape = dict(V4, batch=int(key.split("batch=")[1].split(",")[0]))
        assert k.check_config(entry["config"], shape, None, FP8) is None
        assert entry["time_us"] <= entry["default_time_us"]
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sparse_decode_wgmma_fp8.py"), "--write-tuned", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: --write-tuned DIR needs --report-from FILE.json (the stored run it takes the configs from)"
    )


def test_the_tl_dot_batches_report_finds_the_nearest_configs_row_by_its_splits_and_states_each_ratio(tmp_path):
    """benchmarks/sparse_decode_batches.py's report from a stored JSON: the nearest tuned config's row is the split
    count that partitions the rows as its S does (S=16 and S=10 both make ten 64-row splits of 640), its time against
    the fastest split count, and the merge's start at exit and without PDL against early."""
    import json
    import subprocess
    import sys

    root = ROOT
    tiles = {"BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 8, "num_stages": 2}
    rows = [
        {
            "dtype": "bfloat16",
            "batch": 2,
            "way": f"S={s}",
            "config": {**tiles, "S": s},
            "splits": n,
            "programs": 8 * n,
            "nearest_S": 16,
            "err": 0.002,
            "us": us,
        }
        for s, n, us in ((1, 1, 20.0), (2, 2, 12.0), (4, 4, 9.0), (8, 8, 8.0), (10, 10, 10.0))
    ]
    rows += [
        {
            "dtype": "bfloat16",
            "batch": 2,
            "way": f"{who}:{way}",
            "config": {**tiles, "S": s},
            "us": us,
            "programs": 8 * s,
        }
        for who, s in (("nearest", 16), ("best_S", 8))
        for way, us in (("early", 10.0), ("at_exit", 11.0), ("plain", 12.5))
    ]
    stored = tmp_path / "b.json"
    stored.write_text(
        json.dumps(
            {
                "meta": {
                    "date": "2026-12-01",
                    "gpu": "NVIDIA H200",
                    "torch": "2.11",
                    "triton": "3.6.0",
                    "commit": "c1a88e2",
                    "rep_ms": 20.0,
                },
                "rows": rows,
            }
        )
    )
    out = tmp_path / "b.md"
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "sparse_decode_batches.py"),
            "--report-from",
            str(stored),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert r.returncode == 0, r.stderr
    row = next(line for line in out.read_text().splitlines() if line.startswith("| bfloat16 | 2 |"))
    # one wave: S=16 (ten 64-row splits, 80 programs within 132), the row of ten splits
    assert row == "| bfloat16 | 2 | 10 (80) | 10.0 | 8 (64) | 8.0 | 1.25x | 16 | 1.25x | 1.10x | 1.10x | 1.25x |"


def test_the_tl_dot_one_wave_split_rule_picks_the_fastest_split_count_in_every_stored_h200_case(tmp_path, monkeypatch):
    """SparseDecodeKernel.adapt_config's split count against the H200 run it was read off (936ffa3: every split count
    at batches 2-96 with the nearest tuned key's tiles, bf16 and fp8): within 1% of the fastest in each of the 18
    cases, and the stored report is what the script writes from the stored JSON."""
    import json
    import subprocess
    import sys

    from kernels.sparse_decode import SparseDecodeKernel, split_rows

    _h200_sms(monkeypatch)
    root = ROOT
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
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "sparse_decode_batches.py"),
            "--report-from",
            str(stored),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (root / "benchmarks/results/sparse_decode_batches/h200/2026-12-01_936ffa3.md").read_text()


CSV = """"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x00","        LDG.E.128 R4, desc[UR4][R2.64]","10","9"
"0x10","        LDGSTS.E.BYPASS.128 [R1], desc[UR4][R6.64]","5","5"
"0x20","        DEPBAR.LE SB0, 0x0","15","15"
"0x30","        HGMMA.64x32x16.F32.BF16 R152, gdesc[UR52], R152","10","8"
"0x40","        WARPGROUP.DEPBAR.LE gsb0, 0x0","30","30"
"0x50","        BAR.SYNC.DEFER_BLOCKING 0x0","5","5"
"0x60","        HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4].tnspB, R24","5","5"
"0x70","  @!P2  STG.E.64 desc[UR60][R6.64+0x180], R74","20","20"
"""


def test_source_summary_splits_stalls_by_region_and_counts_wgmma_waits_as_wgmma(tmp_path):
    """A wgmma wait (WARPGROUP.DEPBAR) is not a cp.async wait (DEPBAR.LE SB): the first summary counted it as one."""
    path = tmp_path / "src.csv"
    path.write_text(CSV)
    text = source_summary(path, top=3)
    assert "8 SASS lines, 100 stall samples" in text
    assert "by region: before the first wgmma 30.0%, the wgmma region 50.0%, after the last wgmma 20.0%" in text
    assert (
        "by instruction: wgmma and its waits 45.0%, global store 20.0%, global load 10.0%, cp.async 20.0%, "
        "barrier 5.0%, shared 0.0%, exp2 0.0%"
    ) in text
    assert text.splitlines()[-3:] == [
        "    2  15.0%          DEPBAR.LE SB0, 0x0",
        "    4  30.0%          WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "    7  20.0%    @!P2  STG.E.64 desc[UR60][R6.64+0x180], R74",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "sparse_decode_batches",
        "sparse_decode_wgmma",
        "sparse_decode_wgmma_batches",
        "sparse_decode_wgmma_fp8",
        "wgmma_rates",
        "workload_attention_share",
    ],
)
def test_a_new_run_of_each_sparse_decode_benchmark_files_its_report_by_benchmark_gpu_date_and_commit(name):
    """Without --out a run's report goes to ``benchmarks/results/<benchmark>/h200/<date>_<commit>.md`` (the layout
    benchmarks/results/README.md indexes), not the flat ``benchmarks/results/<benchmark>_h200.md`` of before."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "500"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    default = r.stdout.split("the report's path (default: ")[1].split(")")[0]
    assert re.fullmatch(rf"benchmarks/results/{name}/h200/\d{{4}}-\d\d-\d\d_[0-9a-f]{{7}}\.md", default), default


def test_a_report_from_a_stored_run_makes_the_folder_of_its_report(tmp_path):
    """report_cli.run writes a report into a <benchmark>/<gpu>/ folder that does not exist yet (a new benchmark's or
    GPU's first run), reading the stored run through benchmarks.common.read_json (a .json.gz as well)."""
    import gzip

    from benchmarks.report_cli import run

    stored = tmp_path / "x.json.gz"
    stored.write_bytes(gzip.compress(json.dumps({"rows": [1, 2]}).encode()))
    out = tmp_path / "bench" / "h200" / "r.md"
    assert run(["--report-from", str(stored)], "doc", out, lambda d, src: f"{d['rows']}\n", lambda a, p: None) == 0
    assert out.read_text() == "[1, 2]\n"
