"""Sparse decode variants against the kernel as it ships, side by side in one process on one GPU (issue 20).

Variants are launcher options of ``kernels.sparse_decode.sparse_decode`` that change how the work is done, not what
is computed:

* ``prefetch_next``: while a tile is computed, load the next tile's indices and ask L2 for its rows
  (``prefetch.global.L2``), so the next gather starts from L2.
  Measured 2026-11-30 at 5e448d4: slower (``benchmarks/results/sparse_decode_prefetch/h200/2026-11-30_5e448d4.md``); off by default.
* ``v_split=2`` / ``v_split=4``: each (request, head block, split) runs as 2 or 4 programs that compute the same
  scores from whole rows and accumulate a half or a quarter of V's 512 columns: a smaller accumulator (Nsight
  Compute read 255 registers and spills at batch 64, one 4-warp program per SM), twice or four times the programs,
  and no split-K partials for it (the float32 partials of S = 2 at batch 64 are 34 MB written and read again).
  Measured 2026-11-30 at c9272ae: slower but for an fp8 cache at batch 1
  (``benchmarks/results/sparse_decode_variants/h200/2026-11-30_c9272ae.md``); off by default.
* ``idx_ahead``: each tile's indices are loaded one iteration early, so the gather's address round trip overlaps the
  previous tile's products (the compiled loop had the next tile's index load, a plain ``ld.global``, right before
  its gather, after this tile's products).
* ``qk_ahead``: the next tile's gather and QK product are issued before this tile's softmax and PV product, so the
  asynchronous tensor-core work of one tile can overlap the vector work of the other (16-bit caches only).
* ``fused_combine``: the last split of a (request, head block) to finish merges the splits in the same launch (64
  columns at a time), instead of the merge kernel: no second launch and no wait for the whole grid, but one program
  per (request, head block) merges. ``fused_combine+idx_ahead``: both.

Each case (V4-Flash shapes: 64 heads, one 512-wide K=V latent, 640 rows; batch 1, 16, 64; bf16 and fp8 caches)
times its configs: the shipped tuned config, the default, the fastest of the exhaustive H200 sweep of the shipped
kernel (``tuner_efficiency_h200_issue20_sd2.json``: the 8 fastest and each head tile's fastest; batch 16 with an fp8
cache has no sweep and takes the fp8 lists of batch 1 and 64), and with ``--grid`` a small grid over S, BLOCK_H,
BLOCK_T and num_warps (a variant's best may sit elsewhere than the shipped kernel's). Every (config, variant) is
compiled ahead in helper processes (meta tensors, nothing launched), checked against the float32 reference into a
NaN-poisoned output, compared with the base output, then timed with ``kernels.bench.do_bench`` (CUDA-graph
replays, L2 flushed, 4 input sets rotating), the variants in rotating order; beside them the torch path and the
floor (bytes / the copy bandwidth measured in the same run).

    python3 benchmarks/sparse_decode_variants.py --json OUT.json --variants v_split=2,v_split=4 --grid  # on the GPU
    python3 benchmarks/sparse_decode_variants.py --report-from OUT.json --out REPORT.md             # on any machine
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)]

SWEEP = ROOT / "benchmarks" / "results" / "tuner_efficiency" / "h200" / "2026-11-30_6e5fadf_issue20_sd2.json.gz"
CASES = [("bfloat16", 1), ("bfloat16", 16), ("bfloat16", 64), ("float8_e4m3fn", 1), ("float8_e4m3fn", 16),
         ("float8_e4m3fn", 64)]
VARIANTS = {"base": {}, "prefetch_next": {"prefetch_next": True}, "v_split=2": {"v_split": 2},
            "v_split=4": {"v_split": 4}, "idx_ahead": {"idx_ahead": True}, "qk_ahead": {"qk_ahead": True},
            "fused_combine": {"fused_combine": True}, "fused_combine+idx_ahead": {"fused_combine": True, "idx_ahead": True}}
GOALS = {1: 9.0, 16: 12.0, 64: 17.0}  # issue 20, bf16 cache, µs
TOP = 8
GRID = {"S": [1, 2, 4], "BLOCK_H": [16, 32, 64], "BLOCK_T": [32, 64], "num_warps": [4, 8], "num_stages": [2]}
DTYPES = sorted({d for d, _ in CASES})


def _key(c: dict) -> str:
    return json.dumps(c, sort_keys=True)


def case_configs(dtype: str, batch: int, sweep: dict, shipped: dict, default: dict, grid: bool = False,
                 stages: tuple = (2,)) -> list[dict]:
    """The shipped config, the default, the sweep's fastest configs for this case, then the grid (see the doc)."""
    tables = [c for c in sweep["cases"] if c["dtype"] == dtype and c["shape"]["batch"] == batch]
    if not tables:
        tables = [c for c in sweep["cases"] if c["dtype"] == dtype]
    picked = [shipped, default]
    for table in tables:
        ok = sorted((r for r in table["rows"] if r["status"] == "ok" and r["config"]["num_warps"] in (4, 8)),
                    key=lambda r: r["time_us"])
        picked += [r["config"] for r in ok[:TOP]]
        for bh in (16, 32, 64):
            picked += [r["config"] for r in ok if r["config"]["BLOCK_H"] == bh][:1]
    if grid:
        picked += [dict(zip(GRID, values)) for values in itertools.product(*{**GRID, "num_stages": list(stages)}.values())]
    out, seen = [], set()
    for c in picked:
        if _key(c) not in seen:
            seen.add(_key(c))
            out.append(dict(c))
    return out


