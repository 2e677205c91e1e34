"""The dashboard's derived views on a large study while a search writes to it (issue 21, item 5).

    python benchmarks/api_large_study.py [--trials 5000] [--seconds 60] [--label after] [--server-root DIR]

One Optuna study of ``--trials`` finished trials (and their ``tuner_`` rows) in SQLite; a real uvicorn server in
its own process (``--server-root`` runs the API of another checkout, e.g. the commit before a change); a writer
process that adds one trial (Optuna trial, ``tuner_`` row, events) every ``--write-every`` seconds, as a search
does. Measured:

- cold: the first ``/importances``, ``/plots/history``, ``/plots/importances`` after the server started;
- warm, while the writer writes: a dashboard refresh (the three at once) every 2 s, and 10 clients paging
  ``/trials`` at 2 req/s each: latency of each, and the server's CPU seconds per trial written.

Writes ``benchmarks/results/api_large_study/cpu/<date>_<commit>_<label>.json``; ``--report`` turns every such file
of the folder into ``<date>_<commit>.md`` there (the current one: ``benchmarks/results/README.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.api_load import cpu_name, free_port
from benchmarks.common import result_path

_logger = logging.getLogger("api_large_study")
STUDY = "large"
DATA = ROOT / "benchmarks" / "results" / "api_large_study" / "cpu"
DERIVED = ("/importances", "/plots/history", "/plots/importances")
_WRITER = r"""
import random, sys, time
import optuna
from storage import Repo
from storage.types import MetricRow
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, name, every, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
study = optuna.load_study(study_name=name, storage=url)
repo = Repo(url)
run = repo.get_run(name)
rng = random.Random(1)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    t = study.ask()
    p = {"split_k": t.suggest_categorical("split_k", [1, 2, 4, 8]),
         "block_n": t.suggest_categorical("block_n", [32, 64, 128]),
         "context_length": t.suggest_categorical("context_length", [4096, 131072, 1048576])}
    repo.start_trial(run.id, t.number, p)
    value = rng.lognormvariate(5, 0.6)
    repo.finish_trial(run.id, t.number, outcome="ok", value=value, metrics=[MetricRow("tok_s", "c=64", value)],
                      duration_s=every)
    study.tell(t, value)
    n += 1
    time.sleep(every)
print(n, flush=True)
"""


def build_study(url: str, n_trials: int, seed: int = 0) -> None:
    """An Optuna study of ``n_trials`` trials (90% complete, 10% failed) and the ``tuner_`` rows a search writes."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from sqlalchemy import insert

    from storage import Event, Repo, TrialRecord

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(seed)
    dists = {
        "split_k": CategoricalDistribution([1, 2, 4, 8]),
        "block_n": CategoricalDistribution([32, 64, 128]),
        "context_length": CategoricalDistribution([4096, 131072, 1048576]),
    }
    study = optuna.create_study(study_name=STUDY, storage=url, direction="maximize")
    repo = Repo(url)
    repo.create_schema()
    run = repo.create_run(STUDY, target="workload", budget_s=7200, objective="tok_s", unit="tok/s",
                          space_name="dsv4_flash", environment={"gpu": "bench"})  # fmt: skip
    frozen, rows = [], []
    for n in range(n_trials):
        params = {k: rng.choice(d.choices) for k, d in dists.items()}
        ok = rng.random() < 0.9
        value = rng.lognormvariate(5, 0.6) * (1 + params["split_k"] / 8) if ok else None
        state = optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL
        frozen.append(optuna.trial.create_trial(state=state, value=value, params=params, distributions=dists))
        rows.append({"run_id": run.id, "number": n, "state": "complete" if ok else "failed",
                         "outcome": "ok" if ok else "crash", "value": value, "params": params, "is_baseline": n == 0,
                         "duration_s": rng.uniform(0.5, 30)})  # fmt: skip
    study.add_trials(frozen)
    with repo.session() as s, s.begin():
        s.execute(insert(TrialRecord), rows)
        s.execute(insert(Event), [{"run_id": run.id, "kind": "trial_finished", "trial_number": r["number"], "payload": {}}
                                  for r in rows])  # fmt: skip
    repo.engine.dispose()


def start_server(url: str, port: int, server_root: Path) -> subprocess.Popen:
    env = {**os.environ, "TUNER_API_STORAGE_URL": url, "PYTHONPATH": str(server_root)}
    env.pop("TUNER_API_CONTROL_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                            cwd=server_root, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the API server did not start")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of its live child processes (the API's worker process), user + system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return own + sum(cpu_seconds(c) for c in children if Path(f"/proc/{c}").exists())


async def measure(base: str, seconds: float) -> dict:
    out: dict[str, list[float]] = {p: [] for p in DERIVED}
    out["/trials"] = []
    errors = 0
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:

        async def get(path: str, **params) -> float:
            nonlocal errors
            t = time.perf_counter()
            r = await c.get(f"/api/studies/{STUDY}{path}", params=params)
            errors += r.status_code != 200
            return time.perf_counter() - t

        async def dashboard() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = time.monotonic()
                for path, dt in zip(DERIVED, await asyncio.gather(*(get(p) for p in DERIVED))):
                    out[path].append(dt)
                await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - t)))

        async def pager(seed: int) -> None:
            rng = random.Random(seed)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = time.monotonic()
                out["/trials"].append(await get("/trials", limit=50, offset=rng.randrange(0, 5000, 50),
                                                sort=rng.choice(["number", "value"])))  # fmt: skip
                await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - t)))

        await asyncio.gather(dashboard(), *(pager(i) for i in range(10)))
    return {"latency_s": out, "errors": errors}


