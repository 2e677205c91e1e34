"""How close can a decode GEMM get to its floor? The V4-Flash bf16 decode GEMMs side by side in one run, every time
measured as ``benchmarks/kernels.py`` measures (CUDA-graph replays of four rotated input sets, L2 flushed):

* read floor: a streaming Triton read of the same bytes (W and x), one 8 KiB block per program, summed to one value
  per program: what any kernel that reads those bytes once, in one launch, pays;
* an empty kernel (one program storing one value);
* the library (cuBLAS through torch) and ``kernels/gemm.py`` at its shipped tuned config;
* ``kernels/gemm.py`` with long K tiles outside its search space (BLOCK_K 512 / 1024: each program streams whole
  runs of W's rows);
* at M = 1, the split-K GEMV without tensor cores of ``kernels/gemv.py`` over its config space (the run recorded at
  1300f20, ``benchmarks/results/gemm_floor/h200/2026-11-30_1300f20.md``, timed this file's prototype of it, with a smaller space).

Every config is checked against the float32 reference on a NaN-poisoned output before it is timed.

    python benchmarks/gemm_floor.py --json gemm_floor.json          # on the GPU
    python benchmarks/gemm_floor.py --report-from gemm_floor.json --out benchmarks/results/gemm_floor/h200/2026-11-30_1300f20.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

READ_BLOCK = 4096  # elements of 2 bytes per program: 8 KiB


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(v.to(tl.float32), 0))


def _shapes():
    return [
        {"M": m, "N": n, "K": k}
        for (n, k) in ((1024, 4096), (4096, 1024), (2048, 4096), (4096, 2048))
        for m in (1, 16, 64)
    ]


def _long_k_configs(shape):
    from kernels.gemm import GemmKernel

    kernel = GemmKernel.instance
    bm = kernel.default_config(shape)["BLOCK_M"]
    out = []
    for bn, bk, stages, warps in itertools.product((16, 32), (512, 1024), (2, 3), (4, 8)):
        tiles = triton.cdiv(shape["M"], bm) * triton.cdiv(shape["N"], bn)
        for sk in (1, 2, 4, 8):
            if sk > 1 and tiles * sk > 2 * 132 or sk * bk > shape["K"]:
                continue
            cfg = {
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "BLOCK_K": bk,
                "SPLIT_K": sk,
                "GROUP_M": 1,
                "num_warps": warps,
                "num_stages": stages,
            }
            if kernel.check_config(cfg, shape, None, dtype="bf16") is None:  # the launcher refuses the rest
                out.append(cfg)
    return out


def _gemv_configs(shape):
    """``kernels/gemv.py``'s configs at one row: its whole space (those its rules pass)."""
    from kernels.gemv import GemvKernel

    return list(GemvKernel.instance.configs(shape, None, dtype="bf16")) if shape["M"] == 1 else []


def run(deadline_s: float, rep_ms: float) -> dict:
    from benchmarks.common import _time, git_commit
    from kernels.base import classify_failure, rel_error
    from kernels.bench import measure_copy_bandwidth, measure_launch_us
    from kernels.configs import lookup
    from kernels.gemm import GemmKernel, gemm, torch_linear
    from kernels.gemv import gemv

    start = time.time()
    kernel = GemmKernel.instance
    bw = measure_copy_bandwidth()
    launch = measure_launch_us().median_us
    rows = []

    def time_it(fn, sets):  # as benchmarks/kernels.py times every kernel
        return _time(fn, sets, rep_ms).median_us

    shapes = _shapes()
    for i, shape in enumerate(shapes):
        shape_deadline = time.time() + (deadline_s - (time.time() - start)) / (len(shapes) - i)
        sets = [kernel.make_inputs(shape, "bf16", "cuda", seed=s) for s in range(4)]
        ref = kernel.reference(sets[0])
        nbytes = kernel.cost(shape, "bf16").bytes
        row = {"shape": shape, "bytes": nbytes, "floor_us": nbytes / bw * 1e6, "trials": []}
        # the read floor: the same bytes (W then x) streamed by one launch, from buffers of their own (cold each call)
        bufs = [torch.cat([s["w"].reshape(-1), s["x"].reshape(-1)]) for s in sets]
        sink = torch.empty(triton.cdiv(bufs[0].numel(), READ_BLOCK), device="cuda", dtype=torch.float32)
        row["read_us"] = time_it(lambda b: _read_kernel[(sink.numel(),)](b, sink, b.numel(), BLOCK=READ_BLOCK), bufs)
        del bufs
        row["library_us"] = time_it(lambda s: torch_linear(s["x"], s["w"], "bf16"), sets)
        shipped = lookup("gemm", shape, "bfloat16", "cuda")
        row["shipped_config"] = shipped
        row["shipped_us"] = time_it(lambda s: gemm(s["x"], s["w"], "bf16", shipped), sets)

        def trial(kind, cfg, fn, sets=sets, ref=ref):
            rec = {"kind": kind, "config": cfg}
            try:
                poisoned = torch.full((shape["M"], shape["N"]), float("nan"), device="cuda", dtype=torch.bfloat16)
                y = fn(sets[0], poisoned)  # compiles; every element it fails to write stays NaN
                torch.cuda.synchronize()
                err = rel_error(y, ref)
                rec["err"] = err
                if not err <= kernel.tolerance("bf16"):
                    rec["outcome"] = "wrong_result"
                else:
                    rec.update(outcome="ok", time_us=time_it(fn, sets))
            except Exception as exc:  # noqa: BLE001 - a failed config is data
                rec.update(outcome=classify_failure(exc), error=f"{type(exc).__name__}: {str(exc)[:200]}")
            row["trials"].append(rec)

        for cfg in _long_k_configs(shape):
            if time.time() > shape_deadline:
                row["truncated"] = True
                break
            trial("long_k", cfg, lambda s, out=None, c=cfg: gemm(s["x"], s["w"], "bf16", c, out=out))
        if shape["M"] == 1:
            for cfg in _gemv_configs(shape):
                if time.time() > shape_deadline:
                    row["truncated"] = True
                    break
                trial("gemv", cfg, lambda s, out=None, c=cfg: gemv(s["x"], s["w"], "bf16", c, out=out))
        for kind in ("long_k", "gemv"):
            ok = [t for t in row["trials"] if t["kind"] == kind and t.get("outcome") == "ok"]
            best = min(ok, key=lambda t: t["time_us"]) if ok else None
            row[f"{kind}_best_us"] = best["time_us"] if best else None
            row[f"{kind}_best_config"] = best["config"] if best else None
            row[f"{kind}_n"] = len(ok)
        print(json.dumps({k: v for k, v in row.items() if k != "trials"}), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "bw": bw,
        "launch_us": launch,
        "commit": git_commit(),
        "wall_s": time.time() - start,
    }
    return {"meta": meta, "rows": rows}