_META: dict = {}


def _compile(task: tuple) -> tuple:
    """In a helper: compile one (shape, dtype, config, options) from meta tensors; nothing is launched."""
    shape, dtype, config, options = task
    from kernels.compile_only import jit_compile_only, meta_inputs
    from kernels.registry import get_kernel
    from kernels.sparse_decode import sparse_decode

    key = (_key(shape), dtype)
    if key not in _META:
        _META.clear()
        _META[key] = meta_inputs(get_kernel("sparse_decode").make_inputs(shape, dtype, "cuda", 0))
    i = _META[key]
    t0 = time.perf_counter()
    try:
        with jit_compile_only():
            sparse_decode(i["q"], i["kv"], i["indices"], i["sm_scale"], config, d_v=i["d_v"], kv_scale=i["kv_scale"],
                          **options)
        return task, time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - the timing process runs it again and records the failure
        return task, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[:160]}"


def measure(variants: list[str], grid: bool, helpers: int, rep_ms: float, json_path: Path | None = None,
            dtypes: tuple = tuple(DTYPES), stages: tuple = (2,)) -> dict:
    """Compile, check and time every case (see the module doc); the JSON is rewritten after each case."""
    import multiprocessing as mp

    import torch
    import triton

    from benchmarks.common import _time
    from benchmarks.common import short_commit as _commit
    from kernels.base import classify_failure, rel_error
    from kernels.bench import measure_copy_bandwidth
    from kernels.configs import lookup
    from kernels.registry import get_kernel
    from kernels.sparse_decode import sparse_decode

    kernel = get_kernel("sparse_decode")
    from benchmarks.common import read_json

    sweep = read_json(SWEEP)
    base = kernel.shapes("v4flash")[0]
    names = ["base", *[v for v in variants if v != "base"]]
    plan = []
    for dtype, batch in [(d, b) for d, b in CASES if d in dtypes]:
        shape = dict(base, batch=batch)
        shipped = lookup("sparse_decode", shape, dtype, "cuda")
        configs = case_configs(dtype, batch, sweep, shipped, kernel.default_config(shape), grid and batch > 1, stages)
        configs = [c for c in configs if kernel.check_config(c, shape, None, dtype) is None]
        plan.append((dtype, shape, configs, shipped))
    t0 = time.time()
    tasks = [(shape, dtype, c, VARIANTS[v]) for dtype, shape, configs, _ in plan for c in configs for v in names]
    with mp.get_context("spawn").Pool(helpers) as pool:
        compiled = list(pool.imap_unordered(_compile, tasks))
    print(f"compiled {len(tasks)} (config, variant) pairs in {time.time() - t0:.0f} s on {helpers} processes "
          f"({sum(1 for *_, e in compiled if e)} failed in a helper)", flush=True)
    copy_tb_s = measure_copy_bandwidth() / 1e12  # bytes read + written per second

    def timed(fn, args) -> float:  # graph replays, eager where capture fails: as benchmarks/kernels.py times
        return _time(fn, args, rep_ms).median_us

    cases = []
    meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__,
            "commit": _commit(), "copy_tb_s": copy_tb_s,
            "compile_s": time.time() - t0, "rep_ms": rep_ms, "variants": names, "grid": grid,
            "grid_stages": list(stages)}
    for dtype, shape, configs, shipped in plan:
        sets = [kernel.make_inputs(shape, dtype, "cuda", seed=1 + k) for k in range(4)]
        outs = [kernel.output_like(s) for s in sets]
        ref = kernel.reference(sets[0])
        tol = kernel.tolerance(dtype)
        case = {"dtype": dtype, "shape": shape, "floor_us": kernel.cost(shape, dtype).bytes / (copy_tb_s * 1e6),
                "torch_us": timed(kernel.torch_baseline, sets), "shipped": shipped,
                "default": kernel.default_config(shape), "configs": []}
        for n, config in enumerate(configs):
            row = {"config": config, "us": {}, "err": {}, "max_diff": {}, "status": {}}
            base_out = None
            for v in names:
                try:
                    out = outs[0].fill_(float("nan"))
                    i = sets[0]
                    r = sparse_decode(i["q"], i["kv"], i["indices"], i["sm_scale"], config, d_v=i["d_v"],
                                      kv_scale=i["kv_scale"], out=out, **VARIANTS[v])
                    torch.cuda.synchronize()
                    row["err"][v] = rel_error(r, ref)
                    if base_out is None:
                        base_out = r.clone()
                    row["max_diff"][v] = float((r.float() - base_out.float()).abs().max())
                    row["status"][v] = "ok" if row["err"][v] <= tol else "wrong_result"
                except Exception as exc:  # noqa: BLE001 - a config that fails is data
                    row["status"][v] = classify_failure(exc)
                    row.setdefault("reason", {})[v] = f"{type(exc).__name__}: {str(exc)[:200]}"
            for k in range(len(names)):  # rotate which variant goes first
                v = names[(n + k) % len(names)]
                if row["status"][v] != "ok":
                    continue

                def fn(j, c=config, opts=VARIANTS[v], sets=sets, outs=outs):
                    i = sets[j]
                    return sparse_decode(i["q"], i["kv"], i["indices"], i["sm_scale"], c, d_v=i["d_v"],
                                         kv_scale=i["kv_scale"], out=outs[j], **opts)
                row["us"][v] = timed(fn, list(range(len(sets))))
            case["configs"].append(row)
        cases.append(case)
        print(f"{dtype} batch {shape['batch']}: " + ", ".join(
            f"{v} best {min((r['us'][v] for r in case['configs'] if v in r['us']), default=float('nan')):.1f} µs"
            for v in names) + f"; torch {case['torch_us']:.1f} µs", flush=True)
        torch.cuda.empty_cache()
        if json_path is not None:  # a run cut short keeps the cases it finished
            json_path.write_text(json.dumps({"meta": meta, "cases": cases}, indent=1))
    return {"meta": meta, "cases": cases}


