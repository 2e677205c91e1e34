"""Where the wgmma sparse decode's time goes: the same configs on gathers that leave DRAM less (issue 20).

The kernel at the V4-Flash shapes (64 heads, a 512-wide K=V latent, 640 selected rows, bf16 cache) is timed on three
index patterns, one after another in one process, each checked first against the float32 reference into a
NaN-poisoned output:

* ``spread``: each request its own 640 distinct rows of 65536 (what the benchmarks time; every row from DRAM);
* ``shared``: every request the same 640 rows (one request's rows leave DRAM, the batch's other reads hit L2);
* ``one_row``: every selected row the same row (the gathers hit L1/L2 at once: what is left is the kernel's own
  work, its products, softmax, synchronisation and stores).

If ``shared`` runs as ``spread`` does, DRAM is not what bounds the config. The batch-64 default is also timed at 64
to 640 selected rows (2 to 20 tiles), and a least-squares line splits its time into a fixed part and a part a tile. (``one_row`` turned out slower than
``spread``: 128 programs reading one 1 KB row hit the same L2 lines at once.)

At batch 64 and 16 the SEESAW schedule is timed beside the default (each tile's scores computed once, by alternate
compute warpgroups, each holding half of V's columns), and the report states default / SEESAW.

For the warp-specialised configs (WS, SPLIT_WG or SEESAW; SEESAW has no ``no_products`` build) two timing probes of
the same build on the ``spread`` inputs
(``sparse_decode_wgmma(..., _probe=...)``, their output is garbage and is not checked): ``no_copies``, the ring's
handshakes and every product without the rows' copies (what the compute warpgroups take when a gather costs nothing),
and ``no_products``, the gathers and handshakes without the products (what the producer takes when computing costs
nothing). Their sum against the full time says how much of the two overlaps. Times: ``kernels.bench.do_bench`` medians of
CUDA-graph replays, L2 flushed before each (by reading a clean 256 MB buffer), 4 input sets rotating.

    python3 benchmarks/sparse_decode_wgmma_locality.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_locality.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)]

PATTERNS = ("spread", "shared", "one_row")
TOPKS = (64, 128, 256, 384, 512, 640)  # the scaling run: 2 to 20 tiles of 32 rows, one split
PROBES = ("no_copies", "no_products")
PREVIOUS = "indices_ahead"  # the producer before its index table: each tile's indices loaded a tile ahead
# SPLIT_WG with a ring of 4, each consumer issuing its next tile's scores' product before this tile's softmax: timed
# at c63889b (sparse_decode_wgmma_locality_h200_c63889b.json), 0.84x the default, and removed; the report still
# shows its column where a stored run has it
TRIAL = "qk_ahead"


SEESAW = {"BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "WS": 1, "SPLIT_WG": 0, "SEESAW": 1, "STORE_CVT": 0, "MERGE": 0,
          "PART16": 0, "P_SMEM": 0}
SEESAW_SPLITS = {64: (2, 3), 16: (8, 5)}  # programs: 128 / 192 at batch 64, 112 / 80 at batch 16 (132 SMs)


def configs(batch: int) -> list[dict]:
    """The batch's default config, at batch 64 the previous default (64-row tiles, no SPLIT_WG) and one program
    a request (all of V's columns: no score computed twice), and at batch 64 and 16 the SEESAW schedule (each tile's
    scores computed once, by alternate warpgroups, each warpgroup half of V's columns) at two split counts."""
    from kernels.sparse_decode_wgmma import default_config

    base = default_config(batch, 640)
    out = [base]
    if batch == 64:
        prev = {**base, "SPLIT_WG": 0, "BLOCK_T": 64, "STAGES": 2}
        out += [prev, {**prev, "V_SPLIT": 1}]
    return out + [{**base, **SEESAW, "S": s} for s in SEESAW_SPLITS.get(batch, ())]


def with_pattern(inputs: dict, pattern: str) -> dict:
    """``inputs`` with its indices rewritten to ``pattern`` (the first request's rows for all, or one row)."""
    idx = inputs["indices"]
    if pattern == "shared":
        idx = idx[:1].expand_as(idx).contiguous()
    elif pattern == "one_row":
        idx = idx[:1, :1].expand_as(idx).contiguous()
    return {**inputs, "indices": idx}


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.common import _time, checked_time, run_meta
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms)

    def run(inputs, config, out, **opts):
        return sparse_decode_wgmma(inputs["q"], inputs["kv"], inputs["indices"], inputs["sm_scale"], config, out=out,
                                   **opts)

    def checked(config, sets, checks, **opts) -> dict:
        """The worst error against the float32 reference over ``checks`` (each into a NaN-poisoned output), then,
        within the tolerance, the median time over ``sets``."""
        return checked_time(kernel, lambda i, out: run(i, config, out, **opts), sets, checks, args.rep_ms)

    rows = []
    for batch in (64, 16, 1):
        shape = dict(base, batch=batch)
        plain = [kernel.make_inputs(shape, "bfloat16", "cuda", seed=1 + k) for k in range(4)]
        for config in configs(batch):
            for pattern in PATTERNS:
                sets = [with_pattern(s, pattern) for s in plain]
                rows.append({"batch": batch, "config": config, "pattern": pattern, **checked(config, sets, sets[:1])})
                print(f"batch {batch} {pattern} {rows[-1].get('us', rows[-1]['status'])}", flush=True)
            if not (config["WS"] or config["SPLIT_WG"] or config.get("SEESAW")):
                continue
            # the previous producer and consumers, checked on the timed inputs and on ragged ones
            ragged = kernel.make_inputs({**shape, "ragged": 1}, "bfloat16", "cuda", seed=99)
            rows.append({"batch": batch, "config": config, "pattern": "spread", "probe": PREVIOUS,
                         **checked(config, plain, [plain[0], ragged], _probe=PREVIOUS)})
            print(f"batch {batch} {PREVIOUS} {rows[-1].get('us', rows[-1]['status'])}", flush=True)
            outs = [kernel.output_like(s) for s in plain]
            for probe in PROBES:  # garbage output: timed only
                if probe == "no_products" and config.get("SEESAW"):  # not built: its consumers wait on each other
                    continue
                us = _time(lambda j, p=probe: run(plain[j], config, outs[j], _probe=p), list(range(len(plain))),
                           args.rep_ms).median_us
                rows.append({"batch": batch, "config": config, "pattern": "spread", "probe": probe, "status": "probe",
                             "us": us})
                print(f"batch {batch} {probe} {us}", flush=True)
        torch.cuda.empty_cache()
    # the batch-64 default at fewer selected rows (the same config, so the same schedule): time = fixed + tiles x
    # per-tile, what a program costs before and after its tiles against what each tile adds
    config = configs(64)[0]
    scaling = []
    for topk in TOPKS:
        sets = [kernel.make_inputs(dict(base, batch=64, topk=topk), "bfloat16", "cuda", seed=1 + k) for k in range(4)]
        scaling.append({"topk": topk, "config": config, **checked(config, sets, sets[:1])})
        print(f"batch 64 topk {topk} {scaling[-1].get('us', scaling[-1]['status'])}", flush=True)
    data = {"meta": meta, "rows": rows, "scaling": scaling}
    return data


