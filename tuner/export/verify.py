"""``tuner verify SCRIPT``: run an exported launch script once and compare with the figures it recorded.

A server script (sglang, command targets) is launched with ``PORT`` set, loaded at the recorded levels with the
recorded load and torn down (:func:`verify_script`); a workload script re-measures itself (``--json``). Either way
the result says, per level, the new figure, the recorded one and their ratio. The recorded figures are the
script's ``# tuner-recorded:`` line, written by :mod:`tuner.export.script`. :func:`verify_stored` verifies the
script a study's storage keeps (its export's artifacts) and stores the result there (artifact ``verify.json``).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ExportError
from tuner.export.script import REMEASURE_NAME, SCRIPT_NAME, read_recorded
from tuner.measurement import Outcome
from tuner.targets.server import loadgen
from tuner.targets.server.launch import ServerProcess, parse_port_range, pick_free_port

_logger = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    ok: bool
    outcome: Outcome
    metric: str
    value: float | None
    recorded_value: float | None
    by_level: dict[int, float] = field(default_factory=dict)
    recorded_by_level: dict[int, float] = field(default_factory=dict)
    ratios: dict[int, float] = field(default_factory=dict)
    tolerance: float = 0.15
    reason: str = ""
    log: str = ""
    duration_s: float = 0.0
    command: VerifyResult | None = None
    """A workload export's second prediction: the command's configuration re-measured (remeasure_command.sh)."""

    def lines(self) -> list[str]:
        head = "verified" if self.ok else "NOT verified"
        # a run that measured and missed is "NOT verified" alone: "outcome ok" there reads as a pass
        outcome = "" if not self.ok and self.outcome is Outcome.OK else f"outcome {self.outcome.value}, "
        out = [
            f"{head}: {self.metric} {self.value if self.value is None else round(self.value, 3)} "
            f"(recorded {self.recorded_value if self.recorded_value is None else round(self.recorded_value, 3)}, "
            f"tolerance {self.tolerance:.0%}, {outcome}{self.duration_s:.1f}s)"
        ]
        for c in sorted(self.recorded_by_level):
            got = self.by_level.get(c)
            ratio = self.ratios.get(c)
            out.append(
                f"  c={c}: {got if got is None else round(got, 3)} vs {round(self.recorded_by_level[c], 3)}"
                + (f" ({ratio:.2f}x)" if ratio is not None else "")
            )
        if self.reason:
            out.append(f"  {self.reason}")
        if self.command is not None:
            out.append("the exported command's configuration (remeasure_command.sh), the second prediction:")
            out += ["  " + ln for ln in self.command.lines()]
        return out


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
        result.value = _combine(rec, result.by_level)
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


def compare(result: VerifyResult, *, maximize: bool) -> None:
    """Fill ``result.ratios``, ``ok`` and ``reason`` from its new and recorded figures per level."""
    worst = []
    for c, want in result.recorded_by_level.items():
        got = result.by_level.get(c)
        if got is None or want == 0 or math.isnan(got):
            continue
        result.ratios[c] = got / want
        tol = result.tolerance
        if (got < want * (1 - tol)) if maximize else (got > want * (1 + tol)):
            worst.append(f"c={c}: {got:.3g} vs recorded {want:.3g}")
    result.ok = not worst
    if worst:
        result.reason = f"outside {result.tolerance:.0%} of the recorded figures: " + "; ".join(worst)


def _combine(rec: dict[str, Any], by_level: dict[int, float]) -> float:
    vals = [v for v in by_level.values()]
    combine = rec.get("combine", "geomean")
    if combine == "level" and rec.get("level") in by_level:
        return by_level[rec["level"]]
    if combine == "geomean":
        return 0.0 if any(v <= 0 for v in vals) else math.exp(sum(math.log(v) for v in vals) / len(vals))
    if combine == "min":
        return min(vals)
    return sum(vals) / len(vals)


def verify(
    path: str | Path, *, tolerance: float = 0.15, timeout_s: float = 3600.0, settings: dict[str, Any] | None = None
):
    """Re-run ``path`` and compare; returns an object with ``ok``, ``outcome``, ``ratios`` and ``lines()``."""
    rec = read_recorded(path)
    if rec.get("target") == "workload":
        return _verify_workload(Path(path), rec, tolerance, timeout_s)
    return verify_script(path, tolerance=tolerance, timeout_s=timeout_s, settings=settings)


def _verify_workload(path: Path, rec: dict[str, Any], tolerance: float, timeout_s: float):
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
            res.command = _verify_workload(cpath, read_recorded(cpath), tolerance, timeout_s)
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
    if res.command is not None and not res.command.ok:
        res.ok = False
    return res


VERIFY_NAME = "verify.json"
"""The artifact a verification of a stored export leaves in the study's storage."""


def verify_stored(
    repo: Any,
    study: str | None,
    *,
    script: str | Path | None = None,
    tolerance: float = 0.15,
    timeout_s: float = 3600.0,
    settings: dict[str, Any] | None = None,
):
    """Verify study ``study``'s exported launch script (``script``, else the one its storage keeps from its last
    export), and store the result in that storage as the artifact :data:`VERIFY_NAME`. A study without an export:
    ``ExportError`` naming the command that makes one."""
    import tempfile

    run = repo.get_run(study) if study else next(iter(repo.list_runs()), None)
    if run is None:
        raise ExportError(f"no study {study!r} in this storage; `tuner status` lists the studies")
    with tempfile.TemporaryDirectory(prefix="tuner-verify-") as tmp:
        if script is None:
            art = repo.get_artifact(run.id, SCRIPT_NAME)
            if art is None:
                raise ExportError(
                    f"study {run.study_name!r} has no exported launch script in this storage; run "
                    f"`tuner export --study {run.study_name}` first, or give the script's path"
                )
            script = Path(tmp) / SCRIPT_NAME
            script.write_bytes(art.content)
            extra = repo.get_artifact(run.id, REMEASURE_NAME)
            if extra is not None:
                (Path(tmp) / REMEASURE_NAME).write_bytes(extra.content)
        res = verify(script, tolerance=tolerance, timeout_s=timeout_s, settings=settings)
    doc = {
        "ok": res.ok,
        "outcome": res.outcome.value,
        "metric": res.metric,
        "value": res.value,
        "recorded_value": res.recorded_value,
        "tolerance": tolerance,
        "reason": res.reason,
        "lines": res.lines(),
        "at": time.time(),
    }
    repo.add_artifacts(run.id, [("verify", VERIFY_NAME, str(script), json.dumps(doc).encode())])
    return res
