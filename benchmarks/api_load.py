"""Load benchmark of the API: 10,000 trials in SQLite, a real uvicorn server, 100 concurrent httpx clients.

    python benchmarks/api_load.py [--trials 10000] [--clients 100] [--seconds 20] [--out FILE.md]

Two phases against the study and trials endpoints:

- ``paced``: every client sends a request, then waits until its next slot (``--rate`` requests per second per
  client): 100 dashboards or scripts polling. This is what the p99 target is about.
- ``saturated``: every client sends its next request as soon as the last one returned: the server's ceiling.

The server runs in its own process (one uvicorn worker, as ``tuner serve`` runs it); the clients run in this
process on the same machine, so both share its CPU cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
from sqlalchemy import insert

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage import OUTCOMES, Event, Measurement, Repo, TrialRecord  # noqa: E402

_logger = logging.getLogger("api_load")
STUDY = "bench"


def build_database(url: str, n_trials: int, seed: int = 0) -> None:
    """One finished run of ``n_trials`` trials (mixed outcomes), 3 measurements and 2 events per trial."""
    rng = random.Random(seed)
    repo = Repo(url)
    repo.create_schema()
    run = repo.create_run(STUDY, target="workload", budget_s=7200, objective="tok_s", unit="tok/s",
                          space_name="dsv4_flash", environment={"gpu": "bench"})  # fmt: skip
    t0 = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(hours=2)
    trials, best = [], (None, -1.0)
    failures = [o for o in OUTCOMES if o not in ("ok", "pruned")]
    for n in range(n_trials):
        r = rng.random()
        outcome = "ok" if r < 0.8 else ("pruned" if r < 0.9 else rng.choice(failures))
        state = {"ok": "complete", "pruned": "pruned"}.get(outcome, "failed")
        value = rng.lognormvariate(5, 0.6) if outcome == "ok" else None
        if value is not None and value > best[1]:
            best = (n, value)
        start = t0 + timedelta(seconds=0.7 * n)
        trials.append(dict(run_id=run.id, number=n, state=state, outcome=outcome, value=value,
                           params={"split_k": rng.choice([1, 2, 4, 8]), "block_n": rng.choice([32, 64, 128]),
                                   "context_length": rng.choice([4096, 131072, 1048576])},
                           reason="" if outcome == "ok" else f"{outcome} at c=16", log_excerpt="log " * 20,
                           worker="w0", is_baseline=n == 0, started_at=start,
                           finished_at=start + timedelta(seconds=0.6), duration_s=rng.uniform(0.5, 30)))  # fmt: skip
    with repo.session() as s, s.begin():
        s.execute(insert(TrialRecord), trials)
        ids = dict(s.execute(TrialRecord.__table__.select().with_only_columns(TrialRecord.number, TrialRecord.id)
                             .where(TrialRecord.run_id == run.id)).all())  # fmt: skip
        s.execute(insert(Measurement), [
            dict(trial_id=ids[t["number"]], metric="tok_s", level=f"c={c}", value=(t["value"] or 0) * c / 64,
                 unit="tok/s") for t in trials for c in (1, 16, 64)
        ])  # fmt: skip
        s.execute(insert(Event), [
            dict(run_id=run.id, kind=kind, trial_number=t["number"], payload={}, created_at=t["started_at"])
            for t in trials for kind in ("trial_started", "trial_finished")
        ])  # fmt: skip
    with repo.session() as s, s.begin():
        from sqlalchemy import update

        from storage import Run

        s.execute(update(Run).where(Run.id == run.id).values(
            state="finished", ended_at=t0 + timedelta(seconds=0.7 * n_trials), best_value=best[1],
            best_trial_number=best[0], baseline_value=trials[0]["value"]))  # fmt: skip
    repo.engine.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(url: str, port: int, cpus: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "TUNER_API_STORAGE_URL": url, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_API_CONTROL_TOKEN", None)
    pin = ["taskset", "-c", cpus] if cpus else []
    proc = subprocess.Popen(
        pin + [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the API server did not start")


def random_request(rng: random.Random, n_trials: int) -> tuple[str, str, dict]:
    """(label, path, params): the study list, one study, and trial pages with random filters, sort and offset."""
    r = rng.random()
    if r < 0.2:
        return "GET /api/studies", "/api/studies", {}
    if r < 0.4:
        return "GET /api/studies/{name}", f"/api/studies/{STUDY}", {}
    if r < 0.5:
        return "GET /api/studies/{name}/trials/{n}", f"/api/studies/{STUDY}/trials/{rng.randrange(n_trials)}", {}
    params = {"limit": 50, "offset": rng.randrange(0, n_trials, 50), "sort": rng.choice(["number", "value", "duration"]),
              "order": rng.choice(["asc", "desc"])}  # fmt: skip
    if rng.random() < 0.3:
        params["state"] = rng.choice(["complete", "failed", "pruned"])
        params["offset"] = 0
    return "GET /api/studies/{name}/trials", f"/api/studies/{STUDY}/trials", params


async def client_loop(base: str, seconds: float, interval: float | None, seed: int, n_trials: int,
                      out: list[tuple[str, float, int]]) -> None:  # fmt: skip
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        # warm-up outside the timing: open this client's connection (100 clients connecting at once is a start-up
        # burst, not the steady state the aim is about)
        try:
            await client.get("/health")
        except httpx.HTTPError:
            pass
        end = time.perf_counter() + seconds
        next_at = time.perf_counter() + (rng.uniform(0, interval) if interval else 0)
        while True:
            if interval:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += interval
            if time.perf_counter() >= end:
                return
            label, path, params = random_request(rng, n_trials)
            t = time.perf_counter()
            try:
                status = (await client.get(path, params=params)).status_code
            except httpx.HTTPError:
                status = 0
            out.append((label, time.perf_counter() - t, status))


def run_phase(base: str, clients: int, seconds: float, interval: float | None, n_trials: int) -> list:
    out: list[tuple[str, float, int]] = []

    async def main() -> None:
        await asyncio.gather(*(client_loop(base, seconds, interval, i, n_trials, out) for i in range(clients)))

    asyncio.run(main())
    return out


def summarize(samples: list, seconds: float) -> list[dict]:
    rows = []
    by: dict[str, list] = {"all": samples}
    for s in samples:
        by.setdefault(s[0], []).append(s)
    for label, group in by.items():
        lat = sorted(x[1] * 1000 for x in group)
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
        rows.append(dict(endpoint=label, n=len(group), rps=len(group) / seconds, p50=q[49], p99=q[98],
                         max=lat[-1], errors=sum(1 for x in group if x[2] != 200)))  # fmt: skip
    return rows


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "api", "storage"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return sha.stdout.strip() + (" (api/ or storage/ modified)" if dirty else "")
    except OSError:
        return "unknown"


def report(args, phases: dict[str, list[dict]]) -> str:
    lines = [
        "# API load benchmark",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_name()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- commit: {commit()}",
        f"- machine load (1-min load average) before / after: {args.load_before:.1f} / {os.getloadavg()[0]:.1f} "
        "(other work on the machine shares its cores with the server and the clients)",
        f"- database: SQLite (WAL), one study of {args.trials:,} trials, {3 * args.trials:,} measurements, "
        f"{2 * args.trials:,} events",
        f"- server: one uvicorn worker in its own process; clients: {args.clients} concurrent httpx clients in one "
        f"asyncio process on the same machine, {args.seconds:g} s per phase"
        + (
            f"; server pinned to CPU(s) {args.server_cpus}, clients to {sorted(os.sched_getaffinity(0))}"
            if args.server_cpus
            else "; server and clients share the CPUs"
        ),
        "- requests: 20% study list, 20% one study, 10% one trial, 50% trial pages (limit 50, random offset, sort "
        "by number/value/duration, asc/desc; 30% of them filtered by state)",
        "",
    ]
    paced = next(iter(phases.values()))[0]
    verdict = "met" if paced["p99"] <= 50 and paced["errors"] == 0 else "NOT met"
    lines += [
        f"**Target p99 ≤ 50 ms with zero errors (paced phase): {verdict}** "
        f"(p99 {paced['p99']:.1f} ms, {paced['errors']} errors).",
        "",
    ]
    for name, rows in phases.items():
        lines += [f"## {name}", "", "| endpoint | requests | req/s | p50 ms | p99 ms | max ms | errors |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for r in rows:
            lines.append(f"| {r['endpoint']} | {r['n']} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
                         f"{r['max']:.1f} | {r['errors']} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second per client in the paced phase")
    ap.add_argument(
        "--server-cpus",
        default=None,
        help="pin the server to these CPUs (taskset list, e.g. 0); "
        "pin this process, the clients, elsewhere with taskset to keep them from sharing cores",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the report (default: benchmarks/results/api_load/cpu/<date>_<commit>.md)",
    )
    args = ap.parse_args()
    args.load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        t = time.perf_counter()
        build_database(url, args.trials)
        _logger.info("built %d trials in %.1f s", args.trials, time.perf_counter() - t)
        port = free_port()
        server = start_server(url, port, args.server_cpus)
        try:
            base = f"http://127.0.0.1:{port}"
            run_phase(base, 10, 2.0, None, args.trials)  # warm-up
            phases = {}
            for name, interval in ((f"paced: {args.clients} clients × {args.rate:g} req/s", 1 / args.rate),
                                   (f"saturated: {args.clients} clients, back to back", None)):  # fmt: skip
                samples = run_phase(base, args.clients, args.seconds, interval, args.trials)
                phases[name] = summarize(samples, args.seconds)
                _logger.info("%s: %s", name, phases[name][0])
        finally:
            server.terminate()
            server.wait(timeout=30)
    text = report(args, phases)
    from benchmarks.common import result_path

    args.out = args.out or result_path("api_load", "cpu")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    _logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
