"""Report of a twin (workload) search from its stored study: best x default per level, the side-by-side table of
``benchmarks/workload_gpu.py``, the numerics error of every knob value the successful trials kept, and the exported
SGLang command, checked here with SGLang's own parser (needs SGLang installed, no GPU).

    python benchmarks/twin_report.py --db twin19_h200.db --study twin19-h200 \\
        [--side-by-side workload_twin19_h200.md] --out benchmarks/results/twin_report/h200/2026-11-30_0819ad9_twin19.md

Every figure is read from the study database (or the side-by-side file, quoted whole); the report names both.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _levels(trial) -> dict[str, float]:
    return {m.level: m.value for m in trial.measurements if m.metric == "tok_s" and m.level}


def _sessions(trials, run, gap_s: float = 30.0) -> str:
    """When the search ran, from its trials' own times: a resumed search shows as several sessions (a gap between
    one trial's end and the next one's start longer than ``gap_s``)."""
    spans: list[list] = []
    for t in sorted(trials, key=lambda t: t.started_at):
        end = t.finished_at or t.started_at
        if spans and (t.started_at - spans[-1][1]).total_seconds() <= gap_s:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([t.started_at, end])
    if len(spans) <= 1:
        return f"Search started {run.started_at:%Y-%m-%d %H:%M} UTC, budget {run.budget_s:.0f} s"
    parts = ", ".join(f"{a:%H:%M:%S}-{b:%H:%M:%S}" for a, b in spans)
    total = sum((b - a).total_seconds() for a, b in spans)
    return (
        f"Search on {spans[0][0]:%Y-%m-%d} in {len(spans)} sessions (resumed with `--resume`), trials at {parts} "
        f"UTC, {total:.0f} s of trials in all; the last session's budget {run.budget_s:.0f} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True, help="the study's SQLite file")
    ap.add_argument("--study", required=True)
    ap.add_argument("--side-by-side", default=None, help="the markdown benchmarks/workload_gpu.py wrote")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--run-commit",
        default=None,
        help="the TUNER_COMMIT the search ran under, printed beside what "
        "the database recorded (a tree copied to a GPU host may carry a stale .git)",
    )
    args = ap.parse_args()
    from storage import Repo
    from tuner.explain import numerics_summary
    from tuner.targets.workload.deploy import parse_launch_script

    repo = Repo(f"sqlite:///{args.db}")
    run = repo.get_run(args.study)
    if run is None or run.best_trial_number is None:
        raise SystemExit(f"{args.db}: no study {args.study!r} with a best trial")
    env = run.environment or {}
    gpu = ", ".join(g["name"] for g in env.get("gpus", [])) or "cpu"
    best = repo.get_trial(run.id, run.best_trial_number)
    base = repo.baseline_trial(run.id)
    counts = repo.outcome_counts(run.id)
    lines = [
        f"# Twin search `{run.study_name}` on {gpu}",
        "",
        _sessions(repo.list_trials(run.id), run)
        + ", tuner commit "
        + (
            f"{args.run_commit} (the run's TUNER_COMMIT; the database records {env.get('git_sha')}, read from the "
            "copied tree's stale .git)"
            if args.run_commit and args.run_commit != env.get("git_sha")
            else f"{env.get('git_sha')}"
        )
        + f", torch {env.get('torch')}, triton {env.get('triton')}; report written "
        f"{dt.date.today()} by `benchmarks/twin_report.py` from `{Path(args.db).name}`.",
        "",
        "Trials: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        "",
        f"## Best (trial {best.number}) against the default (trial {base.number if base else '?'}), as stored",
        "",
        "| level | default tok/s | best tok/s | x default |",
        "| --- | --- | --- | --- |",
    ]
    b, d = _levels(best), _levels(base) if base else {}
    for lv in sorted(b, key=lambda s: int(s.split("=")[1])):
        ratio = f"{b[lv] / d[lv]:.2f}x" if d.get(lv) else "-"
        lines.append(f"| {lv} | {d.get(lv, float('nan')):.1f} | {b[lv]:.1f} | {ratio} |")
    lines += ["", "Best parameters: " + ", ".join(f"{k}={v}" for k, v in best.params.items()), ""]
    if args.side_by_side:
        text = Path(args.side_by_side).read_text()
        lines += [
            f"## Side by side with the hand-written best (`{Path(args.side_by_side).name}`, "
            "benchmarks/workload_gpu.py --only-ends --study-best)",
            "",
            text.strip(),
            "",
        ]
    num = numerics_summary(repo, run.id, best)
    # since 144d3c7 the gate compares with a precise reference and stores the baseline's own error beside it
    against = (
        "the precise reference's (fp32 GEMMs, torch operators)"
        if any(m.metric == "numerics_baseline_err" for m in best.measurements)
        else "the default configuration's"
    )
    lines += [f"## Numerics: output against {against} (relative norm error, fixed inputs)", ""]
    if num:
        lines.append(f"The best: {num['best']:.3g} (tolerance {num['tolerance']:.3g}).")
        lines += ["", "| knob | value | successful trials | max error |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['param']} | {r['value']} | {r['trials']} | {r['max_err']:.3g} |" for r in num["rows"]]
        lines += [""] + [
            f"- trial {w['trial']}: wrong_result, error {w['err']:.3g}: "
            + ", ".join(f"{k}={v}" for k, v in w["params"].items())
            for w in num["wrong"]
        ]
    else:
        lines.append("The study stored no numerics errors (searched before the gate existed, or with numerics off).")
    art = repo.get_artifact(run.id, "launch.sh")
    lines += ["", "## The exported SGLang command (launch.sh as stored with the study)", ""]
    if art is None:
        lines.append("No launch.sh stored with the study.")
    else:
        script = art.content.decode()
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "launch.sh"
            p.write_text(script)
            try:
                doc = parse_launch_script(p)
                a = doc["args"]
                ok = (
                    f"SGLang {doc['sglang']}'s own parser accepts it (context_length={a.get('context_length')}, "
                    f"cuda_graph_bs_decode={a.get('cuda_graph_bs_decode')})."
                )
            except (ValueError, OSError) as exc:
                ok = f"Not checked or refused by SGLang's parser here: {exc}"
        lines += [ok, "", "```bash", script.strip(), "```", ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
