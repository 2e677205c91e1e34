"""The throughput–latency front of a goodput study, over its stored rows: once, for the tuner (``tuner best
--pareto``, ``tuner export --point/--slo``) and the API's dashboard alike.

Every load a trial measured (its rows at levels ``r=<req/s>`` or ``c=<in flight>``) is one operating point: output
tok/s per GPU against the speed one user sees (output tok/s of one request). A point is on the front when no other
point is at least as good on both and better on one. A load whose figures are not finite (a measurement cut short
stores none) is no point. The front is ordered along its curve: highest throughput first, which on a front is the
lowest per-user speed first (ties by trial and load, so the order is one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GOODPUT_LEVEL = "goodput"
"""The level of a goodput search's own rows (the objective, the interval, ``gpus``)."""


@dataclass(frozen=True)
class OperatingPoint:
    trial: int
    load: str
    """``r=12.3`` (req/s) or ``c=8`` (in flight)."""
    tok_s_per_gpu: float
    tok_s_per_request: float
    meets_slo: bool
    params: dict[str, Any]
    kept_up: bool | None = None
    """Whether the server kept up with the arrivals at this load (rate mode); None when not judged."""
    figures: dict[str, float] = field(default_factory=dict, compare=False)
    """Every figure stored at this load (``ttft_ms_p95``, ``error_rate``...)."""
    boundary: float | None = None
    """The boundary its trial's search found (``goodput_low``): the highest load that met the study's SLO; None when
    it met it nowhere."""

    @property
    def within_slo(self) -> bool:
        """Within the study's SLO as its trial's boundary search judged it: met at this load, and this load at or
        below the boundary (a load that met above a miss is noise the search did not take)."""
        return self.meets_slo and self.boundary is not None and self.load_value <= self.boundary * (1 + 1e-9)

    @property
    def load_value(self) -> float:
        return float(self.load.split("=", 1)[1])

    @property
    def name(self) -> str:
        """``4@r=2``: the trial and the load, as ``tuner export --point`` takes it."""
        return f"{self.trial}@{self.load}"


def operating_points(trials) -> list[OperatingPoint]:
    """Every load measured by the ok and pruned trials (stored ``TrialRecord`` s with their measurements) whose two
    figures are finite."""
    out = []
    for t in trials:
        if t.outcome not in ("ok", "pruned"):
            continue
        rows: dict[tuple[str, str], float] = {(m.level, m.metric): m.value for m in t.measurements}
        gpus = max(1.0, rows.get((GOODPUT_LEVEL, "gpus"), 1.0))
        boundary = rows.get((GOODPUT_LEVEL, "goodput_low"))
        for level in sorted({lv for lv, _ in rows if lv.startswith(("r=", "c="))}):
            tok, user = rows.get((level, "tok_s")), rows.get((level, "tok_s_per_request"))
            if tok is None or user is None or not (math.isfinite(tok) and math.isfinite(user)):
                continue
            kept = rows.get((level, "kept_up"))
            out.append(
                OperatingPoint(
                    t.number,
                    level,
                    tok / gpus,
                    user,
                    rows.get((level, "meets_slo")) == 1.0,
                    dict(t.params or {}),
                    None if kept is None else kept == 1.0,
                    {m: v for (lv, m), v in rows.items() if lv == level},
                    boundary,
                )
            )
    return out


def pareto_front(points: list[OperatingPoint]) -> list[OperatingPoint]:
    """The points no other point dominates (both figures maximized), highest throughput first."""

    def dominated(p: OperatingPoint) -> bool:
        return any(
            q.tok_s_per_gpu >= p.tok_s_per_gpu
            and q.tok_s_per_request >= p.tok_s_per_request
            and (q.tok_s_per_gpu > p.tok_s_per_gpu or q.tok_s_per_request > p.tok_s_per_request)
            for q in points
        )

    return sorted(
        (p for p in points if not dominated(p)), key=lambda p: (-p.tok_s_per_gpu, p.tok_s_per_request, p.trial, p.load)
    )
