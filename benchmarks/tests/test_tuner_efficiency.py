"""The CPU-runnable parts of the issue 20 GPU sweep (benchmarks/tuner_efficiency.py, tuner_efficiency_gpu.sh): the
cases fixed before the run, their samples, and the held-out goal report replayed from a real recorded H200 table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import benchmark_script

from benchmarks.common import read_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def te():
    """The benchmark script as a module."""
    with benchmark_script("tuner_efficiency") as module:
        yield module


def test_sweep_cases_cover_issue20_kernels_and_are_all_held_out(te):
    cases = {(c.kernel, c.dtype, tuple(sorted(c.shape.items()))) for c in te.GPU_CASES}
    sd = [c for c in te.GPU_CASES if c.kernel == "sparse_decode"]
    assert sorted(c.shape["batch"] for c in sd if c.dtype == "bfloat16") == [1, 16, 64]
    assert sorted(c.shape["batch"] for c in sd if c.dtype == "float8_e4m3fn") == [1, 64]
    gemm = [c for c in te.GPU_CASES if c.kernel == "gemm"]
    assert {(c.shape["M"], c.shape["N"], c.shape["K"]) for c in gemm} == {
        (m, n, k) for n, k in ((2048, 4096), (4096, 1024)) for m in (1, 16, 64)
    }
    assert len(cases) == len(te.GPU_CASES)  # no case twice
    assert all(c.held_out for c in te.GPU_CASES)


def test_no_held_out_table_is_one_the_kernel_search_was_tuned_on(te):
    """A table of the tuning set (RECORDED_SWEEPS, TABLE) must not come back as held out: same kernel, shape and dtype
    would be a table the search's seeds were read from. The sparse decode kernel was rewritten for issue 20 after its
    tuning tables were recorded, so only its earlier tables are tuning data; the GEMM shapes must all be new."""
    tuned = set()
    for f in te.RECORDED_SWEEPS:
        for case in read_json(te.RESULTS / f)["cases"]:
            tuned.add((case["kernel"], case.get("dtype", "bfloat16"), json.dumps(case["shape"], sort_keys=True)))
    gemm_tuned = {k for k in tuned if k[0] == "gemm"}
    assert gemm_tuned  # the a39226e GEMM samples are in the tuning set now
    for c in te.GPU_CASES:
        assert (c.kernel, c.dtype, json.dumps(c.shape, sort_keys=True)) not in gemm_tuned, c


def test_aligned_gemm_sets_keep_tuning_and_held_out_shapes_apart(te):
    """The GEMM after its aligned-load fix is swept twice, to separate files: the tuning set's shapes (read to set the
    seed configs) and the held-out set's shapes (only reported). No shape may be in both, and each set is marked."""
    tuning, held = te.CASE_SETS["gemm_aligned_tuning"], te.CASE_SETS["gemm_aligned_held_out"]
    assert te.CASE_SETS["issue20_held_out"] is te.GPU_CASES
    assert not any(c.held_out for c in tuning) and all(c.held_out for c in held)
    nk = lambda cases: {(c.shape["N"], c.shape["K"]) for c in cases}  # noqa: E731
    assert nk(tuning) == {(1024, 4096), (4096, 2048)} and nk(held) == {(2048, 4096), (4096, 1024)}
    for cases in (tuning, held):
        assert sorted(c.shape["M"] for c in cases) == [1, 1, 16, 16, 64, 64]
        assert all((c.max_configs is None) == (c.shape["M"] < 64) for c in cases)  # M=1, 16 exhaustive