def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'large.db'}"
        t = time.perf_counter()
        build_study(url, args.trials)
        _logger.info("built %d trials in %.1f s", args.trials, time.perf_counter() - t)
        port = free_port()
        server = start_server(url, port, args.server_root)
        base = f"http://127.0.0.1:{port}"
        try:
            cold = {}
            for path in DERIVED:
                t = time.perf_counter()
                r = httpx.get(f"{base}/api/studies/{STUDY}{path}", timeout=300)
                cold[path] = time.perf_counter() - t
                assert r.status_code == 200, r.text[:300]
                _logger.info("cold %s: %.2f s", path, cold[path])
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            writer = subprocess.Popen([sys.executable, "-c", _WRITER, url, STUDY, str(args.write_every),
                                       str(args.seconds)], env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
            cpu0 = cpu_seconds(server.pid)
            warm = asyncio.run(measure(base, args.seconds))
            cpu = cpu_seconds(server.pid) - cpu0
            written = int(writer.communicate(timeout=120)[0].strip() or 0)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {"label": args.label, "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
            "machine": f"{cpu_name()}, {os.cpu_count()} CPUs (this CPU box; no GPU), Python {platform.python_version()}",
            "server_commit": commit(args.server_root), "bench_commit": commit(ROOT), "trials": args.trials,
            "seconds": args.seconds, "write_every_s": args.write_every, "trials_written": written,
            "load_before": args.load_before, "load_after": os.getloadavg()[0], "cold_s": cold,
            "warm_latency_s": warm["latency_s"], "errors": warm["errors"], "server_cpu_s": cpu}  # fmt: skip


def commit(root: Path) -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=root, capture_output=True, text=True
    ).stdout
    if not sha.strip():
        marker = root / ".commit"  # a `git archive` copy names its commit there
        return marker.read_text().strip() if marker.exists() else "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "api", "storage"], check=False, cwd=root, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return sha.strip() + (" (api/ or storage/ modified)" if dirty else "")


def _q(xs: list[float], q: int) -> float:
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


WARM_TARGET_S = 1.0
"""The speed target: every derived view answers in under this warm, while a search writes (issue 21, item 5). A
benchmark's figure (this report's "within target" column), not a test's assertion: a loaded CI box is no measurement."""


def report(files: list[Path]) -> str:
    runs = [json.loads(f.read_text()) for f in files]
    lines = ["# The dashboard's derived views on a large study while a search writes to it", "",
             "Made by `python benchmarks/api_large_study.py --report` from "
             + ", ".join(f"`{f.relative_to(ROOT)}`" for f in files) + ". Each run: one SQLite study, a real uvicorn "
             "server in its own process, a writer process adding one trial every `write_every_s`; warm = a "
             "dashboard refresh (the three derived views at once) every 2 s and 10 clients paging /trials at "
             "2 req/s, for `seconds`.", ""]  # fmt: skip
    for r in runs:
        lines += [f"## {r['label']}", "",
                  f"- date {r['date']}; machine {r['machine']}",
                  f"- server (API) commit {r['server_commit']}; benchmark commit {r['bench_commit']}",
                  (f"- study: {r['trials']:,} trials; {r['trials_written']} trials written during the {r['seconds']:g} s "
                  f"(one every {r['write_every_s']:g} s); 1-min load average before / after "
                  f"{r['load_before']:.1f} / {r['load_after']:.1f}; non-200 answers: {r['errors']}"),
                  (f"- server CPU during the warm phase (its worker process included): {r['server_cpu_s']:.1f} s, "
                  f"{r['server_cpu_s'] / max(1, r['trials_written']):.2f} s per trial written"), "",
                  f"| endpoint | cold s | warm requests | warm p50 s | warm p99 s | warm max s | max < {WARM_TARGET_S:g} s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
        for path, xs in r["warm_latency_s"].items():
            cold = r["cold_s"].get(path)
            lines.append(f"| {path} | {'' if cold is None else f'{cold:.2f}'} | {len(xs)} | {_q(xs, 50):.3f} | "
                         f"{_q(xs, 99):.3f} | {max(xs):.3f} | {'yes' if max(xs) < WARM_TARGET_S else 'no'} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--write-every", type=float, default=0.5)
    ap.add_argument("--label", default="after")
    ap.add_argument("--server-root", type=Path, default=ROOT, help="the checkout whose api/ the server runs")
    ap.add_argument("--report", action="store_true", help="only write the markdown from the stored JSON files")
    args = ap.parse_args()
    args.load_before = os.getloadavg()[0]
    if not args.report:
        doc = run(args)
        DATA.mkdir(parents=True, exist_ok=True)
        path = result_path("api_large_study", "cpu", args.label, "json")
        path.write_text(json.dumps(doc, indent=1) + "\n")
        _logger.info("wrote %s", path)
    files = sorted(DATA.glob("*.json"), key=lambda f: json.loads(f.read_text())["date"])
    out = result_path("api_large_study", "cpu")
    out.write_text(report(files) + "\n")
    _logger.info("wrote %s", out)


if __name__ == "__main__":
    main()
