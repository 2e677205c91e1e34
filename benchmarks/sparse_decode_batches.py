"""The ``tl.dot`` sparse decode between the batches its tuned files hold: which split count, and when the merge starts.

The H200's tuned files of ``kernels.sparse_decode`` (bf16 and fp8 caches) hold batch 1, 16 and 64; any other batch
takes the nearest key's config as it is (its split count tuned for another batch), and the split kernel always lets
its PDL-launched merge start at once (``griddepcontrol.launch_dependents``). The wgmma kernel measured both costing
up to 1.5x (``benchmarks/results/sparse_decode_wgmma_batches/h200/2026-12-01_2b6e86b.md``,
``benchmarks/results/sparse_decode_wgmma_pdl/h200/2026-12-01_a387428.md``); its
programs fill an SM each, the ``tl.dot`` kernel's are small and share SMs, so its rules need their own measurement.

For each batch and cache dtype (V4-Flash shapes), in one process, every config checked first against the float32
reference into a NaN-poisoned output (timed and ragged inputs), then timed with ``kernels.bench.do_bench`` (medians
of CUDA-graph replays, L2 flushed before each, 4 input sets rotating):

* ``nearest``: the nearest tuned key's config as it runs now;
* ``S=n``: the same tiles with each split count of the kernel's space (what an adapted split count could pick);
* ``early`` / ``plain``: the nearest config and the fastest split count with the merge started at once (the
  shipped launch) and without PDL. The stored run (936ffa3) also timed ``at_exit`` (the merge started as the split
  kernel's programs exit, through a timing-only switch since removed); the report shows it where a run has it.

    python3 benchmarks/sparse_decode_batches.py --json OUT.json [--batches 3,10,20]  # on an H200
    python3 benchmarks/sparse_decode_batches.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

BATCHES = (2, 4, 7, 13, 24, 32, 40, 48, 96)
DTYPES = ("bfloat16", "float8_e4m3fn")


def programs(config: dict, batch: int, heads: int = 64, topk: int = 640) -> int:
    """Split-kernel programs: batch x head blocks x splits (whole tiles, ``split_rows``)."""
    from kernels.sparse_decode import split_rows

    return batch * -(-heads // config["BLOCK_H"]) * split_rows(topk, config["S"], config["BLOCK_T"])[1]


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.common import _time, checked_time, run_meta
    from kernels.configs import lookup_entry
    from kernels.registry import get_kernel
    from kernels.sparse_decode import sparse_decode, split_rows

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms)
    rows = []
    for dtype in DTYPES:
        for batch in [int(b) for b in args.batches.split(",")]:
            shape = dict(base, batch=batch)
            entry = lookup_entry("sparse_decode", shape, dtype, "cuda")
            nearest = {**kernel.default_config(shape), **entry["config"]}
            sets = [kernel.make_inputs(shape, dtype, "cuda", seed=1 + k) for k in range(4)]
            ragged = kernel.make_inputs(dict(shape, ragged=1), dtype, "cuda", seed=99)

            def run(i, out, config, **kw):
                return sparse_decode(
                    i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out, kv_scale=i.get("kv_scale"), **kw
                )

            timed: dict[int, float] = {}
            for s in kernel.config_space(shape)["S"]:
                config = {**nearest, "S": s}
                n = split_rows(shape["topk"], s, config["BLOCK_T"])[1]
                if n in timed or kernel.check_config(config, shape, "cuda", dtype):
                    continue  # the same partition as a smaller S, or a rule it breaks
                got = checked_time(
                    kernel,
                    lambda i, out, config=config: run(i, out, config),
                    sets,
                    (sets[0], ragged),
                    args.rep_ms,
                    dtype,
                )
                timed[n] = got.get("us", float("inf"))
                rows.append(
                    {
                        "dtype": dtype,
                        "batch": batch,
                        "way": f"S={s}",
                        "config": config,
                        "splits": n,
                        "programs": programs(config, batch),
                        "nearest_S": nearest["S"],
                        **{k: got[k] for k in ("err", "us") if k in got},
                    }
                )
            ok = [r for r in rows if r["dtype"] == dtype and r["batch"] == batch and r.get("us")]
            best = min(ok, key=lambda r: r["us"])["config"]
            for name, config in (("nearest", nearest), ("best_S", best)):
                if split_rows(shape["topk"], config["S"], config["BLOCK_T"])[1] == 1:
                    continue  # one split: no merge
                for way, kw in (("early", {}), ("plain", {"pdl": False})):
                    us = _time(
                        lambda j, config=config, kw=kw: run(sets[j], None, config, **kw),
                        list(range(len(sets))),
                        args.rep_ms,
                    ).median_us
                    rows.append(
                        {
                            "dtype": dtype,
                            "batch": batch,
                            "way": f"{name}:{way}",
                            "config": config,
                            "us": us,
                            "programs": programs(config, batch),
                        }
                    )
            print(f"{dtype} batch {batch}: nearest S={nearest['S']} best S={best['S']}", flush=True)
            torch.cuda.empty_cache()
    data = {"meta": meta, "rows": rows}
    return data


def by_case(data: dict) -> dict:
    out: dict = {}
    for r in data["rows"]:
        out.setdefault((r["dtype"], r["batch"]), []).append(r)
    return out


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance
    from kernels.sparse_decode import SparseDecodeKernel, split_rows

    meta = data["meta"]
    lines = [
        "# Sparse decode (tl.dot kernel) between its tuned batches: split counts and the merge's start",
        "",
        *provenance(meta, "sparse_decode_batches.py", source),
        "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536); µs: median of CUDA-graph "
        "replays, L2 flushed before each, 4 input sets rotating; every split count checked against the float32 "
        "reference first (timed and ragged inputs)",
        "- nearest: the nearest key of the H200's tuned file (batch 1, 16, 64) as it runs now; best S: the "
        "fastest split count with the nearest config's tiles; programs: batch x head blocks x splits",
        "",
        "- one wave: the split count `SparseDecodeKernel.adapt_config` now gives the nearest key's config at this "
        "batch (the most splits within one program an SM, 132 on the H200), and its time over the best's",
        "",
        "| cache | batch | nearest S (programs) | nearest µs | best S (programs) | best µs | nearest / best | "
        "one wave S | one wave / best | at exit / early, nearest | at exit / early, best S | plain / early, best S |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    kernel = SparseDecodeKernel.instance
    shape = {"heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
    for (dtype, batch), rs in by_case(data).items():
        split = [r for r in rs if r["way"].startswith("S=") and r.get("us")]
        near = next(
            (r for r in split if r["splits"] == split_rows(640, r["nearest_S"], r["config"]["BLOCK_T"])[1]), None
        )
        best = min(split, key=lambda r: r["us"])
        w = {r["way"]: r["us"] for r in rs if ":" in r["way"]}

        def ratio(a, b):
            return f"{w[a] / w[b]:.2f}x" if a in w and b in w else "-"

        wave_s = kernel.splits_in_one_wave(best["config"], {**shape, "batch": batch})
        wave_n = split_rows(640, wave_s, best["config"]["BLOCK_T"])[1]
        wave = next((r for r in split if r["splits"] == wave_n), None)
        wave_cells = f"{wave_s} | {wave['us'] / best['us']:.2f}x" if wave else f"{wave_s} | -"

        lines.append(
            f"| {dtype} | {batch} | {near['config']['S'] if near else '-'} ({near['programs'] if near else '-'}) "
            f"| {near['us']:.1f} | {best['config']['S']} ({best['programs']}) | {best['us']:.1f} | "
            f"{near['us'] / best['us']:.2f}x | {wave_cells} | {ratio('nearest:at_exit', 'nearest:early')} | "
            f"{ratio('best_S:at_exit', 'best_S:early')} | {ratio('best_S:plain', 'best_S:early')} |"
            if near
            else f"| {dtype} | {batch} | - | - | {best['config']['S']} | {best['us']:.1f} | - | {wave_cells} "
            "| - | - | - |"
        )
    lines += ["", "Every split count (µs; programs):", ""]
    for (dtype, batch), rs in by_case(data).items():
        cells = ", ".join(
            f"S={r['config']['S']} {r['us']:.1f} ({r['programs']})"
            if r.get("us")
            else f"S={r['config']['S']} wrong_result"
            for r in rs
            if r["way"].startswith("S=")
        )
        tiles = next(r["config"] for r in rs)
        lines.append(
            f"- {dtype} batch {batch} (BLOCK_H={tiles['BLOCK_H']} BLOCK_T={tiles['BLOCK_T']} "
            f"num_warps={tiles['num_warps']} num_stages={tiles['num_stages']}): {cells}"
        )
    worst = max((r["err"] for r in data["rows"] if "err" in r), default=None)
    if worst is not None:
        lines += ["", f"Worst rel. error of any config timed: {worst:.5f}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.common import result_path
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=20.0)
        ap.add_argument(
            "--batches",
            default=",".join(map(str, BATCHES)),
            help="the batches to time (default: those the one-wave split rule was read off; others check "
            "it on batches it was not read from)",
        )

    return run(argv, __doc__, result_path("sparse_decode_batches", "h200"), report, measure, extra)


if __name__ == "__main__":
    sys.exit(main())
