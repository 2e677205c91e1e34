"""The GPU tests of a tree, run on a CUDA host and filed as a result: ``python benchmarks/gpu_tests.py run PATHS...
--out DIR`` runs ``pytest -m gpu PATHS`` (``--marks`` another selection, ``--workers N`` N pytest-xdist workers) and
writes ``DIR/<date>_<commit><suffix>.md`` (the GPU, torch, Triton, the commit
from ``$TUNER_COMMIT``, the command and pytest's own output); ``report LOG --gpu-info FILE --out MD`` writes the same
report from a stored pytest log (a run made by hand on the device)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
from pathlib import Path


def report(log: str, info: str, command: str) -> str:
    """The Markdown record of one GPU test run: the machine's lines, the command, pytest's output as it printed it."""
    summary = next((line for line in reversed(log.splitlines()) if " passed" in line or " failed" in line), "(none)")
    return (
        f"# GPU tests\n\n{info.strip()}\n\nCommand: `{command}`\n\nResult: **{summary.strip('= ')}**\n\n"
        f"```\n{log.strip()}\n```\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("paths", nargs="+")
    run.add_argument("--out", required=True, type=Path)
    run.add_argument("--marks", default="gpu", help="pytest's -m expression (default: gpu)")
    run.add_argument("--suffix", default="", help="appended to the file name, e.g. _sm90_builds")
    run.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (default: none)")
    rep = sub.add_parser("report")
    rep.add_argument("log", type=Path)
    rep.add_argument("--gpu-info", required=True, type=Path)
    rep.add_argument("--command", default="python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels")
    rep.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    if a.cmd == "report":
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report(a.log.read_text(), a.gpu_info.read_text(), a.command))
        return 0
    import torch
    import triton

    if not torch.cuda.is_available():
        print("gpu_tests: no CUDA device here; run it on a GPU host", file=sys.stderr)
        return 2
    workers = ["-n", str(a.workers)] if a.workers > 0 else []
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "-m", a.marks, *a.paths]
    done = subprocess.run(command, capture_output=True, text=True)
    commit = os.environ.get("TUNER_COMMIT", "unknown")
    info = (
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, commit {commit}, "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}_{commit}{a.suffix}.md"
    path.write_text(report(done.stdout + done.stderr, info, " ".join(["python3", *command[1:]])))
    print(path)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
