"""What a load of requests must serve to count, and the one rule that judges a load against an SLO, on figures
measured or stored: the study's serving rules (:class:`Rules`: ``max_error_rate``, ``min_delivered``), what a load's
figures miss (:func:`misses`), what an export records of a goodput trial (:func:`recorded`) and the objective at
one stored load (:func:`value_at`). The server target's load generator and goodput search measure with these; the
export, ``tuner best`` and ``tuner verify`` read stored figures with them, without the server target's internals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from search_spaces.schema import SLO_LEVEL, Objective
from storage.front import GOODPUT_LEVEL

MAX_ERROR_RATE = 0.01
"""A level with more failed requests than this share is not counted (setting ``max_error_rate``)."""
MIN_DELIVERED = 0.95
"""A level that delivered less than this share of the asked tokens is not counted (setting ``min_delivered``)."""
LEVEL = GOODPUT_LEVEL
"""The level a goodput trial's boundary figures are stored under."""


@dataclass(frozen=True)
class Rules:
    """What a load must serve to count, besides the SLO's latency limits: the study's ``max_error_rate`` and
    ``min_delivered`` (the levels' rules, :func:`tuner.targets.server.loadgen.served_problem`)."""

    max_error_rate: float = MAX_ERROR_RATE
    min_delivered: float = MIN_DELIVERED

    @classmethod
    def of(cls, settings) -> Rules:
        """The rules of a settings object or a stored settings mapping (a study's ``run.settings``)."""
        get = settings.get if isinstance(settings, dict) else (lambda k, d=None: getattr(settings, k, d))
        er, dl = get("max_error_rate"), get("min_delivered")
        return cls(MAX_ERROR_RATE if er is None else float(er), MIN_DELIVERED if dl is None else float(dl))

    def line(self) -> str:
        return (
            f"at most {self.max_error_rate:.0%} of requests failed (max_error_rate), at least "
            f"{self.min_delivered:.0%} of the asked tokens delivered (min_delivered)"
        )


def shown(name: str, value: float, limit: float) -> str:
    """A figure against its limit: ``ttft_ms_p95 812.0 > 500``; a percentile of a measurement cut short once the
    limit was certainly missed (``inf``) is ``ttft_ms_p95 > 500 (cut short)``."""
    if math.isinf(value):
        return f"{name} > {limit:g} (cut short)"
    return f"{name} {value:.1f} > {limit:g}"


def misses(figs: dict[str, float], slo: Sequence[tuple[str, float]], rules: Rules = Rules()) -> list[str]:
    """The one rule of whether a load meets an SLO: what ``figs`` (one load's figures, measured or stored) miss,
    failed requests beyond ``rules.max_error_rate`` and a share of the asked tokens delivered under
    ``rules.min_delivered`` first (the levels' rules), the server falling behind, then each limit of ``slo``
    (``ttft_ms_p99 812 > 500``); empty when it meets. The boundary search, the stored ``meets_slo``, ``tuner best
    --pareto``, ``tuner export --slo`` and ``tuner verify`` all judge a load with it."""
    out = []
    err = figs.get("error_rate", math.nan)
    if math.isnan(err):
        out.append("error_rate not measured")
    elif err > rules.max_error_rate:
        out.append(f"{err:.1%} of requests failed (max_error_rate {rules.max_error_rate:g})")
    if figs.get("delivered", 1.0) < rules.min_delivered:
        out.append(f"{figs['delivered']:.1%} of the asked tokens delivered (min_delivered {rules.min_delivered:g})")
    if figs.get("kept_up") == 0.0:
        out.append(
            f"the server fell behind (completed {figs['achieved_req_s']:.3g} of {figs['offered_req_s']:.3g} "
            "req/s offered)"
            if not figs.get("unfinished")
            else f"the server fell behind ({figs['unfinished']:.0f} requests unfinished at the end)"
        )
    for name, limit in slo:
        v = figs.get(name, math.nan)
        if math.isnan(v):
            if name.startswith(("tpot", "itl")) and not math.isnan(err) and err <= rules.max_error_rate:
                continue  # one-token outputs have no gap: nothing to limit
            out.append(f"{name} not measured")
        elif v > limit:
            out.append(shown(name, v, limit))
    return out


def recorded(obj: Objective, rows: dict[tuple[str, str], float], settings: dict) -> dict:
    """What an export records of a goodput trial for ``tuner verify``: the SLO, the boundary load and its mode."""
    return {
        "slo": [list(x) for x in obj.slo],
        "load": rows.get(("goodput_low", LEVEL)),
        "mode": settings.get("goodput_mode") or "rate",
        "gpus": rows.get(("gpus", LEVEL), 0.0),
        # the search's own figures at the boundary: verify says how close it stands to each limit beside them
        "figures": {name: rows[(name, SLO_LEVEL)] for name, _ in obj.slo if (name, SLO_LEVEL) in rows},
    }


def value_at(metric: str, rows: dict[tuple[str, str], float], level: str) -> float | None:
    """The objective ``metric`` (``goodput_tok_s_per_gpu``...) of one measured load ``level`` (``r=2``) of a trial's
    stored ``rows`` (``(metric, level) -> value``): the value the search would have given the trial had its boundary
    been there, so an exported point records the figure it is exported for."""
    gpus = max(1.0, rows.get(("gpus", LEVEL), 1.0))
    base = metric.removesuffix("_per_gpu")
    if base == "goodput_tok_s":
        v = rows.get(("tok_s", level))
    elif base == "goodput_req_s":
        v = float(level.split("=", 1)[1]) if level.startswith("r=") else rows.get(("req_s", level))
    else:
        return None
    if v is None:
        return None
    return v / gpus if metric.endswith("_per_gpu") else v
