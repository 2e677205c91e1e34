"""The throughput–latency front of a goodput study as the tuner prints and exports it: the points and the front
themselves are :mod:`storage.front`'s (one front for the tuner and the API). Points that met the SLO are marked: the
front within the SLO is what an operator can run, its highest throughput the goodput."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from storage.front import OperatingPoint, operating_points, pareto_front
from tuner.errors import ExportError
from tuner.figures.serving import Rules, misses

__all__ = [
    "OperatingPoint",
    "operating_points",
    "pareto_front",
    "front_lines",
    "parse_slo",
    "point_for_slo",
    "point_by_name",
    "Chosen",
    "SLO_METRICS",
    "verdict",
]


def verdict(p: OperatingPoint, slo: tuple[tuple[str, float], ...] | None = None, rules: Rules = Rules()) -> list[str]:
    """The one answer to whether point ``p`` meets an SLO, empty when it does: under the study's own SLO (``slo``
    None), as its trial's boundary search judged it (:attr:`OperatingPoint.within_slo`); under another (``tuner
    export --slo``), every rule of :func:`tuner.figures.serving.misses` (failed requests, tokens delivered, the
    server keeping up, each limit) on the figures stored at that load, with the study's ``rules``. ``tuner best``,
    ``best --pareto``, ``export``, ``export --slo`` and the search itself all decide with it."""
    if slo is None:
        if p.within_slo:
            return []
        if p.boundary is None:
            return [f"trial {p.trial} met the study's SLO at no load"]
        if p.meets_slo:
            return [f"above trial {p.trial}'s boundary {p.boundary:g} (a load missed below it)"]
        return ["missed the study's SLO here"]
    return misses(p.figures, slo, rules)


def front_lines(points: list[OperatingPoint], slo: str) -> list[str]:
    """The front as printed by ``tuner best --pareto``: every point of the front over all loads, ``*`` where it met
    the study's SLO (:func:`verdict`), and the front within the SLO with its best throughput (the goodput) named."""
    front = pareto_front(points)
    within = pareto_front([p for p in points if not verdict(p)])
    on_front = {(p.trial, p.load) for p in front}
    best = within[0] if within else None
    shown = sorted({(p.trial, p.load): p for p in front + within}.values(), key=lambda p: -p.tok_s_per_gpu)
    lines = [
        f"{len(shown)} points on the front, of {len(points)} operating points measured: output tok/s per GPU "
        f"against tok/s per user; * = within the SLO ({slo}); kept up: whether the server kept up with the "
        "arrivals",
        f"  {'tok/s/GPU':>10} {'tok/s/user':>10}  SLO  kept up  {'trial':>5}  {'load':<9} params",
    ]
    for p in shown:
        mark = "*" if not verdict(p) else " "
        note = ("  <- best within the SLO" if best is p else "") + (
            "" if (p.trial, p.load) in on_front else "  (on the front within the SLO only)"
        )
        params = " ".join(f"{k}={v}" for k, v in p.params.items())
        kept = "-" if p.kept_up is None else "yes" if p.kept_up else "no"
        lines.append(
            f"  {p.tok_s_per_gpu:>10.1f} {p.tok_s_per_request:>10.2f}   {mark}   {kept:<7}  {p.trial:>5}  "
            f"{p.load:<9} {params}{note}"
        )
    if best is None:
        lines.append("  no measured load met the SLO")
    return lines


# -- a point to export ---------------------------------------------------------------------------------------------
SLO_METRICS = ("ttft_ms_p95", "ttft_ms_p99", "tpot_ms_p95", "tpot_ms_p99", "itl_ms_p99")
"""The latency figures stored at each load measured, which an SLO given to ``tuner export --slo`` may limit."""


@dataclass(frozen=True)
class Chosen:
    """A point of the front chosen for export: the trial, its load (``r=2``), the SLO it is exported for (the
    study's when None) and the line the launch script's header says it with."""

    trial: int
    load: str
    slo: tuple[tuple[str, float], ...] | None
    line: str


