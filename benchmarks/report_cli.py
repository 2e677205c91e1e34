"""The command line the measure-then-report benchmarks share: ``--json OUT.json`` measures on a GPU and writes the
results, ``--report-from FILE.json [--out REPORT.md]`` writes the markdown report of stored results on any machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable


def run(argv, doc: str, default_out: Path, report: Callable[[dict, str], str],
        measure: Callable[[argparse.Namespace, Path], dict],
        add_args: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Parse ``argv``; report from a stored JSON, or check for a GPU and ``measure(args, json_path)`` (which writes
    the JSON) then write and print its report. ``measure`` returns None after printing a one-line error: exit 2."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--json", type=Path, help="measure on the GPU and write the results here")
    ap.add_argument("--report-from", type=Path, help="write the markdown report of a stored JSON")
    ap.add_argument("--out", type=Path, default=default_out, help=f"the report's path (default: {default_out.name})")
    if add_args:
        add_args(ap)
    args = ap.parse_args(argv)
    if args.report_from:
        args.out.write_text(report(json.loads(args.report_from.read_text()), str(args.report_from)))
        print(args.out.read_text())
        return 0
    if not args.json:
        print("error: give --json OUT.json (measure, on a GPU) or --report-from FILE.json", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: measuring needs a CUDA GPU; on a CPU use --report-from FILE.json", file=sys.stderr)
        return 2
    data = measure(args, args.json)
    if data is None:
        return 2
    args.out.write_text(report(data, str(args.json)))
    print(args.out.read_text())
    return 0
