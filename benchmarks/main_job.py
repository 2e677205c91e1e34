"""A benchmark of the search itself: the README's main job run K times with different seeds, each run's best measured
side by side with the default and the hand-written best in one run, and a report written from the stored data.

    # one invocation per seed (each fits a 10-minute device command at --budget 7m): the README's command,
    # `tuner search --budget B --seed S`, in a fresh folder OUT/seed-S (its own tuner.db and tuner-out/)
    python benchmarks/main_job.py search --seed 0 --budget 7m --out-dir OUT
    # then one invocation for all: every stored run's best beside the default and the hand-written best, in ONE run of
    # `benchmarks/workload_gpu.py --only-ends --study-best ...` (OUT/side_by_side.{json,md}), then the report
    python benchmarks/main_job.py measure --out-dir OUT
    # the report again from the stored JSON (no search, no device); --from: a JSON filed under benchmarks/results/
    python benchmarks/main_job.py report --out-dir OUT
    python benchmarks/main_job.py report --from benchmarks/results/main_job/h200/<date>_<commit>_7m.json
    # a CPU's before and after: per seed, this checkout's main job and an older commit's at the same time
    python benchmarks/main_job.py compare --tree /tmp/old --seeds 0,1,2 --budget 2m --out-dir OUT
    # all of it in one go (a CPU test: --seeds 0,1 --budget 20s)
    python benchmarks/main_job.py all --seeds 0,1 --budget 20s --out-dir OUT

Stored: ``OUT/seed-S/run.json`` per search (seed, budget, trials, wall time, trials per minute, the median trial's
seconds and where they went, the study's recorded best), ``OUT/side_by_side.json`` (workload_gpu.py's raw data),
``OUT/main_job.json`` (all of it) and ``OUT/main_job.md`` (:func:`report` over ``main_job.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("spawn", "build", "numerics", "compile", "capture", "measure")


def _env() -> dict:
    from tuner.fingerprint import fingerprint

    env = fingerprint()
    return {
        "gpu": env["gpus"][0]["name"] if env.get("gpus") else "cpu",
        "date": str(dt.date.today()),
        "commit": os.environ.get("TUNER_COMMIT") or env.get("git_sha"),
        "torch": env.get("torch"),
    }


def run_search(seed: int, budget: str, out_dir: Path, tree: Path | None = None) -> dict:
    """The README's main job in a fresh folder ``out_dir/seed-S`` (``seed-S-<commit>`` when ``tree``: that checkout's
    tuner, e.g. an older commit's, run the same way); returns (and stores as ``run.json``) its figures read back from
    the study's database."""
    code = ROOT if tree is None else tree.resolve()
    commit = None if tree is None else _tree_commit(code)
    folder = out_dir / (f"seed-{seed}" + (f"-{commit}" if commit else ""))
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(
            f"error: {folder} is not empty; the main job runs in a fresh folder: remove it or use another --out-dir"
        )
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "search", "--budget", budget, "--seed", str(seed)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    (folder / "search.log").write_text(out.stdout + out.stderr)
    if not (folder / "tuner.db").exists():  # exit code 1 with a database is a search where no trial succeeded: data
        raise SystemExit(
            f"error: `tuner search --budget {budget} --seed {seed}` in {folder} exited with "
            f"{out.returncode} and stored no study; see {folder / 'search.log'}"
        )
    run = {
        "seed": seed,
        "budget": budget,
        "wall_s": wall,
        "exit_code": out.returncode,
        **study_figures(f"sqlite:///{folder / 'tuner.db'}"),
        **_env(),
    }
    if commit:
        run["commit"] = commit
    (folder / "run.json").write_text(json.dumps(run, indent=1))
    return run


def _tree_commit(tree: Path) -> str:
    got = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if got.returncode != 0 or not (tree / "tuner" / "cli.py").is_file():
        raise SystemExit(f"error: --tree {tree}: not a git checkout of tuner; give a clone at the commit to compare")
    return got.stdout.strip()


