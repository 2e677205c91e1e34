"""Timing that can be trusted.

* Warm-up (compilation, autotuning caches, allocator) happens before and outside timing.
* L2 is flushed before every timed call (or every graph replay) by reading a 256 MB buffer that is
  never written after it is filled: L2 ends up holding clean lines of that buffer, so the timed
  kernel neither hits its own data nor pays for writing back a flush's dirty lines (a write-based
  flush, ``buf.zero_()``, leaves up to 60 MB of dirty L2 lines whose write-back lands inside the
  timing of the next kernel). The flush is outside the events.
* Short calls (estimated under ``graph_below_us`` microseconds, 20 by default) and launch-bound calls (enqueueing
  them takes the CPU at least half as long as the GPU takes to run them: a wrapper of many small
  launches, such as the fused MoE at one token) are timed as CUDA-graph replays: one graph holds one
  call per input set of ``args_list`` (rotation), so launch gaps are those of decode-in-a-graph, the
  CPU's load does not leak into the time, and, after the flush, every call of a replay reads cold
  data as long as the input sets are distinct buffers. A call that synchronises (torch's sync debug
  mode says so) cannot be captured and is timed eagerly.
* Results are the median and the 20th/80th percentiles in microseconds.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import triton
import triton.language as tl

__all__ = [
    "Timing",
    "do_bench",
    "flush_l2",
    "measure_copy_bandwidth",
    "measure_launch_us",
    "measure_matmul_tflops",
    "wants_graph",
]

LAUNCH_BOUND = 0.5
"""A call whose CPU enqueue time is at least this fraction of its GPU time is launch-bound (timed as a graph)."""

logger = logging.getLogger(__name__)

_FLUSH: dict[str, torch.Tensor] = {}


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    n: int
    graph: bool

    @property
    def spread(self) -> float:
        """(p80 - p20) / median."""
        return (self.p80_us - self.p20_us) / self.median_us if self.median_us > 0 else math.inf


def _flush_buffer(device) -> torch.Tensor:
    key = str(device)
    if key not in _FLUSH:
        _FLUSH[key] = torch.ones(256 * 1024 * 1024 // 4, dtype=torch.int32, device=device)
    return _FLUSH[key]


def flush_l2(device="cuda") -> None:
    """Evict L2 by reading 256 MB of clean data (see the module docstring)."""
    torch.sum(_flush_buffer(device), dtype=torch.int64)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _timing(samples: list[float], graph: bool) -> Timing:
    return Timing(statistics.median(samples), _quantile(samples, 0.2), _quantile(samples, 0.8), len(samples), graph)


def do_bench(
    fn: Callable[..., Any],
    args_list: Sequence[Any] | None = None,
    *,
    rep_ms: float = 60.0,
    max_reps: int = 500,
    min_reps: int = 10,
    flush_l2: bool = True,
    cuda_graph: bool | None = None,
    graph_below_us: float = 20.0,
    device: Any = "cuda",
) -> Timing:
    """Time ``fn(args)`` for ``args`` cycling through ``args_list`` (or ``fn()`` when None).

    ``cuda_graph``: True/False forces the mode; None picks graphs for calls under ``graph_below_us`` and for
    launch-bound calls (:func:`wants_graph`) unless the call synchronises (then it is timed eagerly).
    """
    calls = [(lambda a=a: fn(a)) for a in args_list] if args_list else [fn]
    flush = _flush_buffer(device)
    # warm-up outside timing: compile, allocate, then estimate one call
    for call in calls:
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for i in range(5):
        calls[i % len(calls)]()
    enqueue_us = (time.perf_counter() - t0) * 1e6 / 5
    end.record()
    torch.cuda.synchronize()
    estimate_us = start.elapsed_time(end) * 1e3 / 5
    if cuda_graph is None:
        # a call that synchronises (.item(), a host copy) cannot be captured, and a failed capture can leave the
        # process's CUDA state broken (the RNG refuses to run afterwards): find out without trying
        use_graph = wants_graph(estimate_us, enqueue_us, graph_below_us) and not _synchronises(calls[0])
    else:
        use_graph = cuda_graph
    if use_graph:
        return _bench_graph(calls, flush, flush_l2, estimate_us, rep_ms, max_reps, min_reps)
    return _bench_eager(calls, flush, flush_l2, estimate_us, rep_ms, max_reps, min_reps)


def _synchronises(call: Callable[[], Any]) -> bool:
    """True when ``call`` makes a synchronising CUDA call (torch's sync debug mode raises on it)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # "a prototype feature": it misses some syncs, which then fail the capture
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()


def wants_graph(estimate_us: float, enqueue_us: float, graph_below_us: float = 20.0) -> bool:
    """Time as a CUDA-graph replay: a call under ``graph_below_us`` of GPU time, or a launch-bound one (its CPU
    enqueue time at least :data:`LAUNCH_BOUND` of its GPU time, so an eager timing measures the CPU)."""
    return estimate_us < graph_below_us or enqueue_us >= LAUNCH_BOUND * estimate_us


def _bench_graph(
    calls, flush, flush_l2: bool, estimate_us: float, rep_ms: float, max_reps: int, min_reps: int
) -> Timing:
    # one graph of one call per input set, replayed after a flush each time
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up on the capture stream
            call()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    per_replay_us = max(estimate_us * len(calls), 1.0) + 30.0  # flush ~60 µs not counted
    reps = int(min(max_reps, max(min_reps, rep_ms * 1e3 / per_replay_us)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    graph.replay()
    for s, e in events:
        if flush_l2:
            torch.sum(flush, dtype=torch.int64)
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 / len(calls) for s, e in events]
    return _timing(samples, True)


def _bench_eager(
    calls, flush, flush_l2: bool, estimate_us: float, rep_ms: float, max_reps: int, min_reps: int
) -> Timing:
    reps = int(min(max_reps, max(min_reps, rep_ms * 1e3 / max(estimate_us, 1.0))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(events):
        if flush_l2:
            torch.sum(flush, dtype=torch.int64)
        s.record()
        calls[i % len(calls)]()
        e.record()
    torch.cuda.synchronize()
    return _timing([s.elapsed_time(e) * 1e3 for s, e in events], False)


def measure_copy_bandwidth(nbytes: int = 2 * 1024**3, device: Any = "cuda") -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    timing = do_bench(
        lambda dst=dst, src=src: dst.copy_(src), flush_l2=False, cuda_graph=False, rep_ms=100, device=device
    )
    rate = 2 * n * 4 / (timing.median_us * 1e-6)
    logger.info("copy bandwidth %.2f TB/s (%s)", rate / 1e12, timing)
    del src, dst
    return rate


def measure_matmul_tflops(n: int = 8192, dtype: torch.dtype = torch.bfloat16, device: Any = "cuda") -> float:
    """Matrix-product rate in FLOP/s of an n×n×n product on random data through torch (cuBLAS)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timing = do_bench(lambda a=a, b=b: a @ b, flush_l2=False, cuda_graph=False, rep_ms=100, device=device)
    rate = 2 * n**3 / (timing.median_us * 1e-6)
    logger.info("matmul %s %.0f TFLOP/s (%s)", dtype, rate / 1e12, timing)
    del a, b
    return rate


@triton.jit
def _store_one(ptr):
    tl.store(ptr, 1.0)


def measure_launch_us(rep_ms: float = 50.0, device: Any = "cuda") -> Timing:
    """An empty kernel's time per call as :func:`do_bench` times small kernels: four launches of a one-program Triton
    kernel that stores one value, each on its own buffer, in one CUDA graph replayed after an L2 flush. What no
    kernel timed so can go below (launch, the graph's per-node gap, the flush's tail), beside a byte floor."""
    bufs = [torch.empty(1, device=device) for _ in range(4)]
    timing = do_bench(lambda b: _store_one[(1,)](b), bufs, rep_ms=rep_ms, cuda_graph=True, device=device)
    logger.info("empty kernel %.2f us per call (%s)", timing.median_us, timing)
    return timing
