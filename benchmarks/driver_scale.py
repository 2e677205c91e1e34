"""The search driver's own cost at scale (issue 48): `tuner search` with 1, 2, 4, 8 leased "GPUs" on SQLite and
PostgreSQL, to 20,000 trials of a stand-in target whose trials cost a set time.

    python benchmarks/driver_scale.py run --storage sqlite --workers 1,2,4,8 --trials 20000 --trial-s 2.0
    python benchmarks/driver_scale.py run --storage postgresql --workers 8 --trials 20000 --trial-s 2.0
    python benchmarks/driver_scale.py report --from benchmarks/results/driver_scale/cpu/<date>_<commit>.json

What runs is the real driver (``tuner.search.run_search``: the Optuna study in a real database, the tuner's tables
and events, GPU leases, persistent trial workers, stages, refining): only the target is a stand-in,
:class:`SleepTarget`, over the main space's parameters (``search_spaces/dsv4_flash.yaml``, resolved for an 8-GPU
H200 box), whose trial sleeps ``--trial-s`` seconds and answers a fixed objective surface (every value of every
knob a factor, a few interactions, 1% noise). A compressed clock (``--trial-s 0.25``) keeps the driver's cost per
trial as it is and shortens the wait; the report states each run's trial time. Convergence is off (the run goes to
``--trials``). An API server (``uvicorn api.app``, one worker, as ``tuner serve``) reads the live study meanwhile;
one client polls it (the study, the best, a trial page by value, the event feed after its cursor).

Per thousand trials, the report gives: ask (``study.ask`` + the suggestions, where TPE samples), tell
(``study.tell``), storage (every call on the tuner's tables) in milliseconds per trial, the driver's cost per trial as
a share of a 2-s trial, the workers' idle share (1 - time in trials / (workers x wall time)), trials per minute, and
the API's p99 in milliseconds. The timings wrap the real calls in this process (``Timers``); nothing is replaced.

``--storage postgresql`` starts a throw-away local PostgreSQL (``initdb`` + ``pg_ctl`` as the ``postgres`` user, as
``scripts/test.sh`` does) unless ``--storage`` is a URL. The JSON goes to
``benchmarks/results/driver_scale/<gpu>/<date>_<commit>[_<variant>].json``; ``report`` writes the ``.md`` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from storage.types import MetricRow  # noqa: E402 - after the sys.path line above
from tuner.measurement import Measurement, Outcome  # noqa: E402
from tuner.settings import CommonSettings  # noqa: E402
from tuner.targets.base import LaunchSpec, Target  # noqa: E402

TARGET = "benchmarks.driver_scale:SleepTarget"
TRIAL_S_REAL = 2.0
"""The trial the shares are of: a 7-minute H200 main job's median trial (1.9-2.0 s at 2f7690e)."""
BUCKET = 1000
GOAL_SHARE = 0.05
"""Issue 48's goal: the driver's cost per trial and the workers' idle share each at most 5%."""


# -- the stand-in target ---------------------------------------------------------------------------------------
class SleepSettings(CommonSettings):
    trial_s: float = 2.0
    """Seconds every trial sleeps before it answers."""
    noise: float = 0.01
    """Relative noise of every answer."""


