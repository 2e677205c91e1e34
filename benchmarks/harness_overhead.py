"""The serving harness's own cost per trial, beyond the server's own start-up and the load itself.

Uses the stand-in server (tests/server/standin_server.py) with ``--startup-delay 0`` and a tiny load (one level,
one request of a few tokens), and measures medians over N trials of:

- ``server_start``: spawning the stand-in bare until it prints its ready line (the server's own start time);
- ``load``: the same warm-up and level against an already-running stand-in;
- ``trial``: ``CommandTarget.evaluate`` in this process (port pick, spawn, readiness, load, teardown, port check);
- ``isolated``: the same trial through ``tuner.execution.isolation.run_trial`` (plus the per-trial worker process).

overhead = trial - server_start - load. Writes ``benchmarks/results/harness_overhead/cpu/<date>_<commit>.md``.

    python benchmarks/harness_overhead.py [--trials 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_spaces import Hardware, load_space_text, resolve  # noqa: E402
from tests.server.conftest import SPACE_YAML, STANDIN, standin_command  # noqa: E402
from tuner.execution.isolation import TrialJob, run_trial  # noqa: E402
from tuner.measurement import Outcome  # noqa: E402
from tuner.targets.server import loadgen  # noqa: E402
from tuner.targets.server.launch import ServerProcess, pick_free_port  # noqa: E402
from tuner.targets.server.target import CommandTarget  # noqa: E402

PARAMS = {"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:4", "fast_path": False}


def settings(state_dir: str) -> dict:
    return {
        "command": standin_command(),
        "model": "standin",
        "extra_args": ["--tokens-per-second", "5000"],
        "port_range": "35000-35999",
        "state_dir": state_dir,
        "levels": [1],
        "requests_per_level": 1,
        "output_len": 4,
        "prompt_len": 4,
        "warmup_requests": 1,
        "teardown_reserve_s": 5.0,
    }


def time_server_start() -> float:
    port = pick_free_port(36000, 36999)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "--port", str(port), "--tokens-per-second", "5000"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if "fired up" in line:
            break
    took = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    return took


def time_load(cfg: loadgen.LoadConfig, base_url: str) -> float:
    t0 = time.perf_counter()
    loadgen.warmup(base_url, cfg)
    loadgen.run_level(base_url, cfg, 1)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument(
        "--out", default=None, help="the report (default: benchmarks/results/harness_overhead/cpu/<date>_<commit>.md)"
    )
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="tuner-bench-")
    st = settings(state)
    target = CommandTarget(resolve(load_space_text(SPACE_YAML, source="standin.yaml"), Hardware()), st)
    cfg = loadgen.LoadConfig.from_settings(st)

    starts = [time_server_start() for _ in range(args.trials)]
    port = pick_free_port(37000, 37999)
    server = ServerProcess(
        [sys.executable, str(STANDIN), "--port", str(port), "--tokens-per-second", "5000"], port=port
    )
    server.wait_ready(time.time() + 20)
    try:
        loads = [time_load(cfg, server.base_url) for _ in range(args.trials)]
    finally:
        server.stop()

    trials, teardown_free = [], []
    for _ in range(args.trials):
        t0 = time.perf_counter()
        m = target.evaluate(PARAMS, time.time() + 60)
        trials.append(time.perf_counter() - t0)
        if m.outcome is not Outcome.OK:
            raise SystemExit(f"trial failed: {m.outcome.value}: {m.reason}")

    isolated = []
    for _ in range(args.trials):
        job = TrialJob(
            target="command",
            space_yaml=SPACE_YAML,
            space_source="standin.yaml",
            params=PARAMS,
            deadline=time.time() + 60,
            settings=st,
            hardware={"gpu_name": "cpu", "gpu_count": 0},
        )
        t0 = time.perf_counter()
        m = run_trial(job)
        isolated.append(time.perf_counter() - t0)
        if m.outcome is not Outcome.OK:
            raise SystemExit(f"isolated trial failed: {m.outcome.value}: {m.reason}\n{m.log[-2000:]}")
    del teardown_free

    med = statistics.median
    s, ld, tr, iso = med(starts), med(loads), med(trials), med(isolated)
    overhead, overhead_iso = tr - s - ld, iso - s - ld
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = "unknown"
    lines = [
        "# Serving harness overhead per trial",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- commit: {commit}",
        f"- trials: {args.trials} (medians); stand-in server, startup delay 0, 1 level x 1 request x 4 tokens",
        "",
        "| what | median s |",
        "| --- | --- |",
        f"| server's own start (spawn -> ready line) | {s:.3f} |",
        f"| load alone (warm-up + one level, running server) | {ld:.3f} |",
        f"| trial in process (`CommandTarget.evaluate`) | {tr:.3f} |",
        f"| trial isolated (`tuner.execution.isolation.run_trial`) | {iso:.3f} |",
        f"| **harness overhead, in process** (trial - start - load) | **{overhead:.3f}** |",
        f"| **harness overhead, isolated** (isolated - start - load) | **{overhead_iso:.3f}** |",
        "",
        "The in-process overhead is the target's own work: port pick, readiness polling (50 ms interval), the",
        "log reader, teardown (SIGTERM to the group, wait, port-free check). The isolated figure adds the",
        "per-trial worker process (Python start, imports of tuner/optuna-free modules, space parsing).",
        "",
        "Reproduce: `python benchmarks/harness_overhead.py --trials 10`.",
    ]
    from benchmarks.common import result_path

    out = Path(args.out) if args.out else result_path("harness_overhead", "cpu")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