def compare(tree: Path, seeds: list[int], budget: str, out_dir: Path) -> dict:
    """Per seed, this checkout's main job and ``tree``'s (an older commit's) run at the same time, so that both see
    the same load; then ``runs.json`` and its report (no side-by-side run: a CPU's before and after)."""
    from concurrent.futures import ThreadPoolExecutor

    compared_with = _tree_commit(tree.resolve())  # a wrong --tree is refused before anything runs
    # two searches at once: each gets half the cores for torch's intra-op threads, or the pair oversubscribes them
    # (on 2 cores with torch's default, trials took 20-30 s instead of 1-3 s and a baseline's two runs spread 57-113%)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    runs = []
    for seed in seeds:
        with ThreadPoolExecutor(2) as pool:
            pair = [
                pool.submit(run_search, seed, budget, out_dir),
                pool.submit(run_search, seed, budget, out_dir, tree),
            ]
            runs += [f.result() for f in pair]
    data = {"runs": runs, "compared_with": compared_with, "measured": _env(), "threads": os.environ["OMP_NUM_THREADS"]}
    (out_dir / "runs.json").write_text(json.dumps(data, indent=1))
    (out_dir / "runs.md").write_text(runs_report(data, source=out_dir / "runs.json"))
    return data


def study_figures(url: str) -> dict:
    """A stored search's trials, its searched seconds, trials per minute, median trial seconds (and per phase) and
    its recorded best."""
    from storage import Repo
    from storage.repo import elapsed_s

    repo = Repo(url, create=False)
    runs = repo.list_runs()
    if len(runs) != 1:
        raise SystemExit(f"error: {url} holds {len(runs)} studies; the main job's folder holds exactly one")
    run = runs[0]
    trials = repo.list_trials(run.id, with_measurements=True)
    ran = [t for t in trials if t.duration_s]
    phases = {}
    for k in PHASES:
        vals = [m.value for t in ran for m in t.measurements if m.metric == "trial_time_s" and m.level == k]
        if vals:
            phases[k] = statistics.median(vals)
    searched = elapsed_s(run)
    return {
        "study": run.study_name,
        "storage": url,
        "trials": len(trials),
        "searched_s": searched,
        "trials_per_min": 60.0 * len(trials) / searched if searched else None,
        "median_trial_s": statistics.median([t.duration_s for t in ran]) if ran else None,
        "median_phase_s": phases,
        "outcomes": repo.outcome_counts(run.id),
        "best_trial": run.best_trial_number,
        "best_value": run.best_value,
        "baseline_value": run.baseline_value,
    }


def measure(out_dir: Path, preset: str, repeats: int, timeout: float) -> dict:
    """Every stored run's best beside the default and the hand-written best, in one run of workload_gpu.py; then
    ``main_job.json`` and the report."""
    # each run's database where it lies now (the folders may have been copied from the machine that searched)
    runs = [
        {**json.loads(p.read_text()), "storage": f"sqlite:///{p.parent / 'tuner.db'}"}
        for p in sorted(out_dir.glob("seed-*/run.json"))
    ]
    if not runs:
        raise SystemExit(f"error: no stored run under {out_dir} (seed-*/run.json); run `main_job.py search` first")
    with_best = [r for r in runs if r.get("best_trial") is not None]
    for i, r in enumerate(with_best):  # workload_gpu.py runs the two ends, then each --study-best in order: every
        r["side_case"] = 2 + i  # fresh folder's study has the same name, so a run finds its case by position
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "workload_gpu.py"),
        "--only-ends",
        "--preset",
        preset,
        "--repeats",
        str(repeats),
        "--timeout",
        str(timeout),
        "--out",
        str(out_dir / "side_by_side.md"),
    ]
    for r in with_best:
        argv += ["--study-best", f"{r['storage']}#{r['study']}"]
    for r in with_best:  # after every best (the positions above stay): each exported command's configuration
        argv += ["--study-command", f"{r['storage']}#{r['study']}"]
    if with_best:  # last: the baseline the first run's machine resolved (on a mapped GPU, SGLang's default path)
        argv += ["--study-baseline", f"{with_best[0]['storage']}#{with_best[0]['study']}"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    (out_dir / "side_by_side.log").write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"error: workload_gpu.py exited with {out.returncode}; see {out_dir / 'side_by_side.log'}")
    side = json.loads((out_dir / "side_by_side.json").read_text())
    data = {"preset": preset, "runs": runs, "side_by_side": side, "measured": _env()}
    (out_dir / "main_job.json").write_text(json.dumps(data, indent=1))
    (out_dir / "main_job.md").write_text(report(data, source=out_dir / "main_job.json"))
    return data


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def found_over_hand(data: dict) -> dict[str, float]:
    """Per study: the geomean over the levels of its best's tok/s over the hand-written best's, both measured in
    the one side-by-side run."""
    hand = next(c for c in data["side_by_side"]["cases"] if c["name"] == "hand-written best")
    return _found_over(data, hand)


