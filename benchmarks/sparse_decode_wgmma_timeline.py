"""Where the wgmma sparse decode's fixed time goes: each program's clock at each phase (issue 20).

At batch 64 the warp-specialised default takes about 9.4 µs however few rows it walks plus 0.86 µs a 32-row tile
(``sparse_decode_wgmma_locality_h200_48454a2.md``), and at batch 16 the default walks two or three tiles a program
in 16.5 µs. This benchmark reads where that time goes inside the programs: ``sparse_decode_wgmma(...,
_probe="timeline", _stamps=...)`` is the same build with each partition storing the SM's cycle counter as it passes
each phase (``kernels.sparse_decode_wgmma.TIMELINE_STAMPS``: start, the producer's q copies issued and index table
written, each consumer's q landed, first tile landed, last products done, result or hand-over written), the GPU's
nanosecond timer at each program's start and end, and its SM. Per config:

* the timeline build checked against the float32 reference (timed and ragged inputs, NaN-poisoned output), and timed
  beside the plain build (``kernels.bench.do_bench``: median of CUDA-graph replays, L2 flushed before each, 4 input
  sets rotating; the split kernel and, with splits, the merge);
* ``--runs`` eager launches of the timeline build, each after an L2 flush, all of their stamps stored; the report
  gives medians over programs and runs of each phase (cycles, and µs at the SM clock the stamps themselves show:
  cycles over timer nanoseconds from each program's start to its end), the spread of the programs' starts, and the
  span from the first start to the last end against the timed kernel;
* in the run at 88b8d14 (``sparse_decode_wgmma_timeline_h200_88b8d14.md``), where the producer asked for the
  split's row numbers before it issued q's copies, that build's previous order (``_probe="q_first"``, q's copies
  first, as now) was timed beside it, and the report states it where a stored run has it;
* an empty kernel timed the same way (one program storing one value: what any launch costs in a graph replay).

    python3 benchmarks/sparse_decode_wgmma_timeline.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_timeline.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)]

CASES = ((16, 640), (32, 640), (64, 640), (64, 64))  # (batch, selected rows); each batch's default config at
# V4-Flash's 640 rows (at 64 rows: the batch-64 default walking two 32-row tiles, its fixed part alone)
# phases (name, from stamp, to stamp) read off each program's row; SPLIT_WG adds its second consumer's
PHASES = (("start to q issued (producer)", 1, 2), ("start to index table written (producer)", 1, 3),
          ("start to q landed (consumer 0)", 1, 5), ("start to first tile landed (consumer 0)", 1, 6),
          ("first tile landed to last products done (consumer 0)", 6, 7),
          ("last products done to result written (consumer 0)", 7, 8), ("start to result written", 1, 8))
PHASES_WG1 = (("start to first tile landed (consumer 1)", 1, 10),
              ("first tile landed to last products done (consumer 1)", 10, 11),
              ("last products done to hand-over written (consumer 1)", 11, 12),
              ("consumer 0's last products to consumer 1's hand-over written", 7, 12))


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.common import checked_ways, run_meta
    from kernels.base import device_limits
    from kernels.bench import flush_l2, measure_launch_us
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import STAMPS, default_config, sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms, sms=device_limits("cuda")["sms"], runs=args.runs,
                    empty_kernel_us=measure_launch_us(args.rep_ms).median_us)
    rows = []
    for batch, topk in CASES:
        shape = dict(base, batch=batch, topk=topk)
        config = default_config(batch, 640)
        sets = [kernel.make_inputs(shape, "bfloat16", "cuda", seed=1 + k) for k in range(4)]
        ragged = kernel.make_inputs(dict(shape, ragged=1), "bfloat16", "cuda", seed=99)
        stamps = torch.zeros(batch * 4096, STAMPS, dtype=torch.int64, device="cuda")
        row = {"batch": batch, "topk": topk, "config": config}
        checked_ways(kernel, {"plain": {}, "timeline": {"_probe": "timeline", "_stamps": stamps}},
                     lambda i, out, config=config, **opts: sparse_decode_wgmma(
                         i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out, **opts),
                     sets, (sets[0], ragged), args.rep_ms, row)
        out = kernel.output_like(sets[0])
        runs = []
        for r in range(args.runs + 2):  # two warm-up launches
            stamps.zero_()
            flush_l2()
            sparse_decode_wgmma(sets[r % 4]["q"], sets[r % 4]["kv"], sets[r % 4]["indices"], sets[r % 4]["sm_scale"],
                                config, out=out, _probe="timeline", _stamps=stamps)
            torch.cuda.synchronize()
            if r >= 2:
                runs.append(normalise(stamps[:int(stamps[:, 1].count_nonzero())].tolist()))
        row["stamps"] = runs
        print(f"batch {batch} topk {topk} {config} plain {row.get('plain_us')} timeline {row.get('timeline_us')} "
              f"programs {len(runs[0])}", flush=True)
        rows.append(row)
        del sets, ragged
        torch.cuda.empty_cache()
    return {"meta": meta, "rows": rows}


def normalise(run: list) -> list:
    """One launch's stamps as stored: each program's row with its timer stamps (0 and 13) in ns since the launch's
    first start, its clock stamps (1 to 12) in cycles since its own start (stamp 1, so 0), its SM (14) as is, and
    None for a stamp not reached (left 0 by the kernel)."""
    t0 = min(p[0] for p in run)
    return [[p[0] - t0] + [p[k] - p[1] if p[k] else None for k in range(1, 13)]
            + [p[13] - t0 if p[13] else None, p[14]] for p in run]


def clock_ghz(runs: list) -> float:
    """The SM clock the stamps show: each program's cycles over its timer nanoseconds from start to end (stamps 1 to
    8 against 0 to 13), the median over programs and runs."""
    return statistics.median(p[8] / (p[13] - p[0]) for run in runs for p in run
                             if p[13] is not None and p[8] is not None and p[13] > p[0])


def phase_us(runs: list, a: int, b: int, ghz: float) -> float | None:
    """The median over programs and runs of stamp ``b`` minus stamp ``a`` (cycles), in µs at ``ghz``."""
    d = [p[b] - p[a] for run in runs for p in run if p[a] is not None and p[b] is not None]
    return statistics.median(d) / ghz / 1000 if d else None


def spans(runs: list) -> tuple[float, float]:
    """(the spread of the programs' starts, the first start to the last end), µs, medians over runs."""
    return (statistics.median((max(p[0] for p in run) - min(p[0] for p in run)) / 1000 for run in runs),
            statistics.median((max(p[13] or 0 for p in run) - min(p[0] for p in run)) / 1000 for run in runs))


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = ["# Sparse decode (wgmma kernel): where each program's time goes (timeline probe)", "",
             *provenance(meta, "sparse_decode_wgmma_timeline.py", source),
             f"- V4-Flash shapes (64 heads, 512-wide K=V latent, of 65536 rows, bf16); each batch's default config at 640 selected rows; "
             f"timed: median of CUDA-graph replays, L2 flushed before each, 4 input sets rotating (the split kernel and "
             f"its merge); phases: medians over programs and {meta['runs']} eager launches (each after an L2 flush) of "
             "the timeline build's stamps, in µs at the SM clock the stamps show",
             f"- an empty kernel timed the same way: {meta['empty_kernel_us']:.1f} µs", ""]
    for r in data["rows"]:
        runs = r["stamps"]
        ghz = clock_ghz(runs)
        spread, span = spans(runs)
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        plain, probed, previous = r.get("plain_us"), r.get("timeline_us"), r.get("q_first_us")
        lines += [f"## batch {r['batch']}, {r['topk']} selected rows: {cfg}", "",
                  f"- timed: plain build {plain:.1f} µs, timeline build {probed:.1f} µs ({probed / plain:.3f}x); "
                  f"relative error {max(r['plain_err'], r['timeline_err'], r.get('q_first_err', 0)):.5f}"
                  + (f"; the producer's previous order (q's copies issued before it asks for the row numbers, "
                     f"``_probe=\"q_first\"``) {previous:.1f} µs, {previous / plain:.3f}x the plain build" if previous else "")
                  if plain and probed else "- timed: wrong result",
                  f"- {len(runs[0])} programs; SM clock {ghz:.2f} GHz; the programs' starts spread over {spread:.2f} "
                  f"µs; first start to last end {span:.2f} µs (eager launch, the split kernel only)", "",
                  "| phase | µs |", "| --- | --- |"]
        phases = PHASES + (PHASES_WG1 if r["config"].get("SPLIT_WG") else ())
        for name, a, b in phases:
            us = phase_us(runs, a, b, ghz)
            lines.append(f"| {name} | {us:.2f} |" if us is not None else f"| {name} | - |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)
        ap.add_argument("--runs", type=int, default=10, help="eager launches whose stamps are stored")

    return run(argv, __doc__, ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_timeline_h200.md", report,
               measure, extra)


if __name__ == "__main__":
    sys.exit(main())
