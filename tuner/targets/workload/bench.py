"""Measure the decode workload: tok/s at each concurrency level, step latency, peak memory, graph capture cost."""

from __future__ import annotations

import logging
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from search_spaces.buckets import bucket_for, expand_buckets
from storage.types import MetricRow
from tuner.targets.workload.model import DecodeModel

_logger = logging.getLogger(__name__)


@dataclass
class LevelResult:
    concurrency: int
    batch: int
    """The batch actually run: the concurrency padded to its CUDA-graph bucket, or itself when eager."""
    graphed: bool
    step_s: float
    spread_s: float
    capture_s: float = 0.0
    graph_mem_mb: float = 0.0
    first_call_s: float = 0.0
    """Wall time of the level's first step (the first warm-up step, or the first before capture): what compiles."""

    @property
    def compile_s(self) -> float:
        """The first step's time beyond a steady step's: the kernels compiled (or loaded) for this level."""
        return max(0.0, self.first_call_s - self.step_s)

    @property
    def tok_s(self) -> float:
        return self.concurrency / self.step_s


@dataclass
class WorkloadResult:
    levels: list[LevelResult] = field(default_factory=list)
    peak_mem_mb: float = 0.0
    setup_s: float = 0.0
    wall_s: float = 0.0
    """Wall time of the whole measurement (every level: states, compile, capture, warm-up, timed steps)."""

    def phases(self) -> dict[str, float]:
        """Where :attr:`wall_s` went: ``compile`` (first steps beyond a steady step), ``capture`` (CUDA graphs, less
        their compile) and ``measure`` (the rest: inputs, warm-up and timed steps)."""
        compile_s = sum(lv.compile_s for lv in self.levels)
        capture_s = sum(max(0.0, lv.capture_s - lv.compile_s) for lv in self.levels if lv.graphed)
        return {"compile": compile_s, "capture": capture_s, "measure": max(0.0, self.wall_s - compile_s - capture_s)}

    def metrics(self) -> list[MetricRow]:
        rows = []
        for lv in self.levels:
            lvl = f"c={lv.concurrency}"
            rows += [
                MetricRow("tok_s", lvl, lv.tok_s, "tok/s"),
                MetricRow("step_ms", lvl, lv.step_s * 1e3, "ms"),
                MetricRow("step_spread_ms", lvl, lv.spread_s * 1e3, "ms"),
                MetricRow("batch", lvl, float(lv.batch), ""),
                MetricRow("graphed", lvl, float(lv.graphed), ""),
            ]
            if lv.graphed:
                rows += [
                    MetricRow("capture_s", lvl, lv.capture_s, "s"),
                    MetricRow("graph_mem_mb", lvl, lv.graph_mem_mb, "MiB"),
                ]
        rows += [MetricRow("peak_mem_mb", "", self.peak_mem_mb, "MiB"), MetricRow("setup_s", "", self.setup_s, "s")]
        return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[float, float, float]:
    """Median and interquartile spread of ``repeats`` calls after ``warmup`` untimed ones, and the wall time of the
    first warm-up call (0 without warm-up)."""
    first = 0.0
    for i in range(warmup):
        t0 = time.perf_counter()
        fn()
        if i == 0:
            _sync(device)
            first = time.perf_counter() - t0
    _sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        spread = q[2] - q[0]
    else:
        spread = max(times) - min(times)
    return med, spread, first


def measure(
    model: DecodeModel,
    levels: list[int],
    *,
    live_context: int = 512,
    warmup: int = 2,
    repeats: int = 5,
    buckets: str | None = None,
    deadline: float | None = None,
    report: Callable[[int, float], bool] | None = None,
) -> WorkloadResult:
    """Run the decode step at each concurrency level; CUDA graphs per ``buckets`` (``"pow2:64"``) on a GPU."""
    dev = model.device
    t0 = time.time()
    res = WorkloadResult()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sizes = expand_buckets(buckets) if (buckets and dev.type == "cuda") else []
    for i, c in enumerate(levels):
        if deadline is not None and time.time() > deadline:
            raise TimeoutError(f"deadline reached before concurrency {c}")
        bucket = bucket_for(c, sizes) if sizes else None
        batch = bucket or c
        st = model.state(batch, live_context)
        with torch.inference_mode():
            if bucket is None:
                step_s, spread, first = _time_steps(lambda st=st: model.step(st), dev, warmup, repeats)
                lv = LevelResult(c, batch, False, step_s, spread, first_call_s=first)
            else:
                graph, capture_s, mem_mb, first = _capture(model, st)
                step_s, spread, _ = _time_steps(graph.replay, dev, warmup, repeats)
                lv = LevelResult(c, batch, True, step_s, spread, capture_s, mem_mb, first)
                del graph
        del st
        res.levels.append(lv)
        _logger.info("c=%d batch=%d graphed=%s step=%.3f ms tok/s=%.1f", c, batch, lv.graphed, step_s * 1e3, lv.tok_s)
        if report is not None and report(i, lv.tok_s):
            break
    if dev.type == "cuda":
        res.peak_mem_mb = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        res.peak_mem_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res.wall_s = time.time() - t0
    res.setup_s = res.wall_s - sum(lv.step_s * repeats for lv in res.levels)
    return res


def _capture(model: DecodeModel, st: dict) -> tuple[torch.cuda.CUDAGraph, float, float, float]:
    """Capture one decode step as a CUDA graph; return it, the capture time, the memory it holds and the wall time of
    the first (compiling) step before capture."""
    dev = model.device
    t0 = time.time()
    before = torch.cuda.memory_allocated(dev)
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    first = 0.0
    with torch.cuda.stream(s):
        for i in range(2):
            model.step(st)
            if i == 0:
                torch.cuda.synchronize(dev)
                first = time.time() - t0
    torch.cuda.current_stream(dev).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.step(st)
    torch.cuda.synchronize(dev)
    return graph, time.time() - t0, (torch.cuda.memory_allocated(dev) - before) / 2**20, first
