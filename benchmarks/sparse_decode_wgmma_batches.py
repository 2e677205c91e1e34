"""The wgmma sparse decode between the batches its tuned file holds: the config it launches now against before.

The H200's tuned file (``kernels/tuned``) holds batch 1, 16 and 64; any other batch takes the nearest key's config.
Before 2026-12-01 that config ran as tuned, so a batch-16 config of 4 splits of two programs launched 192 programs
at batch 24 and 256 at batch 32 (one program fits an SM: two waves); without a tuned file the default rule rounded
its split count up and launched a second wave at 108 of the batches up to 132 (an H200's SMs). Now the nearest key's split count is set for
the batch (``SparseDecodeWgmmaKernel.adapt_config``) and the default keeps one wave (``splits_within``).

For each batch (V4-Flash shapes), one after another in one process, each config checked first against the float32
reference into a NaN-poisoned output (timed and ragged inputs), then timed with ``kernels.bench.do_bench`` (medians
of CUDA-graph replays, L2 flushed before each, 4 input sets rotating):

* ``tuned_before``: the nearest tuned key's config as it ran before (no adaptation);
* ``tuned_now``: what the launcher takes now (``kernels.configs.lookup``);
* ``default_before``: the default rule before 2026-12-01 (frozen here);
* ``default_now``: ``kernels.sparse_decode_wgmma.default_config``.

    python3 benchmarks/sparse_decode_wgmma_batches.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_batches.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

BATCHES = (7, 13, 24, 32, 40, 48, 96)
WAYS = ("tuned_before", "tuned_now", "default_before", "default_now")


def default_before(batch: int, topk: int) -> dict:
    """``default_config`` as it was before 2026-12-01 (frozen): ``S = ceil(128 / (batch * V_SPLIT))``, at most one
    a tile, with the fixed budget of 128 programs it had then (an H200's 132 SMs rounded down)."""
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import DEFAULT_CONFIG

    PROGRAMS = 128
    tiles = -(-topk // 64)
    batch = max(batch, 1)
    v_split = next((v for v in (8, 4, 2) if batch * tiles * v <= PROGRAMS), 2 if 2 * batch <= PROGRAMS else 1)
    s = max(1, min(-(-PROGRAMS // (batch * v_split)), tiles))
    rows_per_split, n_splits = split_rows(max(topk, 1), s, 64)
    if n_splits == 1 and v_split > 1 and rows_per_split >= 4 * 64:
        return {
            **DEFAULT_CONFIG,
            "BLOCK_T": 32,
            "STAGES": 4,
            "S": 1,
            "V_SPLIT": v_split,
            "WS": 1,
            "SPLIT_WG": 1,
            "STORE_CVT": 1,
        }
    return {
        **DEFAULT_CONFIG,
        "BLOCK_T": 64,
        "S": s,
        "V_SPLIT": v_split,
        "WS": int(-(-rows_per_split // 64) >= 3),
        "STORE_CVT": int(n_splits == 1),
    }


def programs(config: dict, batch: int, topk: int = 640) -> int:
    from kernels.sparse_decode import split_rows

    return batch * config["V_SPLIT"] * split_rows(topk, config["S"], config["BLOCK_T"])[1]


def configs_for(batch: int, shape: dict, device) -> dict:
    """Each way's config at ``batch`` (see the module docstring); ``tuned_before`` is None without a tuned key."""
    from kernels.configs import lookup, lookup_entry
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import default_config

    wg = get_kernel("sparse_decode_wgmma")
    entry = lookup_entry("sparse_decode_wgmma", shape, "bfloat16", device)
    return {
        "tuned_before": {**wg.default_config(shape), **entry["config"]} if entry else None,
        "tuned_now": lookup("sparse_decode_wgmma", shape, "bfloat16", device),
        "default_before": default_before(batch, shape["topk"]),
        "default_now": default_config(batch, shape["topk"]),
    }


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.common import checked_time, run_meta
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms)
    rows = []
    for batch in BATCHES:
        shape = dict(base, batch=batch)
        sets = [kernel.make_inputs(shape, "bfloat16", "cuda", seed=1 + k) for k in range(4)]
        ragged = kernel.make_inputs(dict(shape, ragged=1), "bfloat16", "cuda", seed=99)
        timed: dict[str, dict] = {}
        for way, config in configs_for(batch, {k: shape[k] for k in base if k != "ragged"}, "cuda").items():
            if config is None:
                continue
            key = json.dumps(config, sort_keys=True)
            if key not in timed:

                def run(i, out, config=config):
                    return sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out)

                got = checked_time(kernel, run, sets, (sets[0], ragged), args.rep_ms)
                timed[key] = {k: got[k] for k in ("err", "us") if k in got}
            rows.append(
                {"batch": batch, "way": way, "config": config, "programs": programs(config, batch), **timed[key]}
            )
            print(f"batch {batch} {way} {rows[-1].get('us', 'wrong_result')}", flush=True)
        torch.cuda.empty_cache()
    data = {"meta": meta, "rows": rows}
    return data


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = [
        "# Sparse decode (wgmma kernel) between its tuned batches: the config it launches now against before",
        "",
        *provenance(meta, "sparse_decode_wgmma_batches.py", source),
        "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536, bf16); µs: median of "
        "CUDA-graph replays, L2 flushed before each, 4 input sets rotating; each config checked against the "
        "float32 reference first (timed and ragged inputs)",
        "- tuned: the nearest key of the H200's tuned file (batch 1, 16, 64), as it ran before (its split count "
        "as tuned) and now (set for the batch); default: the rule without a tuned file, before and now",
        "",
        "| batch | tuned before µs (programs) | tuned now µs (programs) | before / now | default before µs "
        "(programs) | default now µs (programs) | before / now |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    by: dict = {}
    for r in data["rows"]:
        by.setdefault(r["batch"], {})[r["way"]] = r

    def cell(r):
        if r is None:
            return "-"
        return f"{r['us']:.1f} ({r['programs']})" if r.get("us") else f"wrong_result ({r['programs']})"

    def ratio(a, b):
        return f"{a['us'] / b['us']:.2f}x" if a and b and a.get("us") and b.get("us") else "-"

    for batch, w in by.items():
        g = {k: w.get(k) for k in WAYS}
        lines.append(
            f"| {batch} | {cell(g['tuned_before'])} | {cell(g['tuned_now'])} | "
            f"{ratio(g['tuned_before'], g['tuned_now'])} | {cell(g['default_before'])} | "
            f"{cell(g['default_now'])} | {ratio(g['default_before'], g['default_now'])} |"
        )
    lines += ["", "Configs:", ""]
    for batch, w in by.items():
        for way in WAYS:
            if way in w:
                cfg = " ".join(f"{k}={v}" for k, v in w[way]["config"].items())
                lines.append(f"- batch {batch}, {way}: {cfg} (rel. error {w[way]['err']:.5f})")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.common import result_path
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)

    return run(argv, __doc__, result_path("sparse_decode_wgmma_batches", "h200"), report, measure, extra)


if __name__ == "__main__":
    sys.exit(main())
