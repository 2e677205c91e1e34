"""Goodput: the most load one server configuration serves while its latency stays within an SLO.

A *measurement* loads the server at one rate (open-loop Poisson arrivals, seeded: requests arrive whether or not
earlier ones have finished, as users do) or at one concurrency (closed loop), and reads per request the time to
first token (TTFT), the time per output token after the first (TPOT), the gaps between tokens (ITL) and the end to
end latency, pooled over every measurement at that load. A load *meets* the SLO when every limit holds on the pooled
percentiles and no request failed or was left unfinished.

The *boundary search* (:func:`find_boundary`) brackets the boundary by doubling (or halving) from a start, bisects
(geometrically for rates, by integers for concurrency) until the bracket is within a relative tolerance, and then
measures both ends again until each has ``repeats`` measurements pooled; a pooled verdict that flips moves the
bracket. The result is an interval ``[low, high]``: ``low`` the highest load that met the SLO, ``high`` the lowest
that missed it. With an incumbent (the best goodput so far), its boundary load is measured first: a trial that misses
the SLO there cannot beat it, and the search stops (pruned).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import httpx
from pydantic import Field

from search_spaces.schema import SLO_LEVEL, Objective
from storage.front import GOODPUT_LEVEL
from storage.types import MetricRow
from tuner.figures.serving import Rules, misses, recorded, shown, value_at  # noqa: F401 - the goodput search's rules, re-exported
from tuner.measurement import Measurement, Outcome
from tuner.settings import Settings
from tuner.targets.server import loadgen
from tuner.targets.server.loadgen import LoadConfig, RequestResult, RequestSpec

_logger = logging.getLogger(__name__)

LEVEL = GOODPUT_LEVEL
"""The level of a goodput search's own rows (the objective, the interval, the search's cost)."""


class GoodputSettings(Settings):
    """How the boundary search runs (the SLO itself is the objective's ``slo``)."""

    goodput_mode: Literal["rate", "concurrency"] = "rate"
    """``rate``: open-loop Poisson arrivals at a request rate (req/s); ``concurrency``: that many requests in flight."""
    goodput_arrivals: Literal["poisson", "constant"] = "poisson"
    """``rate`` mode: Poisson arrivals (seeded; users arrive independently) or evenly spaced ones."""
    goodput_start: float = Field(1.0, gt=0)
    """The first load measured (req/s, or requests in flight)."""
    goodput_min: float = Field(0.05, gt=0)
    """The lowest load tried: missing the SLO there makes the configuration infeasible."""
    goodput_max: float = Field(1024.0, gt=0)
    """The highest load tried: meeting the SLO there ends the search with the boundary at or above it."""
    goodput_tolerance: float = Field(0.1, gt=0, lt=1)
    """Bisect until the bracket's high end is within this fraction of its low end."""
    goodput_window_s: float = Field(5.0, gt=0)
    """Seconds of arrivals in one measurement (rate), or seconds of sending (concurrency)."""
    goodput_min_requests: int = Field(20, ge=1)
    """Requests in one measurement at least."""
    goodput_repeats: int = Field(3, ge=1)
    """Measurements pooled at each end of the final bracket."""
    goodput_max_measurements: int = Field(24, ge=1)
    """Measurements one boundary search may take (the incumbent check included)."""
    goodput_keepup_tolerance: float = Field(0.15, gt=0, lt=1)
    """A rate the server completes requests at more than this fraction below the offered rate is not kept up (an SLO
    miss, whatever the latencies): see :class:`KeptUp`."""
    goodput_drain_s: float = Field(60.0, gt=0)
    """Seconds after the last arrival a measurement waits for its requests; one left unfinished misses the SLO."""
    goodput_incumbent_check: bool = True
    """Measure first at the incumbent's boundary load; a trial missing the SLO there is pruned."""
    incumbent_value: float | None = None
    """Set by the search for a trial that may be pruned: the best objective value so far."""
    incumbent_load: float | None = None
    """Set with ``incumbent_value``: the best trial's stored boundary (``goodput_low``), the load a challenger must
    meet the SLO at (read from the study's storage by the target's ``trial_settings``)."""
    incumbent_gpus: float | None = None
    """The GPUs the incumbent's boundary was measured on (per-GPU objectives scale its load to this trial's)."""
    max_error_rate: float = Field(loadgen.MAX_ERROR_RATE, ge=0, le=1)
    """A level (a load of the boundary search too) with a larger share of failed requests does not count: the trial
    is ``request_error``, the load misses the SLO."""
    min_delivered: float = Field(loadgen.MIN_DELIVERED, ge=0, le=1)
    """A level (a load of the boundary search too) that delivered a smaller share of the asked tokens does not count:
    the trial is ``request_error``, the load misses the SLO."""


# -- one measurement ----------------------------------------------------------------------------------------------
def arrivals(rate: float, count: int, seed: int, kind: str = "poisson") -> list[float]:
    """``count`` arrival times (seconds from the start) at ``rate`` per second: a Poisson process (exponential gaps
    from a generator seeded with ``seed``) or evenly spaced (``constant``)."""
    if kind == "constant":
        return [(i + 1) / rate for i in range(count)]
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass(frozen=True)
class KeptUp:
    """Whether an open-loop measurement's server kept up with the arrivals. ``achieved_req_s`` is the rate completions
    advanced at: the offered rate over the slope of the requests' completion times against their arrival times (a
    server keeping up finishes each request a latency after it arrives, whenever it arrives: slope 1; one that falls
    behind serves a growing queue: slope offered / served rate). Not kept up: a request still unfinished when the
    measurement ended (``goodput_drain_s`` after the last arrival), or ``achieved_req_s`` more than ``tolerance``
    below ``offered_req_s``. ``judged`` is false for a measurement cut short once its TTFT limit was certainly
    missed (requests were never sent: nothing to compare)."""

    offered_req_s: float
    achieved_req_s: float
    unfinished: int
    backlog: int
    """Requests in flight at the last arrival (that one included)."""
    tolerance: float
    judged: bool = True

    @property
    def ok(self) -> bool | None:
        if not self.judged:
            return None
        return self.unfinished == 0 and self.achieved_req_s >= (1 - self.tolerance) * self.offered_req_s

    def why(self) -> str:
        """Why the server did not keep up (empty when it did, or when not judged)."""
        if self.ok is not False:
            return ""
        if self.unfinished:
            return f"the server fell behind: {self.unfinished} requests unfinished at the end of the measurement"
        return (
            f"the server fell behind: completed {self.achieved_req_s:.3g} of {self.offered_req_s:.3g} req/s "
            f"offered (more than {self.tolerance:.0%} short)"
        )


def keep_up(
    arrivals: Sequence[float], done_at: Sequence[float | None], tolerance: float, judged: bool = True
) -> KeptUp:
    """:class:`KeptUp` of one open-loop measurement: ``arrivals[i]`` when request ``i`` was due and ``done_at[i]``
    when it finished (``None``: unfinished), both in seconds from the start."""
    n = len(arrivals)
    offered = n / arrivals[-1] if n and arrivals[-1] > 0 else 0.0
    pairs = [(a, d) for a, d in zip(arrivals, done_at) if d is not None]
    achieved = 0.0
    if len(pairs) >= 2:
        ma = sum(a for a, _ in pairs) / len(pairs)
        md = sum(d for _, d in pairs) / len(pairs)
        var = sum((a - ma) ** 2 for a, _ in pairs)
        slope = sum((a - ma) * (d - md) for a, d in pairs) / var if var > 0 else 1.0
        achieved = offered / max(slope, 1.0) if slope > 0 else offered
    elif pairs:
        achieved = offered
    last = arrivals[-1] if n else 0.0
    backlog = sum(1 for a, d in zip(arrivals, done_at) if a <= last and (d is None or d > last))
    return KeptUp(offered, achieved, sum(1 for d in done_at if d is None), backlog, tolerance, judged)


@dataclass
class Sample:
    """One measurement at one load."""

    load: float
    requests: list[RequestResult]
    wall_s: float
    kept: KeptUp | None = None
    """Rate mode: whether the server kept up with the arrivals."""


def _late_limits(slo: Sequence[tuple[str, float]]) -> list[tuple[float, float]]:
    """``(limit_s, quantile)`` of each TTFT limit of ``slo`` (``ttft_ms_p95``: 0.95, as :func:`figures` reads it)."""
    return [(limit / 1e3, int(name.rsplit("_p", 1)[1]) / 100) for name, limit in slo if name.startswith("ttft_ms")]


def late_needed(n: int, q: float) -> int:
    """The fewest of ``n`` requests over a limit that put their ``q`` quantile over it whatever the others' values.
    The quantile (:func:`loadgen._pct`) interpolates between the sorted values at ``floor((n - 1) q)`` and the next:
    it is certainly over the limit once the lower one is, that is once ``n - floor((n - 1) q)`` requests are. One
    fewer is not enough (the upper value just over the limit, the lower one under it: the quantile can be under):
    with 8 requests a p95 is 0.35 of the second slowest plus 0.65 of the slowest, and one slow request alone need not
    miss it."""
    return n - math.floor((n - 1) * q)


async def _open_loop(
    base_url: str,
    cfg: LoadConfig,
    reqs: Sequence[RequestSpec],
    arrivals: Sequence[float],
    drain_s: float,
    deadline: float | None,
    should_abort: Callable[[], str | None] | None,
    slo: Sequence[tuple[str, float]] = (),
    tolerance: float = 0.15,
) -> tuple[list[RequestResult], float, str, KeptUp]:
    """Send ``reqs[i]`` at ``arrivals[i]`` whatever the others do. The measurement is cut (the requests left are
    cancelled) ``drain_s`` after the last arrival, or as soon as enough requests are over a TTFT limit of ``slo``
    (the first token came late, or has not come that long after sending) that its quantile misses whatever the rest
    do (:func:`late_needed`). A request cut before its end counts as late (TTFT, if it had no token, and its end to
    end latency infinite), never as an error; one never sent is left out. Also returns whether the server kept up
    (:func:`keep_up`; not judged when the SLO cut the measurement short)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
    n = len(reqs)
    results: list[RequestResult | None] = [None] * n
    sent_at: list[float | None] = [None] * n
    first: list[float | None] = [None] * n
    done_at: list[float | None] = [None] * n
    late_limits = _late_limits(slo)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()

        async def send(i: int) -> None:
            delay = start + arrivals[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at[i] = time.perf_counter()
            results[i] = await loadgen.one_request(
                client, base_url, cfg, reqs[i], on_first=lambda t: first.__setitem__(i, t)
            )
            done_at[i] = time.perf_counter() - start

        def missed_already(now: float) -> bool:
            for limit, q in late_limits:
                late = sum(
                    1
                    for i in range(n)
                    if (first[i] is not None and first[i] > limit)
                    or (first[i] is None and sent_at[i] is not None and now - sent_at[i] > limit)
                )
                if late >= late_needed(n, q):
                    return True
            return False

        tasks = [asyncio.create_task(send(i)) for i in range(n)]
        cut_at = start + arrivals[-1] + drain_s
        slo_cut = False

        def cut() -> bool:
            nonlocal slo_cut
            now = time.perf_counter()
            if now >= cut_at:
                return True
            slo_cut = missed_already(now)
            return slo_cut

        aborted = await loadgen.wait_or_abort(tasks, should_abort, deadline, cut)
        wall = time.perf_counter() - start
    out = []
    for i, r in enumerate(results):
        if r is not None:
            out.append(r)
        elif sent_at[i] is not None:
            out.append(
                RequestResult(
                    ok=True, ttft_s=first[i] if first[i] is not None else math.inf, e2e_s=math.inf, output_tokens=0
                )
            )
    sent = [i for i in range(n) if sent_at[i] is not None]
    kept = keep_up([arrivals[i] for i in sent], [done_at[i] for i in sent], tolerance, judged=not slo_cut)
    return out, wall, aborted, kept


class Aborted(Exception):
    """The server failed or the trial's deadline came during a measurement."""


@dataclass
class Measurer:
    """Measures the server at ``base_url`` at one load; ``make_requests(count, offset)`` gives the requests."""

    base_url: str
    cfg: LoadConfig
    settings: GoodputSettings
    make_requests: Callable[[int, int], list[RequestSpec]]
    deadline: float | None = None
    should_abort: Callable[[], str | None] | None = None
    slo: tuple[tuple[str, float], ...] = ()
    """The limits a rate measurement is cut short by once they are certainly missed."""
    count: int = 0

    def __call__(self, load: float) -> Sample:
        self.count += 1
        s = self.settings
        if self.deadline is not None and time.time() >= self.deadline:
            raise Aborted("deadline reached before a measurement")
        if s.goodput_mode == "rate":
            n = max(s.goodput_min_requests, math.ceil(load * s.goodput_window_s))
            times = arrivals(load, n, self.cfg.seed * 1_000_003 + self.count, s.goodput_arrivals)
            reqs = self.make_requests(n, 10_000 * self.count)
            results, wall, aborted, kept = asyncio.run(
                _open_loop(
                    self.base_url,
                    self.cfg,
                    reqs,
                    times,
                    s.goodput_drain_s,
                    self.deadline,
                    self.should_abort,
                    self.slo,
                    s.goodput_keepup_tolerance,
                )
            )
        else:
            c = int(load)
            cfg = replace(
                self.cfg, level_s=s.goodput_window_s, requests_per_level=None, min_requests=s.goodput_min_requests
            )
            reqs = self.make_requests(cfg.n_requests(c), 10_000 * self.count)
            res = asyncio.run(
                loadgen._run_level(self.base_url, cfg, c, reqs, self.should_abort, self.deadline, cfg.level_s)
            )
            results, wall, aborted, kept = res.requests, res.wall_s, res.aborted, None
        if aborted:
            raise Aborted(aborted)
        sample = Sample(load, results, wall, kept)
        _logger.info(
            "goodput: %s %g: %d requests, %d failed, in %.2fs%s",
            s.goodput_mode,
            load,
            len(results),
            sum(1 for r in results if not r.ok),
            wall,
            ""
            if kept is None or kept.ok is None
            else f"; completed {kept.achieved_req_s:.3g} of {kept.offered_req_s:.3g} req/s offered, "
            f"{'kept up' if kept.ok else 'fell behind'}",
        )
        return sample


# -- figures and the verdict -----------------------------------------------------------------------------------------
def figures(requests: Sequence[RequestResult]) -> dict[str, float]:
    """Per-request latency percentiles (``ttft_ms_p99``, ``tpot_ms_p95``...), means, and the error rate."""
    ok = [r for r in requests if r.ok]
    series = {
        "ttft_ms": [r.ttft_s * 1e3 for r in ok],
        "tpot_ms": [
            (r.e2e_s - r.ttft_s) * 1e3 / (r.output_tokens - 1) for r in ok if r.output_tokens > 1 and r.e2e_s > r.ttft_s
        ],
        "itl_ms": [g * 1e3 for r in ok for g in r.itl_s],
        "e2e_ms": [r.e2e_s * 1e3 for r in ok],
    }
    asked = sum(r.asked for r in requests)
    out = {
        "requests": float(len(requests)),
        "error_rate": (len(requests) - len(ok)) / len(requests) if requests else 1.0,
        "delivered": sum(r.output_tokens for r in ok if r.asked) / asked if asked else 1.0,
    }
    for name, vals in series.items():
        out[f"{name}_mean"] = loadgen._mean(vals)
        for q in (50, 90, 95, 99):
            out[f"{name}_p{q}"] = loadgen._pct(vals, q / 100)
    rates = [(r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in ok if r.output_tokens > 1 and r.e2e_s > r.ttft_s]
    out["tok_s_per_request"] = loadgen._mean(rates)
    return out


@dataclass
class Point:
    """Every measurement at one load, pooled."""

    load: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def requests(self) -> list[RequestResult]:
        return [r for s in self.samples for r in s.requests]

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.samples)

    @property
    def tok_s(self) -> float:
        return sum(r.output_tokens for r in self.requests if r.ok) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def req_s(self) -> float:
        return sum(1 for r in self.requests if r.ok) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def kept_up(self) -> bool | None:
        """False when any measurement here fell behind the arrivals, True when all that were judged kept up, None
        when none was judged (concurrency mode, or every measurement cut short by the SLO)."""
        verdicts = [s.kept.ok for s in self.samples if s.kept is not None and s.kept.ok is not None]
        return None if not verdicts else all(verdicts)

    def figures(self) -> dict[str, float]:
        """The pooled latency figures, and (rate mode) the offered and achieved request rates (means over the
        measurements judged), the requests left unfinished and ``kept_up`` (1/0)."""
        out = figures(self.requests)
        judged = [s.kept for s in self.samples if s.kept is not None and s.kept.judged]
        if judged:
            out["offered_req_s"] = sum(k.offered_req_s for k in judged) / len(judged)
            out["achieved_req_s"] = sum(k.achieved_req_s for k in judged) / len(judged)
            out["unfinished"] = float(sum(k.unfinished for k in judged))
            out["backlog"] = float(max(k.backlog for k in judged))
            out["kept_up"] = 1.0 if self.kept_up else 0.0
        return out


@dataclass
class Boundary:
    """What a boundary search found: the interval ``[low, high]`` (``None``: not found on that side) and every
    point measured. ``pruned`` names the incumbent's load this configuration missed."""

    mode: str
    slo: tuple[tuple[str, float], ...]
    points: dict[float, Point]
    low: float | None
    high: float | None
    measurements: int
    seconds: float
    pruned: str = ""
    stopped: str = ""
    """Why the search stopped before its bracket was narrow and confirmed (out of measurements or time)."""
    rules: Rules = field(default_factory=Rules)
    """What a load must serve to count besides the SLO (:func:`misses`)."""

    @property
    def feasible(self) -> bool:
        return self.low is not None

    @property
    def at(self) -> Point | None:
        """The point the goodput is read at: the boundary's low end, else the lowest load tried."""
        if self.low is not None:
            return self.points[self.low]
        return self.points[min(self.points)] if self.points else None

    def goodput_req_s(self) -> float:
        if self.low is None:
            return 0.0
        return self.low if self.mode == "rate" else self.points[self.low].req_s

    def goodput_tok_s(self) -> float:
        """Output tokens per second at the boundary: the rate times the mean output of a request (a short window's
        own tokens over its wall time would count the drain after the last arrival), or as measured in flight."""
        if self.low is None:
            return 0.0
        p = self.points[self.low]
        if self.mode != "rate":
            return p.tok_s
        ok = [r.output_tokens for r in p.requests if r.ok]
        return self.low * sum(ok) / len(ok) if ok else 0.0


def _verdicts(points: dict[float, Point], slo, rules: Rules) -> dict[float, list[str]]:
    return {load: misses(p.figures(), slo, rules) for load, p in points.items()}


def _bracket(verdicts: dict[float, list[str]]) -> tuple[float | None, float | None]:
    """``high``: the lowest load that missed; ``low``: the highest load below it that met (noise above a miss is
    ignored until the miss itself is measured again)."""
    high = min((load for load, why in verdicts.items() if why), default=None)
    low = max((load for load, why in verdicts.items() if not why and (high is None or load < high)), default=None)
    return low, high


def find_boundary(
    measure: Callable[[float], Sample],
    slo: Sequence[tuple[str, float]],
    s: GoodputSettings,
    incumbent: float | None = None,
) -> Boundary:
    """Bracket, bisect and confirm the highest load meeting ``slo`` (see the module's docstring)."""
    integer = s.goodput_mode == "concurrency"
    slo = tuple(slo)
    rules = Rules.of(s)
    points: dict[float, Point] = {}
    t0 = time.time()
    lo_load = max(1, math.ceil(s.goodput_min)) if integer else s.goodput_min
    hi_load = max(1, int(s.goodput_max)) if integer else s.goodput_max

    def norm(x: float) -> float:
        x = min(hi_load, max(lo_load, x))
        return float(max(1, round(x))) if integer else float(f"{x:.4g}")

    def take(load: float) -> list[str]:
        sample = measure(load)
        points.setdefault(load, Point(load)).samples.append(sample)
        return misses(points[load].figures(), slo, rules)

    def result(low, high, pruned="", stopped="") -> Boundary:
        return Boundary(
            s.goodput_mode,
            slo,
            points,
            low,
            high,
            sum(len(p.samples) for p in points.values()),
            time.time() - t0,
            pruned=pruned,
            stopped=stopped,
            rules=rules,
        )

    if incumbent is not None and incumbent > 0:
        load = norm(incumbent)
        try:
            why = take(load)
        except Aborted as exc:
            return result(None, None, stopped=str(exc))
        if why:
            _logger.info(
                "goodput: misses the SLO at the incumbent's load %g (%s): cannot beat it", load, "; ".join(why)
            )
            return result(
                None,
                load,
                pruned=f"misses the SLO at the incumbent's boundary {load:g} "
                f"({'; '.join(why)}): it cannot beat the incumbent",
            )

    def narrow(low: float, high: float) -> bool:
        return high - low <= 1 if integer else high <= low * (1 + s.goodput_tolerance)

    while True:
        low, high = _bracket(_verdicts(points, slo, rules))
        if not points:
            nxt = norm(s.goodput_start)
        elif high is None:
            if low >= hi_load:
                return result(low, None)
            nxt = norm(low * 2)
        elif low is None:
            if high <= lo_load:
                return result(None, high)
            nxt = norm(high / 2)
        elif not narrow(low, high):
            nxt = norm((low + high) // 2 if integer else math.sqrt(low * high))
        elif len(points[low].samples) < s.goodput_repeats:
            nxt = low
        elif len(points[high].samples) < s.goodput_repeats:
            nxt = high
        else:
            return result(low, high)
        if sum(len(p.samples) for p in points.values()) >= s.goodput_max_measurements:
            return result(
                low,
                high,
                stopped=f"stopped after {s.goodput_max_measurements} measurements (setting goodput_max_measurements)",
            )
        try:
            take(nxt)
        except Aborted as exc:
            return result(low, high, stopped=str(exc))


# -- its cost ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What one boundary search may take, at most (before ``goodput_max_measurements`` caps it)."""

    bracket: int
    bisect: int
    confirm: int
    measurements: int
    measurement_s: float
    """The least one measurement takes: its window, or ``goodput_min_requests`` arrivals at the start rate."""

    @property
    def seconds(self) -> float:
        return self.measurements * self.measurement_s

    def line(self) -> str:
        return (
            f"up to {self.measurements} measurements (bracket {self.bracket}, bisect {self.bisect}, ends "
            f"re-measured {self.confirm}; one when a trial misses the incumbent's boundary) of at least "
            f"{self.measurement_s:.1f} s each: {self.seconds:.0f} s a trial besides start-up and teardown"
        )


def plan(s: GoodputSettings) -> Plan:
    """The boundary search's cost for the dry-run: doubling (or halving) from the start to the far end of the range,
    bisecting a factor-2 bracket down to the tolerance, and re-measuring both ends ``repeats - 1`` times."""
    if s.goodput_mode == "concurrency":
        up = math.ceil(math.log2(max(1.0, s.goodput_max / s.goodput_start)))
        down = math.ceil(math.log2(max(1.0, s.goodput_start / max(1.0, s.goodput_min))))
        bisect = math.ceil(math.log2(max(1.0, s.goodput_max / 2)))
        each = s.goodput_window_s
    else:
        up = math.ceil(math.log2(max(1.0, s.goodput_max / s.goodput_start)))
        down = math.ceil(math.log2(max(1.0, s.goodput_start / s.goodput_min)))
        bisect = math.ceil(math.log2(math.log(2) / math.log(1 + s.goodput_tolerance)))
        each = max(s.goodput_window_s, s.goodput_min_requests / s.goodput_start)
    bracket = 1 + max(up, down)
    confirm = 2 * (s.goodput_repeats - 1)
    total = min(s.goodput_max_measurements, bracket + bisect + confirm)
    return Plan(bracket, bisect, confirm, total, each)


# -- verify -------------------------------------------------------------------------------------------------------
def closeness(
    figs: dict[str, float], slo: Sequence[tuple[str, float]], searched: dict[str, float] | None = None
) -> str:
    """How close each figure stands to its limit: ``ttft_ms_p95 153.6 = 77% of 200 (the search: 88.2)``."""
    parts = []
    for name, limit in slo:
        v = figs.get(name, math.nan)
        was = (searched or {}).get(name)
        parts.append(
            (f"{name} > {limit:g} (cut short)" if math.isinf(v) else f"{name} {v:.1f} = {v / limit:.0%} of {limit:g}")
            + (f" (the search: {was:.1f})" if was is not None else "")
        )
    return "; ".join(parts)


def verify_load(measure: Measurer, rec: dict, shortfall: float = 0.0) -> tuple[bool, Boundary | None, str]:
    """Measure the recorded boundary load, less the allowed ``shortfall`` (verify's tolerance: 0.15 measures at 85%
    of it), again (``goodput_repeats`` times, pooled): whether it still meets the SLO there, the boundary that makes
    (its rows give the goodput, 0 when missed), and the figures that decided. The boundary itself is the highest load
    that met the SLO, so measuring exactly there verifies a knife's edge: the noise decides."""
    slo = tuple((str(k), float(v)) for k, v in rec["slo"])
    measure.slo = slo
    load = rec.get("load")
    if not load:
        return False, None, "the recorded trial met the SLO at no load (infeasible): nothing to verify"
    at = float(load) * (1.0 - shortfall)
    point = Point(at)
    for _ in range(measure.settings.goodput_repeats):
        point.samples.append(measure(at))
    figs = point.figures()
    rules = Rules.of(measure.settings)
    why = misses(figs, slo, rules)
    b = Boundary(
        measure.settings.goodput_mode,
        slo,
        {point.load: point},
        None if why else point.load,
        point.load if why else None,
        len(point.samples),
        0.0,
        rules=rules,
    )
    near = closeness(figs, slo, rec.get("figures"))
    where = (
        f"{at:g} (the recorded boundary {load:g} less {shortfall:.0%})"
        if shortfall
        else f"the recorded boundary {load:g}"
    )
    pooled = (
        f"{len(point.samples)} measurements pooled ({len(point.requests)} requests), as the search confirmed "
        "its boundary"
    )
    text = (
        f"misses the SLO at {where}: {'; '.join(why)}; {near}; {pooled}"
        if why
        else f"meets the SLO at {where}: {near}; {pooled}"
    )
    return not why, b, text


# -- one trial ---------------------------------------------------------------------------------------------------
def incumbent_load(obj: Objective, gpus: int, s: GoodputSettings) -> float | None:
    """The load a trial must meet the SLO at to beat the incumbent: the incumbent's stored boundary
    (``s.incumbent_load``, its ``goodput_low``), scaled by this trial's GPUs over the incumbent's for a per-GPU
    objective. None (no check) without a stored boundary, in concurrency mode, or with the check off."""
    if not s.incumbent_load or s.incumbent_load <= 0 or not s.goodput_incumbent_check or s.goodput_mode != "rate":
        return None
    load = float(s.incumbent_load)
    if obj.metric.endswith("_per_gpu"):
        load *= max(1, gpus) / max(1.0, float(s.incumbent_gpus or 1.0))
    return load


def stored_incumbent(rows: dict[tuple[str, str], float]) -> dict[str, float]:
    """The settings :func:`incumbent_load` reads, from the incumbent trial's stored ``rows`` (``(metric, level) ->
    value``): its boundary and its GPUs; none when it met the SLO at no load."""
    low = rows.get(("goodput_low", LEVEL))
    if low is None or low <= 0:
        return {}
    return {"incumbent_load": low, "incumbent_gpus": rows.get(("gpus", LEVEL), 1.0)}


def boundary_rows(b: Boundary, gpus: int) -> list[MetricRow]:
    """The goodput, its interval, the search's cost, the SLO's figures at the boundary (the constraints' level) and
    every load measured."""
    unit = "req/s" if b.mode == "rate" else "concurrency"
    per = max(1, gpus)
    rows = [
        MetricRow("goodput_req_s", LEVEL, b.goodput_req_s(), "req/s"),
        MetricRow("goodput_tok_s", LEVEL, b.goodput_tok_s(), "tok/s"),
        MetricRow("goodput_req_s_per_gpu", LEVEL, b.goodput_req_s() / per, "req/s"),
        MetricRow("goodput_tok_s_per_gpu", LEVEL, b.goodput_tok_s() / per, "tok/s"),
        MetricRow("goodput_feasible", LEVEL, 1.0 if b.feasible else 0.0, "flag"),
        MetricRow("goodput_measurements", LEVEL, float(b.measurements), "count"),
        MetricRow("goodput_search_s", LEVEL, b.seconds, "s"),
        MetricRow("gpus", LEVEL, float(gpus), "count"),
    ]
    if b.low is not None:
        rows.append(MetricRow("goodput_low", LEVEL, b.low, unit))
    if b.high is not None:
        rows.append(MetricRow("goodput_high", LEVEL, b.high, unit))
    at = b.at
    if at is not None:
        figs = at.figures()
        for name, _ in b.slo:
            rows.append(MetricRow(name, SLO_LEVEL, figs.get(name, math.nan), "ms"))
        rows.append(MetricRow("tok_s_per_request", SLO_LEVEL, figs["tok_s_per_request"], "tok/s"))
    prefix = "r" if b.mode == "rate" else "c"
    for load in sorted(b.points):
        p = b.points[load]
        figs = p.figures()
        level = f"{prefix}={load:g}"
        meets = not misses(figs, b.slo, b.rules)
        rows += [
            MetricRow("tok_s", level, point_tok_s(b.mode, p, meets), "tok/s"),
            MetricRow("req_s", level, p.req_s, "req/s"),
            MetricRow("measurements", level, float(len(p.samples)), "count"),
            MetricRow("meets_slo", level, 1.0 if meets else 0.0, "flag"),
        ]
        stored = {
            "ttft_ms_p99",
            "ttft_ms_p95",
            "tpot_ms_p99",
            "tpot_ms_p95",
            "itl_ms_p99",
            "error_rate",
            "delivered",
            "requests",
            "tok_s_per_request",
        } | {name for name, _ in b.slo}
        rows += [
            MetricRow(
                k,
                level,
                v,
                "tok/s"
                if k == "tok_s_per_request"
                else "fraction"
                if k in ("error_rate", "delivered")
                else "count"
                if k == "requests"
                else "ms",
            )
            for k, v in figs.items()
            if k in stored and not math.isnan(v)
        ]
        rows += [MetricRow(k, level, figs[k], unit) for k, unit in KEEPUP_UNITS.items() if k in figs]
    return [r for r in rows if math.isfinite(r.value)]  # a cut request's infinite latency is never stored


KEEPUP_UNITS = {
    "kept_up": "flag",
    "offered_req_s": "req/s",
    "achieved_req_s": "req/s",
    "unfinished": "count",
    "backlog": "count",
}
"""The rows of whether the server kept up at one load (rate mode; none when no measurement there was judged)."""


def point_tok_s(mode: str, p: Point, meets: bool) -> float:
    """Output tok/s at one load: at a rate the server kept up with (it met the SLO), the rate times the mean output;
    else (and in flight) as measured over the window and its drain."""
    ok = [r.output_tokens for r in p.requests if r.ok]
    if mode == "rate" and meets and ok:
        return p.load * sum(ok) / len(ok)
    return p.tok_s


def describe(b: Boundary) -> str:
    """One line: the goodput and its interval, or why there is none; and the loads the server fell behind at."""
    unit = "req/s" if b.mode == "rate" else "in flight"
    if b.pruned:
        return b.pruned
    behind = sorted(load for load, p in b.points.items() if p.kept_up is False)
    if behind:
        return _describe(b, unit) + f"; the server fell behind at {', '.join(f'{x:g}' for x in behind)} {unit}"
    return _describe(b, unit)


def _describe(b: Boundary, unit: str) -> str:
    if b.low is None:
        at = b.at
        why = "; ".join(misses(at.figures(), b.slo, b.rules)) if at else "nothing measured"
        text = f"infeasible: misses the SLO even at {at.load:g} {unit} ({why})" if at else f"infeasible: {why}"
        return text + (f"; {b.stopped}" if b.stopped else "")
    high = f"{b.high:g}" if b.high is not None else "above"
    text = (
        f"goodput {b.goodput_req_s():.3g} req/s, {b.goodput_tok_s():.4g} tok/s; boundary in [{b.low:g}, {high}] "
        f"{unit} after {b.measurements} measurements ({b.seconds:.1f} s)"
    )
    return text + (f"; {b.stopped}" if b.stopped else "")


def run_trial(
    measure: Measurer, obj: Objective, gpus: int, metrics: list[MetricRow], incumbent: float | None
) -> Measurement:
    """One goodput trial on a ready server: the boundary search, its rows, and the objective's value. An infeasible
    configuration is an ok trial worth 0 whose SLO constraints are violated (data, never a crash)."""
    measure.slo = tuple(obj.slo)
    b = find_boundary(measure, obj.slo, measure.settings, incumbent=incumbent)
    rows = metrics + boundary_rows(b, gpus)
    if b.pruned:
        return Measurement(Outcome.PRUNED, reason=b.pruned, metrics=rows)
    if b.stopped and not b.points:
        return Measurement(Outcome.TIMEOUT, reason=b.stopped, metrics=rows)
    value = next(r.value for r in rows if r.metric == obj.metric and r.level == LEVEL)
    return Measurement(Outcome.OK, value=value, metrics=rows, reason=describe(b), by_level={})
