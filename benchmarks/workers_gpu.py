"""Local workers on a multi-GPU box: the same number of trials with 1 worker on GPU 0, then 2 workers leasing
GPUs 0 and 1 (``tuner search --gpus 0`` vs ``--gpus 0,1``); reports trials/hour and the speed-up.

Needs only torch, triton and this project's wheels (optuna, sqlalchemy, ...): SQLite storage, worker threads in
one process, every trial in its own subprocess with ``CUDA_VISIBLE_DEVICES`` set to its leased GPU.

    python benchmarks/workers_gpu.py --trials 24                 # on the 2-GPU H200 box
    python benchmarks/workers_gpu.py --dry-cpu --trials 6        # end to end on a CPU, fake GPU ids

Writes ``workers_gpu.json`` and ``workers_gpu.md`` under ``$OUT`` (or ``--out``; default benchmarks/results).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_case(label: str, gpus: list[int], args, tmp: str) -> dict:
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    opts = SearchOptions(
        budget_s=args.budget_s,
        storage_url=f"sqlite:///{tmp}/{label}.db",
        study=label,
        space_path=args.space,
        export=False,
        confirm_top=0,
        seed=args.seed,
        n_trials=args.trials,
        workers=len(gpus),
        gpus=gpus,
        trial_timeout_s=args.trial_timeout_s,
    )
    t0 = time.time()
    result = run_search(opts)
    wall = time.time() - t0
    counts: dict[str, int] = {}
    for t in result.trials:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    ran = [t for t in result.trials if t.repeat_of is None]
    row = {
        "case": label,
        "gpus": gpus,
        "workers": len(gpus),
        "trials": len(result.trials),
        "ran": len(ran),
        "wall_s": round(wall, 1),
        "trials_per_hour": round(len(result.trials) / wall * 3600, 1),
        "outcomes": counts,
        "best_value": result.best_value,
        "stop_reason": result.stop_reason,
        "median_trial_s": round(sorted(t.duration_s for t in ran)[len(ran) // 2], 2) if ran else None,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument(
        "--space",
        default=None,
        help="space YAML or built-in name (default: dsv4_flash on a GPU, dsv4_flash_tiny with --dry-cpu)",
    )
    ap.add_argument(
        "--gpus", default="0,1", help="the GPUs of the multi-worker case; the first one alone is the 1-worker case"
    )
    ap.add_argument("--budget-s", dest="budget_s", type=float, default=3000.0)
    ap.add_argument("--trial-timeout-s", dest="trial_timeout_s", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-cpu", action="store_true", help="CPU run with fake GPU ids (checks the plumbing)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    gpus = [int(x) for x in args.gpus.split(",")]
    if args.dry_cpu:
        args.space = args.space or "dsv4_flash_tiny"
    else:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < len(gpus):
            sys.exit(
                f"needs {len(gpus)} CUDA GPUs (found {torch.cuda.device_count() if torch.cuda.is_available() else 0}); "
                "use --dry-cpu to check the plumbing on a CPU"
            )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        one = run_case("one-worker", gpus[:1], args, tmp)
        many = run_case(f"{len(gpus)}-workers", gpus, args, tmp)
    speedup = many["trials_per_hour"] / one["trials_per_hour"] if one["trials_per_hour"] else None
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or "?"
        )
    except OSError:
        commit = "?"
    gpu_name = "cpu (fake GPU ids)"
    if not args.dry_cpu:
        import torch

        gpu_name = torch.cuda.get_device_name(0)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpu": gpu_name,
        "cpus": os.cpu_count(),
        "commit": commit,
        "space": args.space or "dsv4_flash (default on a GPU)",
        "trials": args.trials,
        "dry_cpu": args.dry_cpu,
        "speedup": round(speedup, 2) if speedup else None,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "workers_gpu.json").write_text(json.dumps({"meta": meta, "cases": [one, many]}, indent=2))
    lines = [
        f"# Local workers: 1 vs {len(gpus)} GPUs, {args.trials} trials each",
        "",
        *(f"- {k}: {v}" for k, v in meta.items() if k != "speedup"),
        "",
        "| case | GPUs | trials | wall (s) | trials/hour | median trial (s) | outcomes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in (one, many):
        lines.append(
            f"| {r['case']} | {','.join(map(str, r['gpus']))} | {r['trials']} | {r['wall_s']} | "
            f"{r['trials_per_hour']} | {r['median_trial_s']} | {r['outcomes']} |"
        )
    lines += ["", f"speed-up: {speedup:.2f}x" if speedup else "speed-up: n/a"]
    (out / "workers_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