def test_the_wgmma_held_out_set_samples_the_kernels_space_with_its_default_in_it(te):
    """The Gluon sparse decode's held-out set: a 600-config sample of its canonical configs at batch 64 and 1, held
    out, each holding the batch's default (every search runs it first)."""
    from kernels.registry import get_kernel

    wg = get_kernel("sparse_decode_wgmma")
    cases = te.CASE_SETS["wgmma_held_out"]
    assert [c.shape["batch"] for c in cases] == [64, 1] and all(c.held_out for c in cases)
    for case in cases:
        configs, space_size = te.sweep_configs(case, None)
        assert len(configs) == te.WGMMA_SAMPLE < space_size
        assert wg.canonical_config(wg.default_config(case.shape), case.shape) in configs
        assert all(wg.canonical_config(c, case.shape) == c for c in configs)


def test_the_wgmma_exhaustive_set_times_the_kernels_whole_space_at_batch_64_then_1(te):
    """The Gluon sparse decode's exhaustive set: every canonical config of its space (no cap, so no config is left
    out by a sample), each program once, at batch 64 then 1 (the second optional: it takes what time is left),
    held out."""
    from kernels.registry import get_kernel

    wg = get_kernel("sparse_decode_wgmma")
    cases = te.CASE_SETS["wgmma_exhaustive"]
    assert [c.shape["batch"] for c in cases] == [64, 1] and all(c.held_out for c in cases)
    assert [c.optional for c in cases] == [False, True] and not any(c.max_configs for c in cases)
    for case in cases:
        configs, space_size = te.sweep_configs(case, None)
        canonical = [
            c for c in wg.configs(case.shape, None, dtype="bfloat16") if wg.canonical_config(c, case.shape) == c
        ]
        assert len(configs) == space_size == len(canonical)
        assert {json.dumps(c, sort_keys=True) for c in configs} == {json.dumps(c, sort_keys=True) for c in canonical}


REMOVED_WGMMA_SWITCHES = ("MERGE", "PART16", "P_SMEM", "SEESAW")
"""The wgmma kernel's switches removed after its exhaustive tables were timed (each off in every shipped config)."""


def test_the_stored_wgmma_exhaustive_tables_are_whole_and_their_fastest_config_is_the_default(te):
    """The H200 run of the wgmma kernel's whole space (3d03109): every canonical config of the space at batch 64 and
    1 timed and correct (the configs the case set asks for, no more), and at both batches the kernel's default
    config is the table's fastest, as its docstring says."""
    from kernels.registry import get_kernel

    wg = get_kernel("sparse_decode_wgmma")
    data = read_json(ROOT / "benchmarks/results/tuner_efficiency/h200/2026-12-02_3d03109_wgmma_exhaustive.json.gz")
    assert [c["shape"]["batch"] for c in data["cases"]] == [64, 1]
    for case, asked in zip(data["cases"], te.CASE_SETS["wgmma_exhaustive"]):
        configs, _ = te.sweep_configs(asked, None)
        # the table was timed while the kernel still had the switches it has since dropped (off in every shipped and
        # default config): its rows with them off, the switches left out, are the space the kernel has now
        rows = [
            dict(r, config={k: v for k, v in r["config"].items() if k not in REMOVED_WGMMA_SWITCHES})
            for r in case["rows"]
            if not any(r["config"].get(k) for k in REMOVED_WGMMA_SWITCHES)
        ]
        assert {json.dumps(r["config"], sort_keys=True) for r in rows} == {
            json.dumps(c, sort_keys=True) for c in configs
        }
        assert all(r["status"] == "ok" and r["rel_error"] <= wg.tolerance("bfloat16") for r in rows)
        fastest = min(rows, key=lambda r: r["time_us"])
        assert fastest["config"] == wg.canonical_config(wg.default_config(case["shape"]), case["shape"])


def test_every_sweep_case_times_its_default_and_starting_configs(te):
    from kernels.registry import get_kernel

    for case in te.GPU_CASES:
        kernel = get_kernel(case.kernel)
        configs, space_size = te.sweep_configs(case, None)
        assert configs and len(configs) <= space_size
        assert len(configs) == (min(case.max_configs, space_size) if case.max_configs else space_size)
        assert kernel.canonical_config(kernel.default_config(case.shape), case.shape) in configs, case
        for c in te._starts(case.kernel, case.shape, case.dtype):
            assert kernel.canonical_config(c, case.shape) in configs, (case, c)
        assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)
        assert all(kernel.canonical_config(c, case.shape) == c for c in configs), case  # each program once