def normalise(data: dict) -> dict:
    """The first run's JSON (5e448d4: ``us_off``/``us_on`` per config, prefetch only) in this script's format."""
    if data["meta"].get("variants"):
        return data
    data["meta"]["variants"] = ["base", "prefetch_next"]
    for case in data["cases"]:
        for r in case["configs"]:
            ok = r.get("status") == "ok"
            r["us"] = {"base": r.pop("us_off"), "prefetch_next": r.pop("us_on")} if ok else {}
            r["err"] = {"base": r.pop("err_off", None), "prefetch_next": r.pop("err_on", None)}
            r["max_diff"] = {"prefetch_next": 0.0 if r.pop("bit_identical", False) else None}
            r["status"] = {"base": r.get("status"), "prefetch_next": r.get("status")}
    return data


def _f(x, nd=1) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def _cfg(c: dict) -> str:
    return " ".join(f"{k}={c[k]}" for k in ("S", "BLOCK_H", "BLOCK_T", "num_warps", "num_stages"))


def _best(case: dict, v: str):
    rows = [r for r in case["configs"] if v in r["us"]]
    return min(rows, key=lambda r: r["us"][v]) if rows else None


def report(data: dict, source: str) -> str:
    from benchmarks.common import stored_path

    data = normalise(data)
    m, names = data["meta"], data["meta"]["variants"]
    others = [v for v in names if v != "base"]
    lines = [
        f"# Sparse decode: {', '.join(others)} against the kernel as it ships, side by side", "",
        f"- date: {m['date']}; GPU: {m['gpu']}; torch {m['torch']}, triton {m['triton']}; commit {m['commit']}",
        f"- generated by `benchmarks/sparse_decode_variants.py --report-from {stored_path(source)}` from the stored "
        f"results `{stored_path(source)}`",
        f"- V4-Flash shapes: 64 heads, d_qk = d_v = 512, 640 selected rows of 65536; floor = bytes / {m['copy_tb_s']:.2f} "
        "TB/s (copy bandwidth measured in the same run)",
        "- times: median µs of CUDA-graph replays, L2 flushed before each, 4 input sets rotating; every (config, "
        "variant) checked against the float32 reference first; base = the kernel's shipped path; the variants are "
        "described in the script's docstring",
        "- configs: the shipped tuned config, the default, the fastest configs of the exhaustive sweep of the shipped "
        "kernel (`tuner_efficiency_h200_issue20_sd2.json`)" + (", and a grid over S, BLOCK_H, BLOCK_T, num_warps at "
                                                               "batch 16 and 64" if m.get("grid") else "")
        + (f" (num_stages {', '.join(map(str, m['grid_stages']))})" if m.get("grid") and m.get("grid_stages") else ""), "",
        "| cache | batch | floor µs | torch µs | base shipped µs | base best µs | "
        + " | ".join(f"{v} best µs | base best / {v} best" for v in others)
        + " | fastest of all / floor | torch / fastest | goal (bf16) | fastest config |",
        "| --- | --- | --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in others) + " | --- | --- | --- | --- |"]
    for case in data["cases"]:
        shipped = next((r for r in case["configs"] if r["config"] == case["shipped"]), None)
        bests = {v: _best(case, v) for v in names}
        fastest = min(((r["us"][v], v, r) for v, r in bests.items() if r), default=None, key=lambda t: t[0])
        base = bests["base"]
        cells = [f"{_f(bests[v] and bests[v]['us'][v])} | "
                 + (f"{base['us']['base'] / bests[v]['us'][v]:.2f}x" if base and bests[v] else "—") for v in others]
        batch = case["shape"]["batch"]
        goal = "—"
        if case["dtype"] == "bfloat16" and fastest:
            g = GOALS[batch]
            goal = "met" if fastest[0] <= g else f"missed by {fastest[0] - g:.1f} µs (goal {g:g})"
        lines.append(
            f"| {case['dtype']} | {batch} | {_f(case['floor_us'], 2)} | {_f(case['torch_us'])} | "
            f"{_f(shipped and shipped['us'].get('base'))} | {_f(base and base['us']['base'])} | " + " | ".join(cells)
            + f" | {_f(fastest and fastest[0] / case['floor_us'])}x | {_f(fastest and case['torch_us'] / fastest[0])}x"
            f" | {goal} | {fastest and (fastest[1] + ': ' + _cfg(fastest[2]['config']))} |")
    lines += ["", "Every config (µs; a blank: not timed, the status says why):", "",
              "| cache | batch | config | " + " | ".join(names) + " | status |",
              "| --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for case in data["cases"]:
        for r in sorted(case["configs"], key=lambda r: min(r["us"].values(), default=1e9)):
            bad = {v: s for v, s in r["status"].items() if s != "ok"}
            lines.append(f"| {case['dtype']} | {case['shape']['batch']} | {_cfg(r['config'])} | "
                         + " | ".join(_f(r["us"].get(v)) if v in r["us"] else "" for v in names)
                         + f" | {'ok' if not bad else ', '.join(f'{v}: {s}' for v, s in bad.items())} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="measure on the GPU and write the results here")
    ap.add_argument("--report-from", type=Path, help="write the markdown report of a stored JSON")
    ap.add_argument("--out", type=Path, default=None, help="the report's path (default: benchmarks/results/"
                    "sparse_decode_variants_h200.md)")
    ap.add_argument("--variants", default="v_split=2,v_split=4", help=f"comma-separated, of {sorted(VARIANTS)}")
    ap.add_argument("--grid", action="store_true", help="also time the grid of configs at batch 16 and 64")
    ap.add_argument("--stages", default="2", help="the grid's num_stages values, comma-separated (default 2)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help=f"the caches to time, comma-separated, of {DTYPES}")
    ap.add_argument("--helpers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--rep-ms", type=float, default=30.0)
    args = ap.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / "sparse_decode_variants_h200.md"
    if args.report_from:
        out.write_text(report(json.loads(args.report_from.read_text()), str(args.report_from)))
        print(out.read_text())
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes or any(d not in DTYPES for d in dtypes):
        print(f"error: --dtypes {args.dtypes!r}: give some of {DTYPES}, comma-separated", file=sys.stderr)
        return 2
    try:
        stages = tuple(int(x) for x in args.stages.split(","))
    except ValueError:
        stages = ()
    if not stages or any(n not in (1, 2, 3, 4) for n in stages):
        print(f"error: --stages {args.stages!r}: give num_stages values from 1 to 4, comma-separated", file=sys.stderr)
        return 2
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not args.json:
        print(f"error: give --json OUT.json (measure, on a GPU) or --report-from FILE.json; --variants from "
              f"{sorted(VARIANTS)} (got unknown {unknown})", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: measuring needs a CUDA GPU; on a CPU use --report-from FILE.json", file=sys.stderr)
        return 2
    data = measure(variants, args.grid, args.helpers, args.rep_ms, args.json, dtypes, stages)
    args.json.write_text(json.dumps(data, indent=1))
    print(report(data, str(args.json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