def _sglang_case(side: dict) -> dict | None:
    """The measured case of SGLang's defaults on the GPU (``--study-baseline``), if any."""
    return next((c for c in side["cases"] if c["name"].startswith("SGLang's defaults") and "tok_s" in c), None)


def found_over_sglang(data: dict) -> dict[str, float]:
    """Per study: its best's tok/s over SGLang's defaults on the GPU (the baseline), geomean over the levels, both
    measured in the one side-by-side run; empty when the baseline was not measured."""
    sglang = _sglang_case(data["side_by_side"])
    return _found_over(data, sglang) if sglang is not None else {}


def _found_over(data: dict, ref: dict) -> dict[str, float]:
    side = data["side_by_side"]
    levels = side["levels"]
    out = {}
    for r in data["runs"]:
        case = side["cases"][r["side_case"]] if r.get("side_case") is not None else None
        if case is None or "tok_s" not in case or "tok_s" not in ref:
            continue
        out[r["study"] + f" (seed {r['seed']})"] = _geomean([case["tok_s"][lv] / ref["tok_s"][lv] for lv in levels])
    return out


def case_labels(data: dict) -> list[str]:
    """Each side-by-side case's name, with the seed whose run it is for a run's best and its exported command:
    every seed's study has the same name, so the names alone do not say which run a case is."""
    cases = data["side_by_side"]["cases"]
    labels = [c["name"] for c in cases]
    seed_of = {}
    for r in data["runs"]:
        i = r.get("side_case")
        if i is not None and i < len(cases):
            labels[i] = f"{cases[i]['name']}, seed {r['seed']}"
            seed_of[cases[i]["name"]] = r["seed"]
    commands = [c["name"] for c in cases if c["name"].startswith("the exported command of")]
    for i, c in enumerate(cases):
        if not c["name"].startswith("the exported command of"):
            continue
        if commands.count(c["name"]) > 1:  # workload_gpu.py before 2026-12-04 named every seed's command alike and
            # stored the last one's best as each one's base: which seed a case is, the file cannot tell
            labels[i] = f"{c['name']}, one of seeds {', '.join(str(s) for s in seed_of.values())}"
        elif c.get("base") in seed_of:
            labels[i] = f"{c['name']}, seed {seed_of[c['base']]}"
    return labels


