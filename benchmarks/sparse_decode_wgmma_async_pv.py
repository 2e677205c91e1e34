"""The wgmma sparse decode's warp-specialised consumers with each tile's O += P V left in flight (issue 20).

In the WS and SPLIT_WG schedules a compute warpgroup used to wait for each tile's O += P V product before it
released the tile's ring slot and waited for its next tile; with ``ASYNC_PV`` the product is left in flight, the
next tile's scores' product is issued behind it (wgmma runs a warpgroup's products in order, so the tensor cores go
from one to the next without a wait and an issue between them), and both are waited for together
(``kernels.sparse_decode_wgmma._wg_tile_async`` / ``_ws_tile_async``). This benchmark times each config both ways,
one after another in one process, and the previous way a second time after the new one (the run's noise), each way
checked first against the float32 reference (timed and ragged inputs) into a NaN-poisoned output:

* ``wait``: ``_async_pv=False``, the consumers as before;
* ``async``: ``_async_pv=True``;
* ``wait_again``: ``_async_pv=False`` once more.

Configs: at each batch the default (``default_config``) and the H200's shipped tuned config where either is
warp-specialised, and a few warp-specialised neighbours at batches 16 and 64 (the other schedule, the other tile
size); with an fp8 cache (``--fp8``) the same made fit for fp8 (``fit_dtype``). Times: ``kernels.bench.do_bench``
medians of CUDA-graph replays, L2 flushed before each, 4 input sets rotating.

    python3 benchmarks/sparse_decode_wgmma_async_pv.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_async_pv.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)]

BATCHES = (1, 2, 4, 8, 16, 32, 64)
WAYS = {"wait": {"_async_pv": False}, "async": {"_async_pv": True}, "wait_again": {"_async_pv": False}}
FP8 = "float8_e4m3fn"
# warp-specialised neighbours of the defaults: the other schedule and the other tile size at the same programs
NEIGHBOURS = {
    16: [{"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1},
         {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 0},
         {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 4, "WS": 1, "SPLIT_WG": 0}],
    64: [{"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 0, "STORE_CVT": 1},
         {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 0, "STORE_CVT": 1}],
}


def warp_specialised(config: dict) -> bool:
    """Whether ``config`` runs the consumers ``ASYNC_PV`` changes (WS or SPLIT_WG; SEESAW has its own loop)."""
    return bool(config.get("WS") or config.get("SPLIT_WG")) and not config.get("SEESAW")


def configs(batch: int, dtype: str, tuned: dict | None) -> list[tuple[str, dict]]:
    """(name, full config) of every warp-specialised config timed at ``batch``: the default, the tuned one, the
    neighbours; made fit for an fp8 cache where ``dtype`` is one (:meth:`SparseDecodeWgmmaKernel.fit_dtype`),
    each config once."""
    from kernels.sparse_decode_wgmma import DEFAULT_CONFIG, SparseDecodeWgmmaKernel, default_config

    kernel = SparseDecodeWgmmaKernel.instance
    shape = {"batch": batch, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    named = [("default", default_config(batch, 640))] + ([("tuned", tuned)] if tuned else [])
    named += [(f"neighbour {k + 1}", {**DEFAULT_CONFIG, **c}) for k, c in enumerate(NEIGHBOURS.get(batch, []))]
    out, seen = [], []
    for name, config in named:
        config = kernel.fit_dtype({**DEFAULT_CONFIG, **config}, shape, dtype) if dtype == FP8 else config
        if warp_specialised(config) and config not in seen:
            seen.append(config)
            out.append((name, config))
    return out


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.kernels import checked_time, run_meta
    from kernels.base import device_limits
    from kernels.configs import tuned_config
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    wg = get_kernel("sparse_decode_wgmma")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms, sms=device_limits("cuda")["sms"])
    rows = []
    for dtype in ("bfloat16",) + ((FP8,) if args.fp8 else ()):
        for batch in BATCHES:
            shape = dict(base, batch=batch)
            tuned = tuned_config(wg, shape, getattr(torch, dtype), "cuda")
            named = configs(batch, dtype, tuned)
            if not named:
                continue
            sets = [kernel.make_inputs(shape, dtype, "cuda", seed=1 + k) for k in range(4)]
            ragged = kernel.make_inputs(dict(shape, ragged=1), dtype, "cuda", seed=99)
            for name, config in named:
                row = {"dtype": dtype, "batch": batch, "name": name, "config": config}
                for way, opts in WAYS.items():
                    def run(i, out, config=config, opts=opts):
                        return sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out,
                                                   kv_scale=i.get("kv_scale"), **opts)

                    got = checked_time(kernel, run, sets, (sets[0], ragged), args.rep_ms, dtype)
                    row[f"{way}_err"] = got["err"]
                    if "us" in got:
                        row[f"{way}_us"] = got["us"]
                    print(f"{dtype} batch {batch} {name} {way} {row.get(f'{way}_us', 'wrong_result')}", flush=True)
                rows.append(row)
            del sets, ragged
            torch.cuda.empty_cache()
    return {"meta": meta, "rows": rows}


def gain(row: dict) -> float | None:
    """The previous way's time (the mean of its two timings) over the new way's: above 1, ``ASYNC_PV`` pays."""
    us = [row.get(f"{w}_us") for w in WAYS]
    if not all(us):
        return None
    return (us[0] + us[2]) / 2 / us[1]


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = ["# Sparse decode (wgmma kernel): each tile's O += P V left in flight (ASYNC_PV) against waited for", "",
             *provenance(meta, "sparse_decode_wgmma_async_pv.py", source),
             "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536); µs: median of CUDA-graph "
             "replays, L2 flushed before each, 4 input sets rotating; each way checked against the float32 "
             "reference first (timed and ragged inputs)",
             "- wait: the consumers wait for each tile's O += P V (before); async: it is left in flight behind the "
             "next tile's scores' product; wait again: the first way timed once more after the second (the run's "
             "noise); gain = mean of the two waits / async",
             "", "| cache | batch | config | name | wait µs | async µs | wait again µs | gain | rel. error (worst) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        cells = [f"{r[f'{w}_us']:.1f}" if r.get(f"{w}_us") else "wrong_result" for w in WAYS]
        g = gain(r)
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items() if v or k in ("S", "BLOCK_T", "STAGES", "V_SPLIT"))
        err = max(r[f"{w}_err"] for w in WAYS)
        lines.append(f"| {r['dtype']} | {r['batch']} | {cfg} | {r['name']} | " + " | ".join(cells)
                     + f" | {f'{g:.3f}x' if g else '-'} | {err:.5f} |")
    for dtype in dict.fromkeys(r["dtype"] for r in data["rows"]):
        gains = [g for r in data["rows"] if r["dtype"] == dtype and (g := gain(r))]
        defaults = [g for r in data["rows"] if r["dtype"] == dtype and r["name"] == "default" and (g := gain(r))]
        noise = [abs(r["wait_again_us"] / r["wait_us"] - 1) for r in data["rows"]
                 if r["dtype"] == dtype and r.get("wait_us") and r.get("wait_again_us")]
        if gains:
            lines += ["", f"{dtype}: gain over {len(gains)} configs: median {statistics.median(gains):.3f}x, "
                      f"min {min(gains):.3f}x, max {max(gains):.3f}x"
                      + (f"; at the defaults median {statistics.median(defaults):.3f}x" if defaults else "")
                      + (f"; the two waits differ by {100 * statistics.median(noise):.1f}% (median), "
                         f"{100 * max(noise):.1f}% (most)" if noise else "")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)
        ap.add_argument("--fp8", action="store_true", help="also an fp8 e4m3 cache with row scales")

    return run(argv, __doc__, ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_async_pv_h200.md", report,
               measure, extra)


if __name__ == "__main__":
    sys.exit(main())
