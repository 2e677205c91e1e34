"""The throughput–latency front of a goodput study, as a plotly figure for the dashboard.

Every load a trial measured (its rows at levels ``r=<req/s>`` or ``c=<in flight>``) is one operating point: output
tok/s per GPU against the speed one user sees (output tok/s of one request). The front is the points no other point
beats on both. The SLO comes from the study's space (``objective.slo``); a p95/p99 TPOT limit bounds the speed one
user sees from below (``1000 / limit`` tok/s), so that band is the SLO region drawn; each point says whether it met
the whole SLO (TTFT too) and whether the server kept up with the arrivals there. Reads only the stored rows (the API
imports nothing of the tuner); the points and the front are :mod:`storage.front`'s, the tuner's too.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go

from search_spaces import SpaceError, load_space_text
from storage import Run
from storage.front import OperatingPoint, operating_points, pareto_front


def slo_of(run: Run) -> tuple[tuple[str, float], ...]:
    """The study's SLO (from its stored space), empty when it has none or the space cannot be read."""
    try:
        obj = load_space_text(run.space_yaml, source=run.space_name).objective if run.space_yaml else None
    except SpaceError:
        return ()
    return tuple(obj.slo) if obj is not None and obj.slo else ()


def _hover(p: OperatingPoint) -> str:
    kept = "-" if p.kept_up is None else "yes" if p.kept_up else "no"
    params = "<br>".join(f"{k}={v}" for k, v in p.params.items())
    return (
        f"trial {p.trial} at {p.load}<br>{p.tok_s_per_gpu:.1f} tok/s per GPU, {p.tok_s_per_request:.1f} tok/s "
        f"per user<br>SLO {'met' if p.meets_slo else 'missed'}, kept up: {kept}<br>{params}"
    )


def front_figure(run: Run, trials) -> str | None:
    """The figure as plotly JSON, or None when the study measured no load of a goodput objective."""
    pts = operating_points(trials)
    if not pts:
        return None
    slo = slo_of(run)
    best = max((p for p in pts if p.within_slo), key=lambda p: p.tok_s_per_gpu, default=None)
    fig = go.Figure()
    tpot = [limit for name, limit in slo if name.startswith(("tpot_ms", "itl_ms"))]
    top_user = max(p.tok_s_per_request for p in pts)
    if tpot:
        floor = 1000.0 / min(tpot)
        fig.add_vrect(
            x0=floor,
            x1=max(top_user, floor) * 1.1,
            fillcolor="rgba(40,160,80,0.12)",
            line_width=0,
            annotation_text=f"SLO region: TPOT ≤ {min(tpot):g} ms",
            annotation_position="top left",
        )
    for meets, name, color in ((False, "missed the SLO", "#b0b0b0"), (True, "met the SLO", "#2a9d4b")):
        sel = [p for p in pts if p.meets_slo == meets]
        if sel:
            fig.add_trace(
                go.Scatter(
                    x=[p.tok_s_per_request for p in sel],
                    y=[p.tok_s_per_gpu for p in sel],
                    mode="markers",
                    name=name,
                    marker={
                        "color": color,
                        "size": 9,
                        "symbol": ["x" if p.kept_up is False else "circle" for p in sel],
                    },
                    text=[_hover(p) for p in sel],
                    hoverinfo="text",
                )
            )
    line = sorted(pareto_front(pts), key=lambda p: p.tok_s_per_request)  # drawn left to right
    fig.add_trace(
        go.Scatter(
            x=[p.tok_s_per_request for p in line],
            y=[p.tok_s_per_gpu for p in line],
            mode="lines",
            name="front",
            line={"color": "#1f5fa8", "dash": "dot"},
            hoverinfo="skip",
        )
    )
    if best is not None:
        fig.add_trace(
            go.Scatter(
                x=[best.tok_s_per_request],
                y=[best.tok_s_per_gpu],
                mode="markers",
                name=f"best within the SLO: trial {best.trial} at {best.load}",
                marker={"color": "#2a9d4b", "size": 16, "symbol": "star"},
                text=[_hover(best)],
                hoverinfo="text",
            )
        )
    slo_text = ", ".join(f"{k} ≤ {v:g}" for k, v in slo) or "no SLO"
    fig.update_layout(
        title={"text": f"front of {len(pts)} loads measured ({slo_text}); x = the server fell behind"},
        xaxis_title="output tok/s per user",
        yaxis_title="output tok/s per GPU",
        legend={"orientation": "h", "y": -0.2},
    )
    doc = json.loads(fig.to_json())
    doc["meta"] = {
        "slo": [list(x) for x in slo],
        "points": len(pts),
        "front": [f"{p.trial}@{p.load}" for p in line],
        "best": None if best is None else f"{best.trial}@{best.load}",
    }
    return json.dumps(doc)
