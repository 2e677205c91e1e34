"""`benchmarks/main_job.py`, the benchmark of the search itself: its report from stored data, and a real run of the
README's main job twice on the CPU twin with each best measured side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import ROOT, benchmark_script

LEVELS = ["c=1", "c=16", "c=64"]


def _run(seed, study, ratio, trials=12, searched=360.0):
    return {
        "seed": seed,
        "budget": "7m",
        "study": study,
        "storage": f"sqlite:///x/seed-{seed}/tuner.db",
        "trials": trials,
        "searched_s": searched,
        "trials_per_min": 60.0 * trials / searched,
        "median_trial_s": 8.0,
        "median_phase_s": {"spawn": 0.01, "build": 0.2, "measure": 1.5},
        "best_trial": 3,
        "best_value": 100.0 * ratio,
        "baseline_value": 10.0,
        "wall_s": searched + 5,
        "gpu": "NVIDIA H200",
        "date": "2026-12-02",
        "commit": "abc1234",
        "torch": "2.13.0",
    }


def test_the_report_is_written_from_stored_data_with_the_found_over_hand_written_distribution():
    hand = {"c=1": 50.0, "c=16": 500.0, "c=64": 1600.0}
    runs = [_run(0, "a", 0.8, trials=12), _run(1, "b", 1.0, trials=30), _run(2, "c", 0.9, trials=24)]
    for i, r in enumerate(runs):
        r["side_case"] = 2 + i
    runs.append({**_run(3, "d", 0.5), "best_trial": None, "best_value": None})  # no trial succeeded: no case
    cases = [
        {"name": "default (...)", "knobs": {}, "tok_s": {lv: v / 5 for lv, v in hand.items()}, "wall_s": 30},
        {"name": "hand-written best", "knobs": {}, "tok_s": hand, "wall_s": 30},
    ]
    cases += [
        {
            "name": f"best found by `{r['study']}` (trial 3, stored 1.00)",
            "knobs": {},
            "tok_s": {lv: v * r["best_value"] / 100.0 for lv, v in hand.items()},
            "wall_s": 30,
        }
        for r in runs[:3]
    ]
    # run a's exported command at half its best (workload_gpu.py --study-command: compared with that best)
    cases.append(
        {
            "name": "the exported command of `a` (its best less 3 code changes)",
            "knobs": {},
            "base": cases[2]["name"],
            "tok_s": {lv: v * 0.4 for lv, v in hand.items()},
            "wall_s": 30,
        }
    )
    data = {
        "preset": "dsv4-flash",
        "runs": runs,
        "measured": {},
        "side_by_side": {
            "gpu": "NVIDIA H200",
            "date": "2026-12-02",
            "commit": "abc1234",
            "levels": LEVELS,
            "cases": cases,
        },
    }
    with benchmark_script("main_job") as mj:
        text = mj.report(data, source="x/main_job.json")
        ratios = mj.found_over_hand(data)
    assert [round(v, 6) for v in ratios.values()] == [0.8, 1.0, 0.9]
    assert (
        "found / hand-written best (geomean over c=1, c=16, c=64, 3 runs): min 0.800, median 0.900, max 1.000" in text
    )
    assert "trials per minute: min 2.00, median 3.00, max 5.00" in text
    assert "| 3 | d | 12 | 360 | 2.00 | 8.0 | 0.01/0.20/-/-/-/1.50 | - | - |" in text
    assert "NVIDIA H200 on 2026-12-02 at commit abc1234" in text and "`x/main_job.json`" in text
    assert (
        "the exported command of `a` (its best less 3 code changes), seed 0: 0.500 of its best, 0.400 of the "
        "hand-written best"
    ) in text
    assert "| 1 | b | 30 | 360 | 5.00 | 8.0 | 0.01/0.20/-/-/-/1.50 | 1.000 | - |" in text
    assert "Over SGLang" not in text  # no baseline case measured: no line over it


def test_the_report_puts_every_case_over_sglangs_defaults_per_level_when_the_baseline_was_measured():
    hand = {"c=1": 50.0, "c=16": 500.0, "c=64": 1600.0}
    run = {**_run(0, "a", 1.0), "side_case": 2}
    sglang = {"c=1": 25.0, "c=16": 400.0, "c=64": 800.0}
    cases = [
        {"name": "default (...)", "knobs": {}, "tok_s": {lv: v / 5 for lv, v in hand.items()}, "wall_s": 30},
        {"name": "hand-written best", "knobs": {}, "tok_s": hand, "wall_s": 30},
        {"name": "best found by `a` (trial 3, stored 1.00)", "knobs": {}, "tok_s": hand, "wall_s": 30},
        {"name": "SGLang's defaults on this GPU (the baseline of `a`, trial 0)", "knobs": {}, "tok_s": sglang},
    ]
    side = {"gpu": "NVIDIA H200", "date": "2026-12-03", "commit": "abc1234", "levels": LEVELS, "cases": cases}
    with benchmark_script("main_job") as mj:
        text = mj.report({"preset": "dsv4-flash", "runs": [run], "measured": {}, "side_by_side": side})
    assert "Over SGLang's defaults on this GPU (the baseline of `a`, trial 0), per level (c=1, c=16, c=64):" in text
    assert "- best found by `a` (trial 3, stored 1.00), seed 0: 2.00 / 1.25 / 2.00x" in text
    assert "- default (...): 0.40 / 0.25 / 0.40x" in text


def test_the_report_names_the_seed_of_each_best_and_exported_command_when_every_study_has_the_same_name():
    """An H200 main job's three seeds all named their study `dsv4-flash-workload`: its report listed two lines
    "the exported command of `dsv4-flash-workload` ..." with nothing to say which seed each was."""
    hand = {"c=1": 50.0, "c=16": 500.0, "c=64": 1600.0}
    runs = [{**_run(s, "w", 1.0), "side_case": 2 + i} for i, s in enumerate((0, 2))]
    best = [f"best found by `w` (trial {t}, stored 1.00)" for t in (3, 7)]
    cases = [
        {"name": "default (...)", "knobs": {}, "tok_s": hand},
        {"name": "hand-written best", "knobs": {}, "tok_s": hand},
        {"name": best[0], "knobs": {}, "tok_s": {lv: 1.1 * v for lv, v in hand.items()}},
        {"name": best[1], "knobs": {}, "tok_s": {lv: 1.2 * v for lv, v in hand.items()}},
        {"name": "the exported command of `w` (trial 7 less 1 code changes)", "base": best[1], "tok_s": hand},
        {"name": "the exported command of `w` (trial 3 less 1 code changes)", "base": best[0], "tok_s": hand},
        # two commands named alike (stored before the names held the trial): which seed each is, the file cannot say
        {"name": "the exported command of `w` (its best less 2 code changes)", "base": best[1], "tok_s": hand},
        {"name": "the exported command of `w` (its best less 2 code changes)", "base": best[1], "tok_s": hand},
        {"name": "SGLang's defaults on this GPU (the baseline of `w`, trial 0)", "knobs": {}, "tok_s": hand},
    ]
    side = {"gpu": "NVIDIA H200", "date": "2026-12-04", "commit": "abc1234", "levels": LEVELS, "cases": cases}
    with benchmark_script("main_job") as mj:
        text = mj.report({"preset": "dsv4-flash", "runs": runs, "measured": {}, "side_by_side": side})
    assert "- the exported command of `w` (trial 7 less 1 code changes), seed 2: 1.00 / 1.00 / 1.00x" in text
    assert "- the exported command of `w` (trial 3 less 1 code changes), seed 0: 1.00 / 1.00 / 1.00x" in text
    assert text.count("- the exported command of `w` (its best less 2 code changes), one of seeds 0, 2: 1.00") == 2
    assert f"| {best[1]}, seed 2 | 60.0 | 600.0 | 1920.0 |" in text
    assert "| 2 | w | 12 | 360 | 2.00 | 8.0 | 0.01/0.20/-/-/-/1.50 | 1.200 | 1.200 |" in text
    assert "found / SGLang's defaults on this GPU (geomean over c=1, c=16, c=64, 2 runs): min 1.100" in text


def test_report_from_a_filed_json_writes_the_md_beside_it_naming_that_file(tmp_path):
    runs = [{**_run(0, "a", 0.9), "side_case": 2}]
    hand = {"c=1": 50.0, "c=16": 500.0, "c=64": 1600.0}
    cases = [
        {"name": "default (...)", "knobs": {}, "tok_s": hand, "wall_s": 1},
        {"name": "hand-written best", "knobs": {}, "tok_s": hand, "wall_s": 1},
        {
            "name": "best found by `a` (trial 3, stored 1.00)",
            "knobs": {},
            "tok_s": {lv: v * 0.9 for lv, v in hand.items()},
            "wall_s": 1,
        },
    ]
    filed = tmp_path / "2026-12-02_abc1234_7m.json"
    filed.write_text(
        json.dumps(
            {
                "preset": "dsv4-flash",
                "runs": runs,
                "measured": {},
                "side_by_side": {
                    "gpu": "NVIDIA H200",
                    "date": "2026-12-02",
                    "commit": "abc1234",
                    "levels": LEVELS,
                    "cases": cases,
                },
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "main_job.py"), "report", "--from", str(filed)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = filed.with_suffix(".md").read_text()
    assert f"from `{filed.as_posix()}`" in text and "min 0.900, median 0.900, max 0.900" in text
    missing = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "main_job.py"), "report", "--from", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert missing.returncode != 0 and "nope.json: no such file" in missing.stderr


def test_the_main_job_benchmark_runs_two_seeds_on_the_cpu_twin_and_writes_its_json_and_report(tmp_path):
    out = tmp_path / "main_job"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TUNER_NUMERICS_CACHE": str(tmp_path / "numerics")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "main_job.py"),
            "all",
            "--seeds",
            "0,1",
            "--budget",
            "40s",
            "--out-dir",
            str(out),
            "--repeats",
            "1",
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "main_job.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [0, 1] and data["preset"] == "dsv4-flash-tiny"
    for r in data["runs"]:
        # the run's time includes the export after the 40-s budget (SGLang's parser read in a subprocess to check the
        # command's flags): 12 s of it on a loaded 2-core machine, measured 2026-12-03 (trials ended at 37 s)
        assert r["trials"] >= 1 and r["searched_s"] <= 40 + 15 and r["gpu"] == "cpu"
        assert r["exit_code"] == (0 if r["best_trial"] is not None else 1)
        assert Path(r["storage"].removeprefix("sqlite:///")).parent == out / f"seed-{r['seed']}"
    side = data["side_by_side"]
    names = [c["name"] for c in side["cases"]]
    assert names[:2] == ["default (the CPU twin's space defaults)", "hand-written best"]
    assert all("tok_s" in c for c in side["cases"][:2]), side["cases"][:2]
    with_best = [r for r in data["runs"] if r["best_trial"] is not None]
    bests, commands = side["cases"][2 : 2 + len(with_best)], side["cases"][2 + len(with_best) : -1]
    assert all(c["name"].startswith("best found by") for c in bests)
    # last, the first run's baseline trial (on a CPU: the tiny space's defaults), and every case over it in the report
    baseline = side["cases"][-1]
    assert baseline["name"] == f"SGLang's defaults on this GPU (the baseline of `{with_best[0]['study']}`, trial 0)"
    assert "tok_s" in baseline, baseline
    assert f"Over {baseline['name']}, per level ({', '.join(side['levels'])}):" in (out / "main_job.md").read_text()
    # then each exported command's configuration (where it differs from its best), compared with that best
    assert all(
        c["name"].startswith("the exported command of") and c["base"] in [b["name"] for b in bests] for c in commands
    )
    # one command per best, each compared with its own (the names were alike, so every base was the last best's)
    assert len({c["name"] for c in commands}) == len({c["base"] for c in commands}) == len(commands), commands
    with benchmark_script("main_job") as mj:
        assert (out / "main_job.md").read_text() == mj.report(data, source=out / "main_job.json")
        ratios = mj.found_over_hand(data)
    assert [r["side_case"] for r in with_best] == list(range(2, 2 + len(with_best)))
    assert len(ratios) == len([c for c in bests if "tok_s" in c])
    assert all(f"{c['name']}, seed " in (out / "main_job.md").read_text() for c in commands if "tok_s" in c)
    assert all(v > 0 for v in ratios.values())


def test_compare_runs_this_checkout_and_another_at_the_same_time_and_reports_both_commits(tmp_path):
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(other)], check=True, timeout=120)
    head = subprocess.run(
        ["git", "-C", str(other), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = tmp_path / "cmp"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TUNER_NUMERICS_CACHE": str(tmp_path / "numerics")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "main_job.py"),
            "compare",
            "--tree",
            str(other),
            "--seeds",
            "0",
            "--budget",
            "20s",
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "runs.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [0, 0] and data["runs"][1]["commit"] == head == data["compared_with"]
    assert sorted(p.name for p in out.glob("seed-*")) == sorted(["seed-0", f"seed-0-{head}"])
    with benchmark_script("main_job") as mj:
        assert (out / "runs.md").read_text() == mj.runs_report(data, source=out / "runs.json")
    assert all(r["trials"] >= 1 for r in data["runs"])
    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "main_job.py"),
            "compare",
            "--tree",
            str(tmp_path),
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "not a git checkout of tuner" in bad.stderr
