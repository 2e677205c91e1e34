"""When the wgmma sparse decode's split kernel should start its merge kernel early (programmatic dependent launch).

With more than one split a request, ``kernels.sparse_decode_wgmma`` writes float32 partials and a second kernel
merges them; that merge is launched with programmatic dependent launch and waits in-kernel for the split kernel's
stores. The split kernel may let it start at once (``griddepcontrol.launch_dependents`` at its start: the merge's
programs then sit on the SMs the split kernel leaves idle) or only as its own programs exit. This benchmark times
each batch's default config (batch 1 to 32, V4-Flash shapes) the three ways, one after another in one process, each
checked first against the float32 reference into a NaN-poisoned output:

* ``early``: PDL, the merge started at once (``_pdl_trigger=True``);
* ``exit``: PDL, the merge started as the split kernel's programs exit (``_pdl_trigger=False``, before 2026-12-01);
* ``plain``: no PDL (``pdl=False``);
* ``early_wide`` and ``exit_wide``: early and exit with the merge's grid widened to at least 512 programs
  (``_merge_programs``: batch 1's merge is 128 programs of [16 splits, 256 columns], 32 values a thread; widened,
  512 of 64 columns).

Beside each: the split kernel's programs, the merge's programs and the SMs the split kernel leaves idle, which is
what the launcher's rule (``kernels.sparse_decode_wgmma.merge_starts_early``) reads. Times: ``kernels.bench.do_bench``
medians of CUDA-graph replays, L2 flushed before each, 4 input sets rotating.

    python3 benchmarks/sparse_decode_wgmma_pdl.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_pdl.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)]

BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # at 2b6e86b (one wave) batch 24 has 96 programs
WAYS = {"early": {"pdl": True, "_pdl_trigger": True}, "exit": {"pdl": True, "_pdl_trigger": False},
        "plain": {"pdl": False}}
WIDE = 512  # the merge's grid widened to at least this many programs (narrower column blocks, fewer values a thread)
WIDE_WAYS = {"early_wide": {**WAYS["early"], "_merge_programs": WIDE},
             "exit_wide": {**WAYS["exit"], "_merge_programs": WIDE}}


def grids(batch: int, config: dict, topk: int = 640, heads: int = 64, d_v: int = 512,
          min_merge_programs: int = 0) -> tuple[int, int]:
    """(the split kernel's programs, the merge kernel's programs; 0 without a merge) of ``config`` at ``batch``."""
    from kernels.sparse_decode import combine_grid, split_rows

    n_splits = split_rows(topk, config["S"], config["BLOCK_T"])[1]
    merge = 0 if n_splits == 1 or config.get("MERGE") else math.prod(combine_grid(batch, n_splits, heads, d_v,
                                                                                   min_merge_programs))
    return n_splits * config["V_SPLIT"] * batch, merge


def measure(args, json_path: Path) -> dict:

    import torch

    from benchmarks.common import checked_ways, run_meta
    from kernels.base import device_limits
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import default_config, sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    sms = device_limits("cuda")["sms"]
    meta = run_meta(args.rep_ms, sms=sms)
    rows = []
    for batch in BATCHES:
        config = default_config(batch, base["topk"])
        programs, merge = grids(batch, config, base["topk"], base["heads"], base["d_v"])
        if not merge:
            continue
        sets = [kernel.make_inputs(dict(base, batch=batch), "bfloat16", "cuda", seed=1 + k) for k in range(4)]
        ragged = kernel.make_inputs(dict(base, batch=batch, ragged=1), "bfloat16", "cuda", seed=99)
        row = {"batch": batch, "config": config, "programs": programs, "merge_programs": merge, "idle_sms": sms - programs,
               "wide_merge_programs": grids(batch, config, base["topk"], base["heads"], base["d_v"], WIDE)[1]}
        checked_ways(kernel, {**WAYS, **WIDE_WAYS}, lambda i, out, config=config, **opts: sparse_decode_wgmma(
            i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out, **opts), sets, (sets[0], ragged),
            args.rep_ms, row, lambda way, us, batch=batch: print(f"batch {batch} {way} {us}", flush=True))
        rows.append(row)
        torch.cuda.empty_cache()
    data = {"meta": meta, "rows": rows}
    return data


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = ["# Sparse decode (wgmma kernel): its merge kernel started early, at exit, or launched plainly", "",
             *provenance(meta, "sparse_decode_wgmma_pdl.py", source),
             "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536, bf16); each batch's default "
             "config; µs: median of CUDA-graph replays, L2 flushed before each, 4 input sets rotating; each way "
             "checked against the float32 reference first (timed and ragged inputs)",
             "- early: programmatic dependent launch, the split kernel lets the merge start at once; exit: the same "
             "launch, the merge starts as the split kernel's programs exit; plain: no PDL",
             f"- merge / idle SM: the merge's programs for each SM the split kernel leaves idle (of {meta['sms']})",
             "", "| batch | config | split programs | merge programs | idle SMs | merge / idle SM | early µs | exit µs | "
             "plain µs | exit / early | plain / early | rel. error (worst) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        us = {w: r.get(f"{w}_us") for w in WAYS}
        cells = [f"{us[w]:.1f}" if us[w] else "wrong_result" for w in WAYS]
        ratios = [f"{us[w] / us['early']:.2f}x" if us[w] and us["early"] else "-" for w in ("exit", "plain")]
        per = f"{r['merge_programs'] / r['idle_sms']:.1f}" if r["idle_sms"] > 0 else "none idle"
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        err = max(r[f"{w}_err"] for w in WAYS)
        lines.append(f"| {r['batch']} | {cfg} | {r['programs']} | {r['merge_programs']} | {r['idle_sms']} | {per} | "
                     + " | ".join(cells + ratios) + f" | {err:.5f} |")
    wide = [r for r in data["rows"] if "early_wide_err" in r]
    if wide:
        lines += ["", f"The merge's grid widened to at least {WIDE} programs (narrower column blocks), same run, same "
                  "configs:", "", "| batch | merge programs | widened | early µs | early widened µs | exit µs | exit "
                  "widened µs | early / early widened | exit / exit widened | rel. error (worst) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in wide:
            us = {w: r.get(f"{w}_us") for w in ("early", "early_wide", "exit", "exit_wide")}
            cells = [f"{us[w]:.1f}" if us[w] else "wrong_result" for w in us]
            ratios = [f"{us[a] / us[b]:.2f}x" if us[a] and us[b] else "-"
                      for a, b in (("early", "early_wide"), ("exit", "exit_wide"))]
            err = max(r[f"{w}_err"] for w in WIDE_WAYS)
            lines.append(f"| {r['batch']} | {r['merge_programs']} | {r['wide_merge_programs']} | "
                         + " | ".join(cells + ratios) + f" | {err:.5f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)

    return run(argv, __doc__, ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_pdl_h200.md", report, measure,
               extra)


if __name__ == "__main__":
    sys.exit(main())
