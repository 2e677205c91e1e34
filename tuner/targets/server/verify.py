"""``tuner verify`` for a server target's export: run the launch script once with ``PORT`` set, load it at the
recorded levels with the recorded load (a goodput export: its boundary load under the SLO), tear it down, and compare
with the recorded figures (:mod:`tuner.figures.verification`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from tuner.figures.verification import VerifyResult, combine_levels, compare, read_recorded
from tuner.measurement import Outcome
from tuner.targets.server import loadgen
from tuner.targets.server.launch import ServerProcess, parse_port_range, pick_free_port

_logger = logging.getLogger(__name__)


def verify_script(
    path: str | Path,
    *,
    tolerance: float = 0.15,
    timeout_s: float = 3600.0,
    port_range: str = "30000-30999",
    host: str = "127.0.0.1",
    settings: dict[str, Any] | None = None,
) -> VerifyResult:
    """Run the launch script once (``bash path`` with ``PORT`` set), load it at the recorded levels with the
    recorded load, and compare the objective per level with the header's figures. Never raises for a failed run.
    It dials the address the script binds (the recorded ``host``; ``host`` for a script that records none)."""
    t0 = time.time()
    rec = read_recorded(path)
    load = {**rec.get("load", {}), **(settings or {})}
    levels = [int(c) for c in rec.get("levels") or [int(k) for k in rec.get("by_level", {})]]
    metric = str(rec.get("metric", "tok_s"))
    maximize = rec.get("direction", "maximize") == "maximize"
    recorded_by_level = {int(k): float(v) for k, v in (rec.get("by_level") or {}).items()}
    result = VerifyResult(
        False, Outcome.CRASH, metric, None, rec.get("value"), recorded_by_level=recorded_by_level, tolerance=tolerance
    )
    host = dial_address(rec.get("host")) or host
    port = pick_free_port(*parse_port_range(port_range), host)
    cfg = loadgen.LoadConfig.from_settings(load)
    deadline = t0 + timeout_s
    server = ServerProcess(
        ["bash", str(Path(path).resolve())],
        env={"PORT": str(port)},
        port=port,
        host=host,
        health_paths=tuple(load.get("health_paths") or ("/health", "/v1/models")),
    )
    try:
        failure = server.wait_ready(deadline)
        if failure is not None:
            result.outcome, result.reason = failure.outcome, failure.reason
            return result
        probe = loadgen.probe(server.base_url, cfg, deadline)
        if probe.refused:
            result.outcome, result.reason = Outcome.REQUEST_ERROR, probe.refused
            return result
        cfg = probe.config
        if rec.get("goodput"):  # issue 22: a goodput export re-measures its boundary load under the SLO
            return _verify_goodput(result, server, cfg, rec, load, deadline)
        for i, c in enumerate(levels):
            res = loadgen.run_level(
                server.base_url,
                cfg,
                c,
                level_index=i,
                deadline=deadline,
                should_abort=lambda: f.reason if (f := server.failure()) else None,
            )
            if res.aborted or not res.ok_requests:
                f = server.failure()
                result.outcome = f.outcome if f else (Outcome.TIMEOUT if res.aborted else Outcome.CRASH)
                result.reason = f"at c={c}: " + (f.reason if f else res.aborted or res.first_error())
                return result
            served = loadgen.served_problem(
                res,
                float(load.get("max_error_rate", loadgen.MAX_ERROR_RATE)),
                float(load.get("min_delivered", loadgen.MIN_DELIVERED)),
            )
            if served:  # a level that served too little of what was asked verifies nothing
                result.outcome, result.reason = Outcome.REQUEST_ERROR, f"at c={c}: {served}"
                return result
            result.by_level[c] = loadgen.level_summary(res)[metric]
        result.outcome = Outcome.OK
        result.value = combine_levels(rec, result.by_level)
        compare(result, maximize=maximize)
        return result
    finally:
        server.stop()
        result.log = server.log_text()
        result.duration_s = time.time() - t0
        _logger.info("verify %s: %s", path, result.lines()[0])


def _verify_goodput(
    result: VerifyResult,
    server: ServerProcess,
    cfg: loadgen.LoadConfig,
    rec: dict[str, Any],
    load: dict[str, Any],
    deadline: float,
) -> VerifyResult:
    """A goodput script: its recorded boundary load, less the tolerance, measured again; verified when it still meets
    the SLO there."""
    from tuner.targets.server import goodput

    fields = goodput.GoodputSettings.model_fields
    settings = goodput.GoodputSettings.parse({k: v for k, v in load.items() if k in fields}, owner="the recorded load")
    measure = goodput.Measurer(
        server.base_url,
        cfg,
        settings,
        lambda n, off: loadgen.make_requests(cfg, n, off),
        deadline=deadline,
        should_abort=lambda: f.reason if (f := server.failure()) else None,
    )
    try:
        ok, boundary, text = goodput.verify_load(measure, rec["goodput"], shortfall=result.tolerance)
    except goodput.Aborted as exc:
        f = server.failure()
        result.outcome, result.reason = (f.outcome, f.reason) if f else (Outcome.TIMEOUT, str(exc))
        return result
    result.outcome, result.ok, result.reason = Outcome.OK, ok, text
    if boundary is not None:
        rows = goodput.boundary_rows(boundary, int(rec["goodput"].get("gpus") or 0))
        result.value = next((r.value for r in rows if r.metric == result.metric and r.level == goodput.LEVEL), None)
    return result


def dial_address(bind: str | None) -> str | None:
    """The address to reach a server that binds ``bind``: itself, or the loopback for a wildcard (``0.0.0.0``)."""
    if not bind:
        return None
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "*") else bind
