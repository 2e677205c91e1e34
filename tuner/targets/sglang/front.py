"""The throughput–latency front of a goodput study: every load a trial measured is one operating point, its output
throughput per GPU against the speed one user sees (output tok/s of one request); a point is on the front when no
other point is at least as good on both and better on one. Points that met the SLO are marked: the front within
the SLO is what an operator can run, its highest throughput the goodput."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.targets.sglang.goodput import LEVEL


@dataclass(frozen=True)
class OperatingPoint:
    trial: int
    load: str
    """``r=12.3`` (req/s) or ``c=8`` (in flight)."""
    tok_s_per_gpu: float
    tok_s_per_request: float
    meets_slo: bool
    params: dict[str, Any]


def operating_points(trials) -> list[OperatingPoint]:
    """Every load measured by the ok and pruned trials (stored ``TrialRecord`` s with their measurements)."""
    out = []
    for t in trials:
        if t.outcome not in ("ok", "pruned"):
            continue
        rows: dict[tuple[str, str], float] = {(m.level, m.metric): m.value for m in t.measurements}
        gpus = max(1.0, rows.get((LEVEL, "gpus"), 1.0))
        for level in sorted({lv for lv, _ in rows if lv.startswith(("r=", "c="))}):
            tok, user = rows.get((level, "tok_s")), rows.get((level, "tok_s_per_request"))
            if tok is None or user is None:
                continue
            out.append(OperatingPoint(t.number, level, tok / gpus, user, rows.get((level, "meets_slo")) == 1.0,
                                      dict(t.params)))
    return out


def pareto_front(points: list[OperatingPoint]) -> list[OperatingPoint]:
    """The points no other point dominates (both figures maximized), by throughput, highest first."""
    def dominated(p: OperatingPoint) -> bool:
        return any(q.tok_s_per_gpu >= p.tok_s_per_gpu and q.tok_s_per_request >= p.tok_s_per_request
                   and (q.tok_s_per_gpu > p.tok_s_per_gpu or q.tok_s_per_request > p.tok_s_per_request)
                   for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: -p.tok_s_per_gpu)


def front_lines(points: list[OperatingPoint], slo: str) -> list[str]:
    """The front as printed by ``tuner best --pareto``: every point of the front over all loads, ``*`` where it met
    the SLO, and the front within the SLO with its best throughput (the goodput) named."""
    front = pareto_front(points)
    within = pareto_front([p for p in points if p.meets_slo])
    on_front = {(p.trial, p.load) for p in front}
    best = within[0] if within else None
    lines = [f"front of {len(points)} operating points: output tok/s per GPU against tok/s per user; "
             f"* = within the SLO ({slo})",
             f"  {'tok/s/GPU':>10} {'tok/s/user':>10}  SLO  {'trial':>5}  {'load':<9} params"]
    for p in sorted({(p.trial, p.load): p for p in front + within}.values(), key=lambda p: -p.tok_s_per_gpu):
        mark = "*" if p.meets_slo else " "
        note = ("  <- best within the SLO" if best is p else "") + \
            ("" if (p.trial, p.load) in on_front else "  (on the front within the SLO only)")
        params = " ".join(f"{k}={v}" for k, v in p.params.items())
        lines.append(f"  {p.tok_s_per_gpu:>10.1f} {p.tok_s_per_request:>10.2f}   {mark}   {p.trial:>5}  "
                     f"{p.load:<9} {params}{note}")
    if best is None:
        lines.append("  no measured load met the SLO")
    return lines