def test_gemm_sweeps_time_each_program_once(te):
    """At M=16 every GEMM config has one row block, so GROUP_M 1 and 8 are one program: the sweep times half the
    rule-passing configs; at M=64 only the 64-row tiles have twins."""
    from kernels.registry import get_kernel

    gemm_kernel = get_kernel("gemm")
    for m in (16, 64):
        case = te.SweepCase("gemm", {"M": m, "N": 7168, "K": 2048})
        configs, programs = te.sweep_configs(case, None)
        every = list(gemm_kernel.configs(case.shape, None, dtype="bfloat16"))
        twins = sum(1 for c in every if c["GROUP_M"] == 8 and c["BLOCK_M"] >= m)
        assert programs == len(configs) == len(every) - twins and twins > 0
        if m == 16:
            assert 2 * programs == len(every)


def test_gemm_samples_at_m1_and_m16_are_the_same_configs(te):
    """The M=1 and M=16 tables of one (N, K) time the same configs (the whole space), so the two compare."""
    by = {(c.shape["M"], c.shape["N"]): c for c in te.GPU_CASES if c.kernel == "gemm"}
    for n in (2048, 4096):
        assert te.sweep_configs(by[(1, n)], None)[0] == te.sweep_configs(by[(16, n)], None)[0]


def test_the_sweep_checks_times_and_records_every_config_on_a_cpu(te):
    """gpu_sweep's own code on a CPU (Triton's interpreter, no compile helpers): every sampled config checked
    against the reference and timed, the torch path beside, the default in every table; the analysis reads it."""
    from kernels.registry import get_kernel

    sd_shape = get_kernel("sparse_decode").shapes("test")[0]
    cases = [
        te.SweepCase("gemm", {"M": 3, "N": 40, "K": 96}, "float32", max_configs=6),
        te.SweepCase("sparse_decode", sd_shape, "float16", max_configs=9),
    ]
    seen = []
    out = te.gpu_sweep(cases, 600.0, 0, 1.0, seen.append, device="cpu")
    assert [c["kernel"] for c in out] == ["gemm", "sparse_decode"] and seen == out
    for case, sizes in zip(out, (6, 9)):
        kernel = get_kernel(case["kernel"])
        assert case["sampled"] == len(case["rows"]) == sizes and case["space_size"] > sizes
        assert kernel.canonical_config(case["default"], case["shape"]) in [r["config"] for r in case["rows"]]
        assert case["torch_us"] > 0 and case["held_out"]
        for r in case["rows"]:
            assert r["status"] == "ok", r
            assert r["time_us"] > 0 and r["rel_error"] <= kernel.tolerance(case["dtype"])
    data = {"gpu": "cpu (interpreter)", "date": "today", "commit": "test", "cases": out}
    res = te.gpu_analysis(data, 1, 1, held_out=True, strategies=("tpe+moves",), firsts=(True,))
    assert [r["n"] for r in res] == [6, 9] and all(r["sampled"] for r in res)


