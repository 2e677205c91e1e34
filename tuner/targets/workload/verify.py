"""``tuner verify`` for a workload (twin) export: the twin's re-measure script run with ``--json`` (beside a launch.sh
that is SGLang's command), and with both predictions the command's configuration too (remeasure_command.sh), and
with an SGLang plug-in the command with it loaded (remeasure_plugin.sh)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from tuner.figures.verification import VerifyResult, combine_levels, compare, read_recorded
from tuner.measurement import Outcome
from tuner.processes import json_output


def verify_workload(path: Path, rec: dict[str, Any], tolerance: float, timeout_s: float):
    recorded = {int(k): float(v) for k, v in (rec.get("by_level") or {}).items()}
    res = VerifyResult(
        False,
        Outcome.CRASH,
        rec.get("metric", "tok_s"),
        None,
        rec.get("value"),
        recorded_by_level=recorded,
        tolerance=tolerance,
    )
    t0 = time.time()
    if rec.get("remeasure_command"):  # both predictions: the command's configuration too (issue 42)
        cpath = path.parent / str(rec["remeasure_command"])
        if cpath.is_file():
            res.command = verify_workload(cpath, read_recorded(cpath), tolerance, timeout_s)
    if rec.get("remeasure_plugin"):  # the command with the export's SGLang plug-in loaded (issue 47)
        ppath = path.parent / str(rec["remeasure_plugin"])
        if ppath.is_file():
            res.plugin = verify_workload(ppath, read_recorded(ppath), tolerance, timeout_s)
    if rec.get("remeasure"):  # a twin's launch.sh is SGLang's command: its re-measure script sits beside it
        path = path.parent / str(rec["remeasure"])
        if not path.is_file():
            res.reason = f"{path} is missing: launch.sh names it as the twin's re-measure script; re-export"
            return res
    try:
        out = subprocess.run(["bash", str(path.resolve()), "--json"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        res.outcome, res.reason = Outcome.TIMEOUT, f"no result within {timeout_s:.0f}s"
        return res
    finally:
        res.duration_s = time.time() - t0
    res.log = (out.stdout + out.stderr)[-8000:]
    try:
        got = json_output(out, "the script")
    except ValueError as exc:
        res.reason = str(exc)
        return res
    res.by_level = {int(k.split("=")[1]): float(v) for k, v in got.items()}
    res.outcome = Outcome.OK
    res.value = combine_levels(rec, res.by_level)
    compare(res, maximize=rec.get("direction", "maximize") == "maximize")
    if any(sub is not None and not sub.ok for sub in (res.command, res.plugin)):
        res.ok = False
    return res
