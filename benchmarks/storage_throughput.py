"""How many trials per second 8 workers (threads of one process) can start and finish through the storage.

Each trial is what a worker writes around a real trial, without running anything: Optuna ask (RandomSampler,
so the sampler costs nothing), ``tuner_trials`` start, ``tuner_trials`` finish with one metric, Optuna tell,
with the heartbeat-enabled, reconnecting storage workers use. Runs on SQLite (a file) and, when a URL is
given, on PostgreSQL; writes a Markdown table.

    python benchmarks/storage_throughput.py --postgres postgresql://postgres@127.0.0.1:55432/postgres \
        --out benchmarks/results/storage_throughput/cpu/2026-11-29_5b43e25.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import tempfile
import threading
import time
import uuid

import optuna

from storage import Repo
from storage.repo import MetricRow
from tuner.search.parallel import open_worker_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


def measure(url: str, workers: int, trials: int) -> dict:
    repo = Repo(url, pool_size=workers + 2)
    repo.create_schema()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    run = repo.create_run(name, target="workload", budget_s=3600)
    storage = open_worker_storage(url, pool_size=2 * workers + 2)
    optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study = optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    per_worker = trials // workers
    errors: list[str] = []
    latencies: list[float] = []

    def work() -> None:
        for _ in range(per_worker):
            t0 = time.perf_counter()
            try:
                trial = study.ask()
                x = trial.suggest_float("x", 0, 1)
                repo.start_trial(run.id, trial.number, {"x": x}, worker=threading.current_thread().name)
                repo.finish_trial(run.id, trial.number, outcome="ok", value=x, metrics=[MetricRow("v", "", x)])
                study.tell(trial, x)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=work, name=f"w{i}") for i in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = repo.count_trials(run.id, state="complete")
    latencies.sort()
    repo.engine.dispose()
    return {
        "done": done,
        "wall_s": wall,
        "per_s": done / wall,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p95_ms": 1000 * latencies[int(len(latencies) * 0.95) - 1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", default=os.environ.get("TUNER_TEST_POSTGRES_URL"))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("SQLite (file, WAL)", measure(f"sqlite:///{tmp}/bench.db", args.workers, args.trials)))
    if args.postgres:
        rows.append(("PostgreSQL (psycopg 3)", measure(args.postgres, args.workers, args.trials)))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    lines = [
        "# Storage throughput: trials started and finished per second by 8 workers",
        "",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}, Optuna {optuna.__version__}",
        f"- commit: {commit}",
        f"- workload: {args.workers} threads in one process, {args.trials} trials; per trial: Optuna ask "
        "(RandomSampler) + tuner_trials start + finish (1 metric) + Optuna tell, heartbeat-enabled reconnecting "
        "storage (`tuner.search.parallel.open_worker_storage`)",
        "",
        "| storage | trials done | wall (s) | trials/s | p50 per trial (ms) | p95 (ms) | errors |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['done']} | {r['wall_s']:.1f} | {r['per_s']:.1f} | {r['p50_ms']:.0f} | "
            f"{r['p95_ms']:.0f} | {r['errors']}{' (' + r['first_error'] + ')' if r['errors'] else ''} |"
        )
    lines += [
        "",
        "Choice of default: SQLite stays the default for one process (nothing to install, and in one process it",
        "keeps up with 8 writer threads: its writes are serialized but short). Both backends start and finish",
        "tens of trials per second, while a real trial costs at least its subprocess (~0.5 s on a CPU) and seconds",
        "to minutes on a GPU, so the storage is never the bottleneck. PostgreSQL is required as soon as workers",
        "are separate processes or machines (`tuner worker` refuses SQLite): SQLite's file lock does not work",
        "across machines, and several writer processes on one file meet `database is locked`.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
