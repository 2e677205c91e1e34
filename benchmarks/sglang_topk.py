"""The gap between the twin's top-k stand-in and SGLang's own, on the indexer's logits (no DeepGEMM needed).

SGLang 0.5.23 picks DeepSeek-V4's decode indexer top-512 with its JIT CUDA ``topk_transform_paged_v2`` (planned once a
forward by ``plan_topk_v2`` on the live compressed lengths), reading only each row's live columns of the
``[rows, page-table width x 64]`` logits and writing page-table slots. The twin's ``indexer_topk=torch`` stand-in is
``torch.topk`` over the live columns plus the pool base. Side by side in one run, on the same random float32 logits
laid out as DeepGEMM leaves them (live columns written, the rest as allocated), at batch 1 / 16 / 64, live contexts
512 and 4096 tokens (128 and 1024 compressed rows) and caps 8192 / 262144 / 1048576:

* ``sglang_us``: ``topk_transform_paged_v2`` into page slots (SGLang's decode call; the plan is built outside the
  timed region, as SGLang builds it once a forward for every layer);
* ``torch_us``: ``torch.topk`` of the live columns plus the pool base (the stand-in).

Checked first: both pick the same set of each row (random logits: no ties), SGLang's slots map back to the same
columns, and rows with fewer live columns than 512 are -1 padded. Times: ``kernels.bench.do_bench`` medians of
CUDA-graph replays, L2 flushed.

    python benchmarks/sglang_topk.py --json $OUT/sglang_topk.json     # on a GPU with sglang, tvm_ffi and nvcc
    python benchmarks/sglang_topk.py --report-from FILE.json --out REPORT.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

BATCHES = (1, 16, 64)
CAPS = (8192, 262144, 1048576)
LIVE_CONTEXTS = (512, 4096)
TOPK, PAGE_ROWS, CSA_RATIO = 512, 64, 4


def _row(dsv4, batch: int, cap: int, live_context: int, rep_ms: float) -> dict:
    import torch

    from kernels.bench import do_bench

    dev = "cuda"
    live = live_context // CSA_RATIO
    width = -(-cap // (PAGE_ROWS * CSA_RATIO))
    live_pages = -(-live // PAGE_ROWS)
    g = torch.Generator(device=dev).manual_seed(batch * 131 + cap + live)
    logits = torch.empty(batch, width * PAGE_ROWS, device=dev).uniform_(-1, 1, generator=g)  # past live: as allocated
    lens = torch.full((batch,), live, dtype=torch.int32, device=dev)
    table = torch.zeros(batch, width, dtype=torch.int32, device=dev)
    first = 1 + torch.arange(batch, device=dev) * live_pages
    table[:, :live_pages] = (first[:, None] + torch.arange(live_pages, device=dev)[None, :]).to(torch.int32)
    base = (1 + torch.arange(batch, device=dev) * live).long()
    plan = dsv4.plan_topk_v2(lens)
    slots = torch.empty(batch, TOPK, dtype=torch.int32, device=dev)
    k = min(TOPK, live)

    def sglang(_):
        dsv4.topk_transform_paged_v2(logits, lens, table, slots, PAGE_ROWS, plan)
        return slots

    def stand_in(_):
        picks = logits[:, :live].topk(k, dim=-1).indices
        return base[:, None] + picks

    got = sglang(0).clone()
    want = logits[:, :live].topk(k, dim=-1).indices
    cols = got[:, :k].long() - first[:, None].long() * PAGE_ROWS  # a slot back to its column
    same = all(set(a.tolist()) == set(b.tolist()) for a, b in zip(cols, want))
    padded = bool(got[:, k:].eq(-1).all())
    row = {
        "batch": batch,
        "cap": cap,
        "live_context": live_context,
        "live_rows": live,
        "logit_columns": width * PAGE_ROWS,
        "same_picks": same,
        "padding_ok": padded,
    }
    row["sglang_us"] = do_bench(sglang, [0], rep_ms=rep_ms, cuda_graph=True).median_us
    row["torch_us"] = do_bench(stand_in, [0], rep_ms=rep_ms, cuda_graph=True).median_us
    return row


def measure(rep_ms: float) -> dict:
    from importlib.metadata import version

    from sglang.kernels.ops.attention import dsv4

    from benchmarks.common import run_meta

    rows = []
    for live_context in LIVE_CONTEXTS:
        for batch in BATCHES:
            for cap in CAPS:
                rows.append(_row(dsv4, batch, cap, live_context, rep_ms))
                print(json.dumps(rows[-1]), flush=True)
    return {"meta": run_meta(rep_ms, sglang=version("sglang")), "rows": rows}


def report(data: dict, source: str) -> str:
    m = data["meta"]
    lines = [
        f"# The indexer's top-k: SGLang's JIT kernel against the twin's torch.topk stand-in ({m['gpu']}, {m['date']}, "
        f"commit {m['commit']})",
        "",
        f"Source: `{source}` (written by `benchmarks/sglang_topk.py`). SGLang {m['sglang']}, torch {m['torch']}. "
        "Top 512 of each row's live columns of random float32 logits; times: median of CUDA-graph replays, L2 "
        "flushed, in µs. `sglang`: `topk_transform_paged_v2` into page slots (planned outside the timed region, "
        "once a forward as SGLang does); `torch`: `torch.topk` of the live columns plus the pool base "
        "(`indexer_topk=torch`).",
        "",
        "| live context | batch | cap | logit columns | same picks | -1 padding | sglang µs | torch µs | torch / sglang |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['live_context']} | {r['batch']} | {r['cap']} | {r['logit_columns']} | "
            f"{'yes' if r['same_picks'] else 'NO'} | {'ok' if r['padding_ok'] else 'BAD'} | {r['sglang_us']:.1f} | "
            f"{r['torch_us']:.1f} | {r['torch_us'] / r['sglang_us']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="where to write the measurement (on the GPU)")
    ap.add_argument("--rep-ms", type=float, default=25.0)
    ap.add_argument("--report-from", help="a stored JSON: write its report")
    ap.add_argument("--out", help="the report's path (with --report-from)")
    args = ap.parse_args(argv)
    if args.report_from:
        from benchmarks.common import read_json, stored_path

        text = report(read_json(args.report_from), stored_path(args.report_from))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
        print(text)
        return 0
    data = measure(args.rep_ms)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    print(report(data, args.json or "-"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
