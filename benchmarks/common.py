"""What the benchmark scripts share: timing inside CUDA graphs, checked timing, a run's provenance, the commit, a
config as its launcher runs it, and the folder a benchmark may write tuned-config files to.

The scripts import this module and never each other's helpers (an import between two scripts goes one way only:
``kernels.py`` uses ``sparse_decode_wgmma.py``'s sampling, never the reverse). Imported as ``benchmarks.common``
after a script has put the repository root on ``sys.path``."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TUNED = ROOT / "kernels" / "tuned"
"""Written only by the product (``tuner search --target kernels``); a benchmark writes tuned configs elsewhere."""

log = logging.getLogger("benchmarks.common")


def _time(fn, sets, rep_ms):
    """Decode runs inside CUDA graphs: time graph replays (cold L2 each replay); eager if capture fails."""
    import torch

    from kernels.bench import do_bench

    try:
        return do_bench(fn, sets, rep_ms=rep_ms, max_reps=300, cuda_graph=True)
    except Exception as exc:
        log.warning("graph capture failed (%s: %s); timing eagerly", type(exc).__name__, str(exc)[:120])
        torch.cuda.synchronize()
        return do_bench(fn, sets, rep_ms=rep_ms, max_reps=300, cuda_graph=False)


def checked_time(kernel, run, sets, checks, rep_ms, dtype="bfloat16") -> dict:
    """``run(inputs, out)`` checked first against ``kernel.reference`` on each input set of ``checks``, each into a
    NaN-poisoned output: ``{"err": worst relative error, "status": "ok" | "wrong_result"}``; within the dtype's
    tolerance also ``"us"``, the median of :func:`_time` over ``sets`` (one output each)."""
    from kernels.base import rel_error

    err = max(rel_error(run(i, kernel.output_like(i).fill_(float("nan"))), kernel.reference(i)) for i in checks)
    row = {"err": err, "status": "ok" if err <= kernel.tolerance(dtype) else "wrong_result"}
    if row["status"] == "ok":
        outs = [kernel.output_like(i) for i in sets]
        row["us"] = _time(lambda j: run(sets[j], outs[j]), list(range(len(sets))), rep_ms).median_us
    return row


def checked_ways(kernel, ways: dict, launch, sets, checks, rep_ms, row: dict, say=None) -> dict:
    """Each of ``ways`` (a name: keyword arguments of ``launch(inputs, out, **kwargs)``) checked and timed by
    :func:`checked_time`, one after another: ``row["NAME_err"]`` and, within tolerance, ``row["NAME_us"]``;
    ``say(name, µs or "wrong_result")`` after each. Returns ``row``."""
    for way, opts in ways.items():
        got = checked_time(kernel, lambda i, out, opts=opts: launch(i, out, **opts), sets, checks, rep_ms)
        row[f"{way}_err"] = got["err"]
        if "us" in got:
            row[f"{way}_us"] = got["us"]
        if say:
            say(way, row.get(f"{way}_us", "wrong_result"))
    return row


def short_commit() -> str:
    """``$TUNER_COMMIT`` when set (a copy of the tree on a GPU host may carry a stale .git), else git's HEAD."""
    if os.environ.get("TUNER_COMMIT"):
        return os.environ["TUNER_COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        return "unknown"


def git_commit() -> str:
    """``$KERNELS_GIT_COMMIT`` when set (a copy of the tree on a GPU host may carry a stale .git), else git's HEAD."""
    if os.environ.get("KERNELS_GIT_COMMIT"):
        return os.environ["KERNELS_GIT_COMMIT"]
    try:
        return subprocess.check_output(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, stderr=subprocess.DEVNULL, text=True
        ).strip()
    except Exception:
        return "unknown"


def run_meta(rep_ms: float, **extra) -> dict:
    """A GPU run's provenance for a stored JSON (``report_cli.provenance`` prints it): UTC date, GPU, torch, Triton,
    commit, the timing window."""
    import torch
    import triton

    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": short_commit(),
        "rep_ms": rep_ms,
        **extra,
    }