def _sweep_json(path: Path, *, held_out: bool) -> None:
    """The recorded H200 batch-16 sparse decode table in the sweep's JSON format."""
    from kernels.registry import get_kernel

    data = json.loads((ROOT / "tests/kernels/data/sparse_decode_sweep_h200_b16.json").read_text())
    cols = data["columns"][:5]
    kernel = get_kernel("sparse_decode")
    shape = next(s for s in kernel.shapes("v4flash") if s["batch"] == data["batch"])
    rows = [
        {
            "config": dict(zip(cols, r[:5])),
            "status": r[6],
            "time_us": r[5] if r[6] == "ok" else None,
            "compile_s": 1.0,
            "timing_s": 0.03,
        }
        for r in data["rows"]
    ]
    case = {
        "kernel": "sparse_decode",
        "shape": shape,
        "dtype": "bfloat16",
        "held_out": held_out,
        "space_size": len(rows),
        "sampled": len(rows),
        "compiled": len(rows),
        "compile_s_per_config": 1.0,
        "case_wall_s": 30.0,
        "share_s": 40.0,
        "workers": 14,
        "rows": rows,
        "default": kernel.default_config(shape),
        "torch_us": 51.5,
        "floor_us": 2.97,
    }
    path.write_text(
        json.dumps(
            {
                "gpu": "NVIDIA H200",
                "date": "2026-11-29",
                "commit": "634ba5c",
                "torch": "2.11",
                "triton": "3.6.0",
                "cases": [case],
            }
        )
    )