def parse_slo(text: str) -> tuple[tuple[str, float], ...]:
    """``ttft_ms_p95<=500,tpot_ms_p95<=50`` as ``(("ttft_ms_p95", 500.0), ("tpot_ms_p95", 50.0))``; a bad part is
    one ``ExportError`` naming it and the form."""
    out = []
    for part in [x.strip() for x in text.split(",") if x.strip()] or [text]:
        m = re.fullmatch(r"([a-z0-9_]+)\s*<=\s*([0-9.eE+-]+)", part)
        if not m:
            raise ExportError(
                f"--slo part {part!r} is not `metric<=limit`; give e.g. --slo 'ttft_ms_p95<=500,tpot_ms_p95<=50'"
            )
        name, limit = m.group(1), m.group(2)
        if name not in SLO_METRICS:
            raise ExportError(
                f"--slo metric {name!r} is not measured at each load; use one of {', '.join(SLO_METRICS)}"
            )
        try:
            value = float(limit)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise ExportError(f"--slo limit {part!r} is not a positive number of ms; give e.g. {name}<=500")
        out.append((name, value))
    return tuple(out)


def _slo_text(slo) -> str:
    return ",".join(f"{k}<={v:g}" for k, v in slo)


def point_for_slo(points: list[OperatingPoint], slo: tuple[tuple[str, float], ...], rules: Rules = Rules()) -> Chosen:
    """The best configuration under ``slo``: of the loads measured that meet it (:func:`verdict`: every rule, the
    study's ``rules`` included), the one with the highest output tok/s per GPU (the higher load on a tie). None
    meets: ``ExportError`` naming the closest (the smallest worst ratio of a figure to its limit)."""
    meeting = [p for p in points if not verdict(p, slo, rules)]
    if not meeting:

        def worst(p: OperatingPoint) -> float:
            ratios = [p.figures.get(k, math.inf) / v for k, v in slo]
            bad = len(verdict(p, slo, rules)) > sum(1 for k, v in slo if p.figures.get(k, math.inf) > v)
            return (math.inf if bad else 0.0) + max(ratios, default=math.inf)

        close = min(points, key=worst, default=None)
        near = f"; the closest: {close.name} ({'; '.join(verdict(close, slo, rules))})" if close is not None else ""
        raise ExportError(
            f"no measured load meets --slo {_slo_text(slo)!r} ({rules.line()}){near}; loosen the SLO "
            "or measure lower loads (setting goodput_min)"
        )
    best = max(meeting, key=lambda p: (p.tok_s_per_gpu, p.load_value))
    figs = ", ".join(f"{k} {best.figures[k]:.1f}" for k, _ in slo)
    return Chosen(
        best.trial,
        best.load,
        slo,
        f"SLO {_slo_text(slo)}: trial {best.trial} at {best.load} "
        f"({best.tok_s_per_gpu:.1f} tok/s per GPU, {figs}, error rate {best.figures['error_rate']:.1%}, "
        f"{best.figures.get('delivered', 1.0):.1%} of the asked tokens delivered), the best configuration's "
        "highest load meeting it",
    )


def point_by_name(points: list[OperatingPoint], name: str, goodput_load: dict[int, float]) -> Chosen:
    """The point ``name`` names: ``4@r=2`` (a trial and a load it measured, as ``tuner best --pareto`` prints
    them), or ``4`` (the trial at its goodput boundary, ``goodput_load`` by trial). Unknown: ``ExportError``
    listing the front's names."""
    text = name.strip()
    if re.fullmatch(r"\d+", text):
        trial = int(text)
        load = goodput_load.get(trial)
        mine = [p for p in points if p.trial == trial]
        hit = next((p for p in mine if load is not None and p.load.split("=", 1)[1] == f"{load:g}"), None)
        if hit is None:
            raise ExportError(_unknown(points, text, "trial whose goodput boundary was measured"))
        return Chosen(
            hit.trial,
            hit.load,
            None,
            f"point {hit.name} (trial {hit.trial} at its goodput boundary "
            f"{hit.load}, {hit.tok_s_per_gpu:.1f} tok/s per GPU, {hit.tok_s_per_request:.1f} tok/s per user)",
        )
    hit = next((p for p in points if p.name == text.replace(" ", "")), None)
    if hit is None:
        raise ExportError(_unknown(points, text, "measured load"))
    return Chosen(
        hit.trial,
        hit.load,
        None,
        f"point {hit.name} ({hit.tok_s_per_gpu:.1f} tok/s per GPU, "
        f"{hit.tok_s_per_request:.1f} tok/s per user, {'within' if not verdict(hit) else 'outside'} the "
        "study's SLO)",
    )


def _unknown(points: list[OperatingPoint], name: str, what: str) -> str:
    names = [p.name for p in pareto_front(points)]
    return (
        f"--point {name!r} names no {what} of this study; give trial@load, e.g. "
        f"{', '.join(names[:6]) or 'none measured'} (the front; `tuner best --pareto` lists it)"
    )