def fit(scaling: list[dict]) -> tuple[float, float] | None:
    """Least-squares (fixed µs, µs a tile) of the scaling rows' times against their tiles of 32 rows."""
    pts = [(r["topk"] / 32, r["us"]) for r in scaling if r.get("us")]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - slope * mx, slope


def _cfg(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = ["# Sparse decode (wgmma kernel): the same configs on gathers that leave DRAM less", "",
             *provenance(meta, "sparse_decode_wgmma_locality.py", source),
             "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536, bf16); µs: median of "
             "CUDA-graph replays, L2 flushed before each, 4 input sets rotating; each checked against the float32 "
             "reference first",
             "- spread: each request its own rows (all from DRAM); shared: every request the first request's rows; "
             "one_row: every selected row the same row", "",
             "- no_copies / no_products (warp-specialised configs only, spread inputs): the same build without the "
             "rows' copies / without the products (timing probes, output not checked); overlap = (no_copies + "
             "no_products - spread) / min(no_copies, no_products): 1 when the shorter hides wholly under the longer, "
             "0 when they run one after the other", "",
             "- indices_ahead (warp-specialised configs only, spread inputs, checked like the rest): the producer as it "
             "was before its index table, each tile's row numbers loaded from global memory a tile ahead; its time / "
             "spread's is the table's gain, measured side by side",
             "- qk_ahead (SPLIT_WG with a ring of four; checked on the timed and on ragged inputs; tried at c63889b "
             "and removed): each consumer warpgroup issued its next tile's scores' product before this tile's "
             "softmax; spread / qk_ahead is its gain", "",
             "| batch | config | spread µs | shared µs | one_row µs | spread / shared | spread / one_row | no_copies µs "
             "| no_products µs | overlap | indices_ahead µs | indices_ahead / spread | qk_ahead µs | spread / qk_ahead |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keyed: dict = {}
    for r in data["rows"]:
        keyed.setdefault((r["batch"], _cfg(r["config"])), {})[r.get("probe") or r["pattern"]] = r
    for (batch, cfg), by in keyed.items():
        us = {p: by[p].get("us") if p in by else None for p in PATTERNS + PROBES + (PREVIOUS, TRIAL)}
        cells = [f"{us[p]:.1f}" if us[p] else (by[p]["status"] if p in by else "-") for p in PATTERNS]
        ratios = [f"{us['spread'] / us[p]:.2f}x" if us["spread"] and us[p] else "-" for p in ("shared", "one_row")]
        probes = [f"{us[p]:.1f}" if us[p] else "-" for p in PROBES]
        a, b, full = us["no_copies"], us["no_products"], us["spread"]
        overlap = f"{(a + b - full) / min(a, b):.2f}" if a and b and full else "-"
        prev = [f"{us[PREVIOUS]:.1f}" if us[PREVIOUS] else (by[PREVIOUS]["status"] if PREVIOUS in by else "-"),
                f"{us[PREVIOUS] / full:.2f}x" if us[PREVIOUS] and full else "-",
                f"{us[TRIAL]:.1f}" if us[TRIAL] else (by[TRIAL]["status"] if TRIAL in by else "-"),
                f"{full / us[TRIAL]:.2f}x" if us[TRIAL] and full else "-"]
        lines.append(f"| {batch} | {cfg} | " + " | ".join(cells + ratios + probes + [overlap] + prev) + " |")
    seesaw = [(b, c, by) for (b, c), by in keyed.items()
              if by.get("spread", {}).get("us") and by["spread"]["config"].get("SEESAW")]
    if seesaw:
        lines += ["", "SEESAW against the batch's default (the first config of its batch above), spread inputs, same run:",
                  ""]
        for batch, cfg, by in seesaw:
            first = next(v for (b, _), v in keyed.items() if b == batch)
            if first.get("spread", {}).get("us"):
                lines.append(f"- batch {batch}, {cfg}: {by['spread']['us']:.1f} µs against {first['spread']['us']:.1f} "
                             f"(default / SEESAW {first['spread']['us'] / by['spread']['us']:.2f}x)")
    if data.get("scaling"):
        cfg = _cfg(data["scaling"][0]["config"])
        lines += ["", f"The batch-64 default ({cfg}) at fewer selected rows (the same config, one split; 32-row tiles, "
                  "half of them each compute warpgroup's):", "", "| selected rows | tiles | µs | rel. error |",
                  "| --- | --- | --- | --- |"]
        for r in data["scaling"]:
            us = f"{r['us']:.1f}" if r.get("us") else r["status"]
            lines.append(f"| {r['topk']} | {r['topk'] // 32} | {us} | {r['err']:.5f} |")
        line = fit(data["scaling"])
        if line:
            lines += ["", f"Least-squares line: {line[0]:.1f} µs fixed (launch, q, the first gathers, the hand-over and "
                      f"the stores) + {line[1]:.2f} µs a tile of 32 rows."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)

    return run(argv, __doc__, ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_locality_h200.md", report,
               measure, extra)


if __name__ == "__main__":
    sys.exit(main())