def _effective(name, cfg, shape):
    """The config as the launcher runs it: sparse decode's S is an upper bound (whole row tiles per split); the
    wgmma kernel's canonical form (the smallest S of the same partition, no 16-bit partials without splits), switches
    missing from it (a config from before they existed) off."""
    from kernels import get_kernel

    if name == "sparse_decode_wgmma":  # switches a stored config predates: off, as it ran
        from kernels.sparse_decode_wgmma import DEFAULT_CONFIG

        return json.dumps(get_kernel(name).canonical_config({**DEFAULT_CONFIG, **cfg}, shape), sort_keys=True)
    if name != "sparse_decode":
        return json.dumps(cfg, sort_keys=True)
    from kernels.sparse_decode import split_rows

    return json.dumps(dict(cfg, S=split_rows(shape["topk"], cfg["S"], cfg["BLOCK_T"])[1]), sort_keys=True)


def tuned_output_dir(directory: str | Path) -> Path:
    """The folder a benchmark writes tuned-config files to: any folder but ``kernels/tuned/``, which only the
    product's kernel search writes (a config there names the study it came from). Use the files with
    ``TUNER_KERNEL_CONFIG_DIR=<folder>``; ship them by running ``tuner search --target kernels``."""
    from tuner.errors import InputError

    path = Path(directory).resolve()
    if path == SHIPPED_TUNED.resolve():
        raise InputError(
            f"--tuned-dir {directory}: kernels/tuned/ is written only by `tuner search --target "
            "kernels`; give a folder of your own (then TUNER_KERNEL_CONFIG_DIR=<folder>)"
        )
    return path


def stored_path(source) -> str:
    """A stored result's path as a report names it: relative to the repository root where the file lies in it
    (``benchmarks/results/<benchmark>/<gpu>/<date>_<commit>.json``), else as given."""
    path = Path(source)
    try:
        return path.resolve().relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
    except ValueError:
        return path.as_posix()


def read_json(path):
    """A stored result: a ``.json`` file, or a gzip-compressed one (``.json.gz``: the large sweep tables)."""
    import gzip

    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as handle:
            return json.load(handle)
    return json.loads(path.read_text())


RESULTS = ROOT / "benchmarks" / "results"


def result_path(benchmark: str, gpu: str, variant: str = "", ext: str = "md") -> Path:
    """Where a new run files its result: ``benchmarks/results/<benchmark>/<gpu>/<UTC date>_<commit>[_<variant>].<ext>``
    (``gpu``: ``h200``, ``h200x2``, ``cpu``, ...), the layout ``benchmarks/results/README.md`` indexes."""
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    return RESULTS / benchmark / gpu / (f"{date}_{short_commit()}" + (f"_{variant}" if variant else "") + f".{ext}")


def provenance_line(meta: dict, script: str, source) -> str:
    """A GPU report's second line: when, where, what versions and commit, and the command that wrote it."""
    return (
        f"{meta['date']}, {meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, commit {meta['commit']}; "
        f"written by `{script} --report-from {stored_path(source)}`."
    )


def json_report_main(doc: str, measure, report, *, add_args=None) -> int:
    """The command line of a GPU benchmark that stores a JSON and writes its report from it: ``--json FILE`` measures
    (``measure(args) -> dict``, with ``meta``) and prints the report; ``--report-from FILE [--out MD]`` writes the
    report of a stored JSON anywhere (``report(data, source) -> str``). ``add_args(parser)`` adds the script's own."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--json", help="write the measurements here (GPU run)")
    ap.add_argument("--report-from", help="a stored JSON to write the report of")
    ap.add_argument("--out", help="the report's file (default: beside the JSON, .md)")
    ap.add_argument("--rep-ms", type=float, default=25.0)
    if add_args:
        add_args(ap)
    a = ap.parse_args()
    if a.report_from:
        text = report(read_json(a.report_from), a.report_from)
        Path(a.out or Path(a.report_from).with_suffix(".md")).write_text(text)
        print(text)
        return 0
    if not a.json:
        ap.error("give --json FILE (a GPU run) or --report-from FILE")
    data = measure(a)
    Path(a.json).write_text(json.dumps(data, indent=1))
    print(report(data, a.json))
    return 0