def report(data: dict, source: Path | str = "main_job.json") -> str:
    """The Markdown report of a stored ``main_job.json`` (no search, no device)."""
    runs, side = data["runs"], data["side_by_side"]
    ratios = found_over_hand(data)
    over_sglang = found_over_sglang(data)
    label = dict(zip(map(id, side["cases"]), case_labels(data)))
    first = runs[0]
    budgets = sorted({r["budget"] for r in runs})
    lines = [
        f"# The main job, {len(runs)} runs of `tuner search --budget {', '.join(budgets)}` ({data['preset']})",
        "",
        f"searches on {first['gpu']} on {first['date']} at commit {first['commit']}; side by side on "
        f"{side['gpu']} on {side['date']} at commit {side['commit']}; written by `benchmarks/main_job.py report` "
        f"from `{source if isinstance(source, str) else Path(source).name}`",
        "",
        "| seed | study | trials | searched s | trials/min | median trial s | median s per phase "
        f"({'/'.join(PHASES)}) | found / hand-written (geomean, side by side) | found / SGLang's defaults |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in runs:
        key = r["study"] + f" (seed {r['seed']})"
        ph = r.get("median_phase_s") or {}
        ratio = f"{ratios[key]:.3f}" if key in ratios else "-"
        vs_sglang = f"{over_sglang[key]:.3f}" if key in over_sglang else "-"
        lines.append(
            f"| {r['seed']} | {r['study']} | {r['trials']} | {r['searched_s']:.0f} | "
            f"{r['trials_per_min']:.2f} | {r['median_trial_s']:.1f} | "
            + "/".join(f"{ph[k]:.2f}" if k in ph else "-" for k in PHASES)
            + f" | {ratio} | {vs_sglang} |"
        )
    tpm = [r["trials_per_min"] for r in runs if r.get("trials_per_min")]
    lines += [""]
    if tpm:
        lines.append(f"trials per minute: min {min(tpm):.2f}, median {statistics.median(tpm):.2f}, max {max(tpm):.2f}")
    if ratios:
        v = sorted(ratios.values())
        lines.append(
            f"found / hand-written best (geomean over {', '.join(side['levels'])}, {len(v)} runs): "
            f"min {v[0]:.3f}, median {statistics.median(v):.3f}, max {v[-1]:.3f}"
        )
    else:
        lines.append("found / hand-written best: no run had a best measured side by side")
    if over_sglang:
        v = sorted(over_sglang.values())
        lines.append(
            f"found / SGLang's defaults on this GPU (geomean over {', '.join(side['levels'])}, {len(v)} runs): "
            f"min {v[0]:.3f}, median {statistics.median(v):.3f}, max {v[-1]:.3f}"
        )
    hand = next((c for c in side["cases"] if c["name"] == "hand-written best" and "tok_s" in c), None)
    by_name = {c["name"]: c for c in side["cases"] if "tok_s" in c}
    for c in side["cases"]:  # each exported command's configuration (workload_gpu.py --study-command)
        best = by_name.get(c.get("base", ""))
        if not c["name"].startswith("the exported command of") or "tok_s" not in c or best is None:
            continue
        vs_best = _geomean([c["tok_s"][lv] / best["tok_s"][lv] for lv in side["levels"]])
        vs_hand = _geomean([c["tok_s"][lv] / hand["tok_s"][lv] for lv in side["levels"]]) if hand else float("nan")
        of = "its best" if ", one of seeds" not in label[id(c)] else f"the base stored with it ({best['name']})"
        lines.append(
            f"{label[id(c)]}: {vs_best:.3f} of {of}, {vs_hand:.3f} of the hand-written best (geomean, side by side)"
        )
    sglang = _sglang_case(side)
    if sglang is not None:  # every measured case over SGLang's default path on this GPU, per level
        lines += [
            "",
            f"{sglang['name']} ran: " + ", ".join(f"{k}={v}" for k, v in sglang.get("knobs", {}).items()),
            "(which of these are SGLang's own kernels and which the twin's stand-ins: the export's header, part by part)",
            "",
            f"Over {sglang['name']}, per level ({', '.join(side['levels'])}):",
            "",
        ]
        for c in side["cases"]:
            if c is sglang or "tok_s" not in c:
                continue
            per = " / ".join(f"{c['tok_s'][lv] / sglang['tok_s'][lv]:.2f}" for lv in side["levels"])
            lines.append(f"- {label[id(c)]}: {per}x")
    lines += [
        "",
        "Side by side (tok/s, one run of `benchmarks/workload_gpu.py --only-ends --study-best ... "
        "--study-command ... --study-baseline ...`):",
        "",
    ]
    lines += [
        "| configuration | " + " | ".join(side["levels"]) + " |",
        "| --- | " + " | ".join("---:" for _ in side["levels"]) + " |",
    ]
    for c in side["cases"]:
        cells = [f"{c['tok_s'][lv]:.1f}" if "tok_s" in c else f"failed: {c.get('error', '')}" for lv in side["levels"]]
        lines.append(f"| {label[id(c)]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def runs_report(data: dict, source: Path | str = "runs.json") -> str:
    """The Markdown of a stored ``runs.json`` (:func:`compare`: this checkout's main job and an older commit's, run
    at the same time per seed on the same machine)."""
    runs, env = data["runs"], data["measured"]
    budgets = sorted({r["budget"] for r in runs})
    lines = [
        f"# The main job before and after: `tuner search --budget {', '.join(budgets)}` at two commits, run at "
        "the same time",
        "",
        f"on {env['gpu']} on {env['date']}, commits {', '.join(dict.fromkeys(r['commit'][:7] for r in runs))} "
        f"(each seed's two searches side by side on the same load"
        + (f", each with OMP_NUM_THREADS={data['threads']}" if data.get("threads") else "")
        + "); written by `benchmarks/main_job.py report` "
        f"from `{source if isinstance(source, str) else Path(source).name}`",
        "",
        "| seed | commit | trials | outcomes | trials/min | median trial s | exported | best | baseline | x baseline |",
        "| ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in runs:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("outcomes", {}).items()))
        best = r.get("best_trial")
        exported = "nothing" if best is None else ("the defaults (trial 0)" if best == 0 else f"trial {best}")
        gain = f"{r['best_value'] / r['baseline_value']:.2f}" if best is not None and r.get("baseline_value") else "-"
        value = f"{r['best_value']:.1f}" if best is not None else "-"
        base = f"{r['baseline_value']:.2f}" if r.get("baseline_value") else "-"
        lines.append(
            f"| {r['seed']} | {r['commit'][:7]} | {r['trials']} | {outcomes} | {r['trials_per_min']:.2f} | "
            f"{r['median_trial_s']:.1f} | {exported} | {value} | {base} | {gain} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["search", "measure", "report", "all", "compare"])
    ap.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="search, compare: another checkout (an older commit) "
        "whose main job runs the same way; compare runs it at the same time as this one's",
    )
    ap.add_argument("--out-dir", type=Path, default=None, help="search, measure, all, report: the runs' folder")
    ap.add_argument(
        "--from",
        dest="from_json",
        type=Path,
        default=None,
        help="report: a stored main_job.json filed elsewhere (benchmarks/results/...); writes the .md beside it",
    )
    ap.add_argument("--seed", type=int, default=0, help="search: the run's seed")
    ap.add_argument("--seeds", default="0,1,2", help="all: the runs' seeds")
    ap.add_argument("--budget", default="7m", help="search, all: each run's budget (tuner's syntax: 20s, 7m, 1h)")
    ap.add_argument(
        "--preset",
        default=None,
        help="measure: the twin's preset (default: dsv4-flash on a GPU, dsv4-flash-tiny on a CPU, as the main job)",
    )
    ap.add_argument("--repeats", type=int, default=10, help="measure: timed steps per level")
    ap.add_argument("--timeout", type=float, default=180, help="measure: seconds per configuration")
    args = ap.parse_args(argv)
    if args.step == "report" and args.from_json is not None:
        from benchmarks.common import stored_path

        if not args.from_json.is_file():
            raise SystemExit(f"error: --from {args.from_json}: no such file; give a stored main_job JSON")
        stored = json.loads(args.from_json.read_text())
        text = (report if "side_by_side" in stored else runs_report)(
            stored, source=stored_path(args.from_json.resolve())
        )
        args.from_json.with_suffix(".md").write_text(text)
        print(text)
        return 0
    if args.out_dir is None:
        raise SystemExit(f"error: {args.step} needs --out-dir DIR (the runs' folder), e.g. --out-dir out/main_job")
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.preset is None:
        import torch

        args.preset = "dsv4-flash" if torch.cuda.is_available() else "dsv4-flash-tiny"
    if args.step == "report":
        path = out_dir / "main_job.json"
        if not path.exists():
            raise SystemExit(f"error: no {path}; run `main_job.py measure --out-dir {args.out_dir}` first")
        (out_dir / "main_job.md").write_text(report(json.loads(path.read_text()), source=path))
    elif args.step == "search":
        print(json.dumps(run_search(args.seed, args.budget, out_dir, args.tree)))
        return 0
    elif args.step == "compare":
        if args.tree is None:
            raise SystemExit(
                "error: compare needs --tree DIR, a checkout of the commit to compare with "
                "(git worktree add DIR COMMIT)"
            )
        compare(args.tree, [int(x) for x in args.seeds.split(",") if x.strip()], args.budget, out_dir)
        print((out_dir / "runs.md").read_text())
        return 0
    else:
        if args.step == "all":
            for s in [int(x) for x in args.seeds.split(",") if x.strip()]:
                print(json.dumps(run_search(s, args.budget, out_dir)), flush=True)
        measure(out_dir, args.preset, args.repeats, args.timeout)
    print((out_dir / "main_job.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