def surface(params: dict[str, Any], levels: list[int]) -> dict[int, float]:
    """A fixed objective surface over any parameters: each (knob, value) a factor in [0.8, 1.25] from a hash, the
    context cap and the attention kernel stronger, one interaction (fp8 cache with its kernels), per level a
    different weight of each knob; tok/s at each level."""

    def factor(name: str, value: Any, level: int) -> float:
        h = int(hashlib.sha1(f"{name}={value}@{level}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        strong = 2.0 if name in ("context_length", "attention_impl", "indexer_impl") else 1.0
        return (0.8 + 0.45 * h) ** strong

    out = {}
    for c in levels:
        v = 30.0 * c**0.8
        for k, val in sorted(params.items()):
            v *= factor(k, val, c)
        if params.get("kv_cache_dtype") == "fp8_e4m3" and params.get("attention_impl") in ("mma", "flashmla_kv"):
            v *= 1.15
        out[c] = v
    return out


class SleepTarget(Target):
    """A trial that costs ``trial_s`` seconds of sleep and answers :func:`surface` (with ``noise``)."""

    name = TARGET
    Settings = SleepSettings
    persistent_worker = True

    def gpus_for(self, params: dict[str, Any]) -> int:
        return 1

    def evaluate(self, params: dict[str, Any], deadline: float, report=None) -> Measurement:
        time.sleep(self.config.trial_s)
        rng = random.Random()
        levels = {
            c: v * (1 + rng.gauss(0, self.config.noise))
            for c, v in surface(params, list(self.space.objective.levels)).items()
        }
        for i, v in enumerate(levels.values()):
            if report is not None:
                report(i, v)
        metrics = [MetricRow("tok_s", f"c={c}", v, "tok/s") for c, v in levels.items()]
        return Measurement(
            outcome=Outcome.OK, value=self.space.objective.combine_values(levels), metrics=metrics, by_level=levels
        )

    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        return LaunchSpec(argv=["true"], description="the driver-scale benchmark's stand-in (nothing to launch)")


def space_text(trial_s: float) -> str:
    """The main space (``search_spaces/dsv4_flash.yaml``: its parameters, rules and objective) for the stand-in."""
    import yaml

    raw = yaml.safe_load((ROOT / "search_spaces" / "dsv4_flash.yaml").read_text())
    raw.pop("preset", None)
    raw.update(name="dsv4_flash_driver_scale", target=TARGET, settings={"trial_s": trial_s})
    return yaml.safe_dump(raw, sort_keys=False)


# -- timing the real calls -------------------------------------------------------------------------------------
class Timers:
    """Wraps ``optuna.Study.ask``/``tell``, the sampling (``tuner.search.sampling.suggest`` as the driver imports
    it) and every public method of ``storage.Repo`` with a timer; events are bucketed by the trials finished so
    far. Nested calls of one kind count once (a ``Repo`` method calling another)."""

    KINDS = ("ask", "tell", "storage")

    def __init__(self, bucket: int = BUCKET) -> None:
        self.bucket = bucket
        self.lock = threading.Lock()
        self.finished = 0
        self.sums: dict[int, dict[str, float]] = {}
        self.local = threading.local()
        self._undo: list[tuple[object, str, object]] = []

    def add(self, kind: str, seconds: float, cpu: float = 0.0) -> None:
        with self.lock:
            b = self.sums.setdefault(
                self.finished // self.bucket, dict.fromkeys(self.KINDS + tuple(f"{k}_cpu" for k in self.KINDS), 0.0)
            )
            b[kind] += seconds
            b[f"{kind}_cpu"] += cpu

    def wrap(self, owner: object, name: str, kind: str) -> None:
        fn = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            depth = getattr(timers.local, kind, 0)
            setattr(timers.local, kind, depth + 1)
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(timers.local, kind, depth)
                if depth == 0:
                    timers.add(kind, time.perf_counter() - t0, time.thread_time() - c0)

        self._undo.append((owner, name, fn))
        setattr(owner, name, timed)

    def install(self) -> None:
        import optuna

        import tuner.search.trial as trial
        from storage import Repo

        self.wrap(optuna.study.Study, "ask", "ask")
        self.wrap(optuna.study.Study, "tell", "tell")
        self.wrap(trial, "suggest", "ask")  # what tuner.search.trial.propose samples through (repeats turned away)
        for name in dir(Repo):
            if not name.startswith("_") and callable(getattr(Repo, name)) and name not in ("engine",):
                self.wrap(Repo, name, "storage")

    def uninstall(self) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        self._undo.clear()


# -- the API's reader ------------------------------------------------------------------------------------------
class ApiPoller:
    """One client polling the live study through a real API server process; latencies by trial bucket."""

    def __init__(self, url: str, study: str, timers: Timers, interval_s: float = 0.5) -> None:
        self.url, self.study, self.timers, self.interval_s = url, study, timers, interval_s
        self.latencies: dict[int, list[float]] = {}
        self.errors = 0
        self.stop = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "TUNER_API_STORAGE_URL": self.url, "PYTHONPATH": str(ROOT)}
        env.pop("TUNER_API_CONTROL_TOKEN", None)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "api.app:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
        )
        self.base = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            self.close()
            raise RuntimeError("the API server did not start")
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        import httpx

        cursor = 0
        paths = [
            f"/api/studies/{self.study}",
            f"/api/studies/{self.study}/best",
            f"/api/studies/{self.study}/trials?limit=50&sort=value&order=desc",
            None,
        ]
        with httpx.Client(base_url=self.base, timeout=30) as client:
            i = 0
            while not self.stop.is_set():
                path = paths[i % len(paths)]
                i += 1
                t0 = time.perf_counter()
                dt = None
                try:
                    if path is None:  # the event feed after the last read, as a dashboard follows it: its first event
                        with client.stream(
                            "GET", f"/api/studies/{self.study}/events", params={"after": cursor}, timeout=30
                        ) as r:
                            code = r.status_code
                            for line in r.iter_lines():
                                if line.startswith("id:"):
                                    cursor = max(cursor, int(line[3:].strip()))
                                    dt = time.perf_counter() - t0
                                    break
                                if time.perf_counter() - t0 > 5:
                                    break
                    else:
                        code = client.get(path).status_code
                except httpx.HTTPError:
                    code = 0
                dt = dt if dt is not None else time.perf_counter() - t0
                if code == 200:
                    self.latencies.setdefault(self.timers.finished // self.timers.bucket, []).append(dt)
                elif code != 404:  # 404: the study is not created yet
                    self.errors += 1
                self.stop.wait(self.interval_s)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=40)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- a local PostgreSQL ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def local_postgres():
    """A throw-away PostgreSQL server (``initdb`` + ``pg_ctl`` as the ``postgres`` user, as scripts/test.sh)."""
    initdb = shutil.which("initdb") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None)
    if initdb is None:
        raise SystemExit(
            "error: --storage postgresql needs PostgreSQL's initdb on PATH or /usr/lib/postgresql; "
            "install postgresql or pass --storage postgresql://USER@HOST:PORT/DB"
        )
    pgbin = Path(os.path.realpath(initdb)).parent
    data = tempfile.mkdtemp(prefix="driver-scale-pg.")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    as_pg = [] if os.getuid() != 0 else ["su", "postgres", "-c"]
    if as_pg:
        shutil.chown(data, "postgres")

    def sh(cmd: str) -> None:
        subprocess.run(as_pg + [cmd] if as_pg else ["bash", "-c", cmd], check=True, stdout=subprocess.DEVNULL)

    sh(f"{pgbin}/initdb -D {data} -A trust -U postgres")
    sh(f"{pgbin}/pg_ctl -D {data} -l {data}/log -o '-p {port} -k /tmp -c max_connections=300' -w start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            sh(f"{pgbin}/pg_ctl -D {data} -m immediate stop")
        shutil.rmtree(data, ignore_errors=True)


# -- one run ---------------------------------------------------------------------------------------------------
def run_one(
    url: str,
    workers: int,
    trials: int,
    trial_s: float,
    seed: int,
    work: Path,
    say=print,
    bucket: int = BUCKET,
    budget_s: float | None = None,
) -> dict:
    """``tuner search`` on the stand-in with ``workers`` leased GPUs until the study holds ``trials`` trials; the
    per-thousand figures (see the module docstring)."""
    import optuna

    from search_spaces import Hardware
    from tuner.search import Progress
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = work / "space.yaml"
    space.write_text(space_text(trial_s))
    hw = Hardware(
        gpu_name="NVIDIA H200",
        gpu_count=8,
        compute_capability=(9, 0),
        has_triton=True,
        has_torch_compile=True,
        has_gluon=True,
        has_flash_mla=True,
    )  # as the main job's H200
    study = f"scale_{workers}w"
    timers = Timers(bucket)
    ran: dict[int, list[float]] = {}  # bucket -> trial seconds of the trials that ran
    marks: dict[int, float] = {}  # bucket -> when its first trial finished
    outcomes: dict[str, int] = {}

    class Count(Progress):
        def trial_finished(self, summary, ctx) -> None:
            with timers.lock:
                b = timers.finished // bucket
                marks.setdefault(b, time.time())
                outcomes[summary.outcome] = outcomes.get(summary.outcome, 0) + 1
                if summary.repeat_of is None and summary.outcome in ("ok", "pruned"):  # ran (slept)
                    ran.setdefault(b, []).append(summary.duration_s)
                timers.finished += 1
                if timers.finished >= trials and not ctx.stop.is_set():
                    ctx.stop.set()

    # the budget a user would give for that many trials: its stages and its refining share (the last quarter) fall
    # where they would; a driver too slow for it ends the run short of ``trials`` (the report says so)
    budget = budget_s or 1.1 * trials * trial_s / workers + 60
    opts = SearchOptions(
        budget_s=budget,
        storage_url=url,
        study=study,
        space_path=str(space),
        hardware=hw,
        seed=seed,
        out_dir=str(work / "out"),
        workers=workers,
        gpus=list(range(workers)),
        confirm_top=0,
        export=False,
        converge_after=0,
        trial_timeout_s=60 + 10 * trial_s,
    )
    os.environ["TUNER_GPU_LOCK_DIR"] = str(work / "gpu-locks")  # leases of this run only
    from storage import Repo

    Repo(url).create_schema()  # the API server opens the database before the search creates the study
    api = ApiPoller(url, study, timers)
    api.start()
    timers.install()
    t0 = time.time()
    try:
        res = run_search(opts, Count())
    finally:
        timers.uninstall()
        api.close()
    wall = time.time() - t0
    rows = []
    marks[max(marks) + 1 if marks else 0] = t0 + wall
    for b in sorted(timers.sums):
        n_done = min(bucket, timers.finished - b * bucket)
        if n_done <= 0 or b + 1 not in marks or b not in marks:
            continue
        span = marks[b + 1] - marks[b] if b else marks[b + 1] - t0
        s = timers.sums[b]
        lat = sorted(api.latencies.get(b, []))
        per = {k: 1e3 * s[k] / n_done for k in Timers.KINDS}
        cpu = {k: 1e3 * s.get(f"{k}_cpu", 0.0) / n_done for k in Timers.KINDS}
        in_trials = sum(ran.get(b, []))
        idle_ws = max(0.0, workers * span - in_trials)
        rows.append(
            {
                "bucket": b,
                "trials": n_done,
                "wall_s": span,
                **{f"{k}_ms": v for k, v in per.items()},
                "driver_ms": sum(per.values()),
                **{f"{k}_cpu_ms": v for k, v in cpu.items()},
                "driver_cpu_ms": sum(cpu.values()),
                "idle_share": max(0.0, 1 - in_trials / (workers * span)) if span > 0 else None,
                # the same idle worker-seconds beside trials of TRIAL_S_REAL (a compressed clock's run, projected)
                "idle_share_real": idle_ws / (idle_ws + in_trials * TRIAL_S_REAL / trial_s)
                if span > 0 and trial_s > 0 and idle_ws + in_trials > 0
                else None,
                "ran": len(ran.get(b, [])),
                "trials_per_min": 60 * n_done / span if span > 0 else None,
                "api_requests": len(lat),
                "api_p99_ms": 1e3 * lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] if lat else None,
                "api_median_ms": 1e3 * statistics.median(lat) if lat else None,
            }
        )
    stop = f"stopped by the benchmark at {trials} trials" if timers.finished >= trials else res.stop_reason
    say(f"  {workers} workers: {timers.finished} trials in {wall:.0f} s ({stop})")
    return {
        "workers": workers,
        "trials": timers.finished,
        "trial_s": trial_s,
        "wall_s": wall,
        "state": res.state,
        "stop_reason": stop,
        "budget_s": budget,
        "outcomes": outcomes,
        "api_errors": api.errors,
        "best_value": res.best_value,
        "baseline_value": res.baseline_value,
        "rows": rows,
    }