def _f(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def report(data: dict, source: str) -> str:
    m = data["meta"]
    lines = [
        f"# Decode GEMMs against their floor: {m['gpu']}",
        "",
        f"- date: {m['date']}; torch {m['torch']}, triton {m['triton']}; commit {m['commit']}",
        f"- generated by `benchmarks/gemm_floor.py --report-from` from `{source}`",
        f"- copy rate {m['bw'] / 1e12:.2f} TB/s (read+write, 2 GiB); an empty kernel {m['launch_us']:.1f} µs per call",
        "- all times: median µs of CUDA-graph replays of four rotated input sets, L2 flushed before each replay "
        "(as `benchmarks/kernels.py`), measured side by side in one run; bf16",
        "- byte floor = bytes / copy rate; read floor = a streaming read of the same bytes in one launch",
        "- long K = `kernels/gemm.py` with BLOCK_K 512 or 1024 (outside its search space); GEMV = split-K without "
        "tensor cores (M = 1 only); each the best of its configs here",
        "",
        "| shape | byte floor | read floor | library | GEMM shipped config | long K best | GEMV best | best of all / library | "
        "best of all / read floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in data["rows"]:
        cands = [x for x in (r["shipped_us"], r.get("long_k_best_us"), r.get("gemv_best_us")) if x]
        best = min(cands) if cands else None
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        lines.append(
            f"| {shape} | {_f(r['floor_us'])} | {_f(r['read_us'])} | {_f(r['library_us'])} | "
            f"{_f(r['shipped_us'])} | {_f(r.get('long_k_best_us'))} | "
            f"{_f(r.get('gemv_best_us'))} | {_f(best / r['library_us'], 2) if best else '—'}x | "
            f"{_f(best / r['read_us'], 2) if best else '—'}x |"
        )
    lines += ["", "Best configs:", ""]
    for r in data["rows"]:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        lines.append(
            f"- {shape}: long K {r.get('long_k_best_config')} ({r.get('long_k_n', 0)} timed); GEMV "
            f"{r.get('gemv_best_config')} ({r.get('gemv_n', 0)} timed)"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="gemm_floor.json")
    ap.add_argument("--out", default=None, help="with --report-from: the markdown report")
    ap.add_argument("--report-from", default=None, metavar="JSON")
    ap.add_argument("--deadline-s", type=float, default=240.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    args = ap.parse_args(argv)
    if args.report_from:
        text = report(json.loads(Path(args.report_from).read_text()), args.report_from)
        if args.out:
            Path(args.out).write_text(text)
        print(text)
        return 0
    if not torch.cuda.is_available():
        print(
            "error: gemm_floor.py times kernels on a CUDA GPU; run it on the GPU host, then --report-from here",
            file=sys.stderr,
        )
        return 2
    data = run(args.deadline_s, args.rep_ms)
    Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    print(report(data, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