def test_goal_report_replays_held_out_tables_at_each_fraction(te, tmp_path):
    sweep = tmp_path / "sweep.json"
    _sweep_json(sweep, held_out=True)
    assert te.main(["--goal", "held_out", "--analyze-gpu", str(sweep), "--seeds", "2", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "tuner_efficiency_goal_held_out.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| sparse_decode"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "324"  # the recorded table's configs
    for cell, budget in zip(cells[3:6], (16, 32, 65)):  # 5, 10 and 20% of 324 evaluations
        assert cell.endswith(f"/2 ({budget})"), row
    assert cells[7] in ("met", "missed")
    assert "goal" in text and "4 trials asked ahead" in text


def test_goal_report_without_the_starting_configs_replays_the_sampler_alone_and_says_so(te, tmp_path):
    sweep = tmp_path / "sweep.json"
    _sweep_json(sweep, held_out=True)
    assert (
        te.main(
            [
                "--goal",
                "held_out",
                "--no-starts",
                "--analyze-gpu",
                str(sweep),
                "--seeds",
                "2",
                "--out",
                str(tmp_path),
                "--report-name",
                "alone.md",
            ]
        )
        == 0
    )
    text = (tmp_path / "alone.md").read_text()
    assert "without the default and `starting_configs` first (`--no-starts`: the sampler alone)" in text
    assert "--goal held_out --seeds 2 --no-starts --analyze-gpu" in text
    row = next(line for line in text.splitlines() if line.startswith("| sparse_decode"))
    assert row.split("|")[4].strip().endswith("/2 (16)")  # 5% of 324
    assert not (tmp_path / "tuner_efficiency_goal_held_out.md").exists()


def test_goal_report_replays_only_the_fractions_asked_and_says_so(te, tmp_path, capsys):
    """--fractions 0.05,0.1: the 20% column reads "not replayed", the others as a full run's, and the command line in
    the report carries the option; fractions outside the report's, or without the goal's 10%, exit 2 in one line and
    write nothing."""
    sweep = tmp_path / "sweep.json"
    _sweep_json(sweep, held_out=True)
    assert (
        te.main(
            [
                "--goal",
                "held_out",
                "--analyze-gpu",
                str(sweep),
                "--seeds",
                "2",
                "--out",
                str(tmp_path),
                "--fractions",
                "0.05,0.1",
                "--report-name",
                "two.md",
            ]
        )
        == 0
    )
    text = (tmp_path / "two.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| sparse_decode"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3].endswith("/2 (16)") and cells[4].endswith("/2 (32)") and cells[5] == "not replayed", row
    assert "--seeds 2 --fractions 0.05,0.1 --analyze-gpu" in text
    for bad in ("0.05,0.2", "0.1,0.3", "x"):
        assert (
            te.main(
                [
                    "--goal",
                    "held_out",
                    "--analyze-gpu",
                    str(sweep),
                    "--seeds",
                    "1",
                    "--out",
                    str(tmp_path),
                    "--fractions",
                    bad,
                    "--report-name",
                    "bad.md",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert f"--fractions {bad!r}" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "bad.md").exists()


def test_goal_report_leaves_out_tuning_tables_and_says_so(te, tmp_path, capsys):
    sweep = tmp_path / "sweep.json"
    _sweep_json(sweep, held_out=False)
    assert te.main(["--goal", "held_out", "--analyze-gpu", str(sweep), "--seeds", "1", "--out", str(tmp_path)]) == 2
    assert "no held-out table" in capsys.readouterr().err
    assert not (tmp_path / "tuner_efficiency_goal_held_out.md").exists()


def test_goal_held_out_without_a_sweep_file_is_refused(te, tmp_path, capsys):
    assert te.main(["--goal", "held_out", "--out", str(tmp_path)]) == 2
    assert "--analyze-gpu" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU runs the sweep")
def test_gpu_sweep_without_a_gpu_is_refused_in_one_line(te, tmp_path, capsys):
    assert te.main(["--gpu", "--no-analysis", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--gpu needs a CUDA GPU" in err
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_only_selects_a_kernels_cases_or_those_with_one_shape_value(te):
    gemm16 = [c for c in te.GPU_CASES if te.selects("gemm@M=16", c)]
    assert gemm16 and all(c.kernel == "gemm" and c.shape["M"] == 16 for c in gemm16)
    assert len(gemm16) == 2  # one per (N, K)
    assert [c for c in te.GPU_CASES if te.selects("gemm", c)] == [c for c in te.GPU_CASES if c.kernel == "gemm"]
    assert not any(te.selects("gemm@M=3", c) for c in te.GPU_CASES)
    assert not any(te.selects("indexer", c) for c in te.GPU_CASES)


def test_write_tuned_takes_an_exhaustive_tables_best_only_where_it_beats_the_shipped_config(te, tmp_path):
    """From the recorded H200 sweep (2026-11-30): a table whose best beats the shipped config by more than 1% in the
    same table gets that config; one where the shipped config is within 1% keeps it; a sample is skipped."""
    from kernels.configs import config_path, read_config_file, write_config_file

    src = ROOT / "benchmarks/results/tuner_efficiency/h200/2026-11-30_6e5fadf_issue20_sd2.json.gz"
    data = read_json(src)
    case = next(c for c in data["cases"] if c["dtype"] == "bfloat16" and c["shape"]["batch"] == 64)
    ok = sorted((r for r in case["rows"] if r["status"] == "ok"), key=lambda r: r["time_us"])
    best, slow = ok[0], ok[len(ok) // 2]
    sampled = json.loads(json.dumps(case))
    sampled["shape"] = dict(case["shape"], batch=3)
    sampled["rows"][5]["status"] = "not_timed"
    data["cases"] = [case, dict(case, dtype="float8_e4m3fn"), sampled]
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps(data))
    key = "batch=64,d_qk=512,d_v=512,heads=64,topk=640"
    write_config_file(
        "sparse_decode",
        data["gpu"],
        "bfloat16",
        {key: {"config": slow["config"]}},
        triton_version=data["triton"],
        directory=tmp_path,
    )
    write_config_file(
        "sparse_decode",
        data["gpu"],
        "float8_e4m3fn",
        {key: {"config": best["config"]}},
        triton_version=data["triton"],
        directory=tmp_path,
    )
    lines = te.write_tuned([str(f)], directory=tmp_path)
    assert lines[0].startswith(f"sparse_decode {key} bfloat16: wrote") and lines[1].split(": ")[1].startswith("kept")
    assert lines[2].endswith("skipped, a sample of the space")
    entry = read_config_file(config_path("sparse_decode", data["gpu"], "bfloat16", data["triton"], tmp_path))[key]
    assert entry["config"] == best["config"] and entry["time_us"] == round(best["time_us"], 2)
    assert "6e5fadf" in entry["measured"] and "sweep.json" in entry["measured"]
    fp8 = read_config_file(config_path("sparse_decode", data["gpu"], "float8_e4m3fn", data["triton"], tmp_path))[key]
    assert fp8 == {"config": best["config"]}  # kept as it was


def test_replay_merges_rows_of_one_program_and_answers_a_twin_from_its_row(te):
    """GEMM at one row block: GROUP_M 1 and 8 are one program. collapse_programs keeps one row per program (its
    fastest timing); a replayed search that asks for GROUP_M=8 is answered from the GROUP_M=1 row (counted, timed),
    where without the canonical form that config is missing from the table and free."""
    from kernels import get_kernel

    gemm_kernel = get_kernel("gemm")
    shape = {"M": 16, "N": 256, "K": 512}

    def canonical(c):
        return gemm_kernel.canonical_config(c, shape)

    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    rows = [
        {"config": {**base, "GROUP_M": 1}, "time_us": 10.0, "status": "ok"},
        {"config": {**base, "GROUP_M": 8}, "time_us": 9.5, "status": "ok"},
        {"config": {**base, "BLOCK_N": 64, "GROUP_M": 8}, "time_us": None, "status": "failed"},
        {"config": {**base, "BLOCK_N": 64, "GROUP_M": 1}, "time_us": 12.0, "status": "ok"},
    ]
    merged = te.collapse_programs(rows, canonical)
    assert [(r["config"]["BLOCK_N"], r["config"]["GROUP_M"], r["time_us"]) for r in merged] == [
        (32, 1, 9.5),
        (64, 1, 12.0),
    ]
    space = {k: [v] for k, v in base.items()} | {"GROUP_M": [8]}  # the search can only ask for the twin
    keys = list(space)
    table = {tuple({**base, "GROUP_M": 1}[k] for k in keys): 10.0}  # the table timed the GROUP_M=1 copy only
    twin = {**base, "GROUP_M": 8}
    assert te.replay_once(table, space, lambda c: None, 1, 0, "random", [twin], canonical=canonical) == (10.0, 1)
    found, evals = te.replay_once(table, space, lambda c: None, 1, 0, "random", [twin])
    assert (found, evals) == (float("inf"), 0)  # without the canonical form the twin is missing from the table


def test_a_sampled_tables_replay_times_an_off_sample_config_at_its_nearest_sampled_config(te):
    """A sampled table (a 600-config sample of the wgmma kernel's 4,389): a rule-passing config outside the sample
    is one evaluation at the time of the sampled config with the fewest different fields (ties by log2 distance),
    not a free prune (which made the replay draw thousands of free configs and never finish); a rule-failing config
    stays free; an exhaustive table's replay is unchanged (no nearest)."""
    space = {"S": [1, 2, 4, 8], "B": [16, 32]}
    table = {(1, 16): 30.0, (8, 32): 10.0, (1, 32): 20.0}
    nearest = te.nearest_in(list(table), space)
    assert nearest((2, 16)) == (1, 16) and nearest((8, 16)) == (8, 32)  # one field apart from one key only
    assert nearest((2, 32)) == (1, 32)  # one field from both (1, 32) and (8, 32): log2(2/1) = 1 < log2(8/2) = 2
    assert nearest((4, 16)) == (1, 16)  # log2(4) = 2 against log2(8/4) + ... two fields from (8, 32)
    only = {"S": [4], "B": [32]}  # the search can only ask for (4, 32), which the sample lacks: nearest (8, 32)
    off = {"S": 4, "B": 32}
    assert te.replay_once(table, only, lambda c: None, 1, 0, "random", [off], nearest=nearest) == (10.0, 1)
    assert te.replay_once(table, only, lambda c: None, 1, 0, "random", [off]) == (float("inf"), 0)  # pruned, free
    assert te.replay_once(table, only, lambda c: "rule", 1, 0, "random", [off], nearest=nearest) == (float("inf"), 0)