def _storage_label(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def cmd_run(args) -> int:
    from benchmarks.common import result_path, short_commit

    workers = [int(x) for x in args.workers.split(",")]
    commit = short_commit()  # the code this process imports now, not HEAD when it ends
    out = Path(args.out) if args.out else result_path("driver_scale", args.gpu, args.variant, ext="json")
    load_at_start = os.getloadavg()[0]  # before the runs (the files before 2026-12-04 read it after them)
    runs = []
    with contextlib.ExitStack() as stack:
        url = args.storage
        if url == "postgresql":
            url = stack.enter_context(local_postgres())
        for n in workers:
            work = Path(tempfile.mkdtemp(prefix=f"driver-scale-{n}w."))
            run_url = url if url != "sqlite" else f"sqlite:///{work}/study.db"
            if run_url.startswith("postgresql"):
                _drop_all(run_url)
            print(f"{_storage_label(run_url)}, {n} workers, {args.trials} trials of {args.trial_s} s", flush=True)
            runs.append(
                {
                    "storage": _storage_label(run_url),
                    **run_one(
                        run_url,
                        n,
                        args.trials,
                        args.trial_s,
                        args.seed,
                        work,
                        bucket=args.bucket,
                        budget_s=args.budget_s,
                    ),
                }
            )
            shutil.rmtree(work, ignore_errors=True)
    data = {
        "benchmark": "driver_scale",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "command": " ".join(["python", "benchmarks/driver_scale.py", *sys.argv[1:]]),
        "trial_s_real": TRIAL_S_REAL,
        "bucket": args.bucket,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}")
    md = out.with_suffix(".md")
    md.write_text(report(data, out))
    print(f"wrote {md}")
    return 0


def _drop_all(url: str) -> None:
    """A fresh schema on a reused PostgreSQL database: every run starts from an empty study."""
    from sqlalchemy import create_engine, text

    from storage.engine import normalize_url

    eng = create_engine(normalize_url(url))
    with eng.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE"))
        c.execute(text("CREATE SCHEMA public"))
    eng.dispose()


# -- the report ------------------------------------------------------------------------------------------------
def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def report(data: dict, source: Path) -> str:
    from benchmarks.common import stored_path

    lines = [
        "# The search driver's own cost at scale (issue 48)",
        "",
        f"- date: {data['date']} (the end); machine: {data['machine']}, "
        + (
            f"load {data['load_at_start']:.1f} at the start and {data['load_at_end']:.1f} at the end "
            if "load_at_end" in data
            else f"load {data['load_at_start']:.1f} when the JSON was written (after the runs) "
        )
        + f"(a 2-core box shared with other sessions); commit {data['commit']}; Python {data['python']}",
        f"- command: `{data['command']}`",
        f"- written by `benchmarks/driver_scale.py report` from `{stored_path(source)}`",
        f"- the real driver (`tuner search --gpus 0,...,N-1`, leased stand-in GPUs, persistent trial workers) over "
        f"the main space (dsv4_flash's parameters, an 8-GPU H200 resolved); the stand-in trial sleeps the run's "
        f"trial time; shares are of a {data['trial_s_real']:.0f}-s trial (a 7-minute H200 main job's median)",
        "- ask: `study.ask` + the suggestions (TPE samples there); tell: `study.tell`; storage: every call on the "
        "tuner's tables; driver = the three, per trial, on the calling worker. Idle: 1 - time in trials / "
        "(workers x wall), at the run's own trial time. API: one client polling the live study through "
        "a real server (study, best, a trial page by value, the event feed)",
        f"- goal (issue 48): driver <= {GOAL_SHARE:.0%} of a {data['trial_s_real']:.0f}-s trial at every thousand, "
        f"workers idle <= {GOAL_SHARE:.0%}, at 8 workers and 20,000 trials, on SQLite and PostgreSQL",
    ]
    notes = []
    if any("driver_cpu_ms" in r for run in data["runs"] for r in run["rows"]):
        notes.append(
            "- driver CPU: the CPU time (`time.thread_time`) the calling worker thread spent in those calls, per "
            "trial; the rest of the driver's milliseconds it waited (for the GIL the eight threads share, a lock, "
            "the database)"
        )
    if any(run["trial_s"] != data["trial_s_real"] for run in data["runs"]):
        notes.append(
            f"- idle at {data['trial_s_real']:.0f} s (a compressed clock's runs): the run's idle worker-seconds beside "
            f"its trials lengthened to {data['trial_s_real']:.0f} s, a projection (the driver's waits at the "
            "compressed clock, where its threads contend more for the GIL, kept as they were)"
        )
    lines[-1:-1] = notes  # before the goal
    for run in data["runs"]:
        rows = run["rows"]
        worst = max((r["driver_ms"] for r in rows), default=None)
        lines += [
            "",
            f"## {run['storage']}, {run['workers']} workers: {run['trials']} trials of "
            f"{run['trial_s']:g} s in {run['wall_s'] / 60:.1f} min",
            "",
            f"{run['state']} ({run['stop_reason']}); outcomes "
            + ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items()))
            + f"; API errors {run['api_errors']}; the worst thousand's driver cost "
            + (
                f"{worst:.1f} ms = {worst / (10 * data['trial_s_real']):.2f}% of a {data['trial_s_real']:.0f}-s trial"
                if worst is not None
                else "-"
            ),
            "",
        ]
        cpu = any("driver_cpu_ms" in r for r in rows)  # runs filed before the CPU column have none
        real = f"idle at {data['trial_s_real']:.0f} s" if run["trial_s"] != data["trial_s_real"] else None
        head = ["trials", "ask ms", "tell ms", "storage ms", "driver ms", "of a 2-s trial"]
        head += ["driver CPU ms"] * cpu + ["ran", "idle"] + [real] * bool(real)
        head += ["trials/min", "API p99 ms", "API median ms"]
        lines += ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
        for r in rows:
            lo = r["bucket"] * data["bucket"]
            cells = [
                f"{lo}-{lo + r['trials']}",
                _f(r["ask_ms"]),
                _f(r["tell_ms"]),
                _f(r["storage_ms"]),
                _f(r["driver_ms"]),
                f"{r['driver_ms'] / (10 * data['trial_s_real']):.2f}%",
            ]
            cells += [_f(r.get("driver_cpu_ms"))] * cpu + [str(r["ran"]), _f(r["idle_share"], "{:.1%}")]
            cells += [_f(r.get("idle_share_real"), "{:.1%}")] * bool(real)
            cells += [
                _f(r["trials_per_min"], "{:.0f}"),
                _f(r["api_p99_ms"], "{:.0f}"),
                _f(r["api_median_ms"], "{:.0f}"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    from benchmarks.common import read_json

    src = Path(args.source)
    out = Path(args.out) if args.out else src.with_suffix("").with_suffix(".md")
    out.write_text(report(read_json(src), src))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the driver at scale and write the JSON and its report")
    r.add_argument(
        "--storage",
        default="sqlite",
        help="sqlite (a fresh file per run), postgresql (a throw-away local server) or a URL",
    )
    r.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts, one run each")
    r.add_argument("--trials", type=int, default=20000)
    r.add_argument(
        "--trial-s",
        type=float,
        default=TRIAL_S_REAL,
        help="each stand-in trial's sleep (a compressed clock: 0.25 keeps the driver's cost and shortens the run)",
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="each run's budget (default: 1.1 x trials x trial-s / workers + 60 s, as a user would give)",
    )
    r.add_argument("--bucket", type=int, default=BUCKET, help="trials per row of the report (1000: per thousand)")
    r.add_argument("--variant", default="", help="a suffix of the result's name")
    r.add_argument("--gpu", default="cpu", help="the results folder of the machine it runs on (cpu, h200x8)")
    r.add_argument("--out", default=None, help="the JSON (default: benchmarks/results/driver_scale/cpu/...)")
    p = sub.add_parser("report", help="write the report from a stored JSON")
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.trials < 1 or args.trial_s < 0 or args.bucket < 1:
            ap.error(
                f"--trials and --bucket must be >= 1 and --trial-s >= 0, but got {args.trials}, "
                f"{args.bucket} and {args.trial_s}"
            )
        return cmd_run(args)
    return cmd_report(args)


if __name__ == "__main__":
    raise SystemExit(main())
