"""``tuner verify SCRIPT``: run an exported launch script once and compare with the figures it recorded.

A server script (sglang, command targets) is launched, loaded at the recorded levels and torn down
(``tuner.server.verify.verify_script``); a workload script re-measures itself (``--json``) and is compared level
by level. Either way the result says, per level, the new figure, the recorded one and their ratio.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tuner.export import read_recorded
from tuner.measurement import Outcome


def verify(path: str | Path, *, tolerance: float = 0.15, timeout_s: float = 3600.0,
           settings: dict[str, Any] | None = None):
    """Re-run ``path`` and compare; returns an object with ``ok``, ``outcome``, ``ratios`` and ``lines()``."""
    rec = read_recorded(path)
    if rec.get("target") == "workload":
        return _verify_workload(Path(path), rec, tolerance, timeout_s)
    from tuner.server.verify import verify_script

    return verify_script(path, tolerance=tolerance, timeout_s=timeout_s, settings=settings)


def _verify_workload(path: Path, rec: dict[str, Any], tolerance: float, timeout_s: float):
    from tuner.server.verify import VerifyResult, _combine, compare

    recorded = {int(k): float(v) for k, v in (rec.get("by_level") or {}).items()}
    res = VerifyResult(False, Outcome.CRASH, rec.get("metric", "tok_s"), None, rec.get("value"),
                       recorded_by_level=recorded, tolerance=tolerance)
    t0 = time.time()
    try:
        out = subprocess.run(["bash", str(path.resolve()), "--json"], capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        res.outcome, res.reason = Outcome.TIMEOUT, f"no result within {timeout_s:.0f}s"
        return res
    finally:
        res.duration_s = time.time() - t0
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    res.log = (out.stdout + out.stderr)[-8000:]
    if out.returncode != 0 or not lines:
        tail = [ln for ln in out.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        res.reason = f"the script exited with {out.returncode}: {tail[0][:300]}"
        return res
    got = json.loads(lines[-1])
    res.by_level = {int(k.split("=")[1]): float(v) for k, v in got.items()}
    res.outcome = Outcome.OK
    res.value = _combine(rec, res.by_level)
    compare(res, maximize=rec.get("direction", "maximize") == "maximize")
    return res
