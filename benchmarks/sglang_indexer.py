"""Does the context cap change SGLang's own Hopper indexer cost at a live context of 512?

SGLang 0.5.23 runs DeepSeek-V4's decode indexer on sm_90 as DeepGEMM's paged MQA logits over its paged fp8 index
cache (``tuner/targets/workload/sglang_indexer.py`` calls it as SGLang does), followed by a top-k over each row's
live columns. The cap sizes its page table (``ceil(cap / 256)`` pages, ``cap / 4`` logit columns); the live length
sizes DeepGEMM's schedule. Side by side in one run, at batch 1 / 16 / 64 and caps 8192 / 32768 / 262144 / 1048576:

* ``dg_logits``: DeepGEMM's logits alone (the deployment's kernel);
* ``dg_indexer``: those logits and ``torch.topk`` over the live columns (the twin's ``indexer_impl=deepgemm`` with
  ``indexer_topk=torch``, the stand-in);
* ``sg_indexer``: those logits and SGLang's own JIT ``topk_transform_paged_v2`` (``indexer_topk=sglang``: the whole of
  SGLang's Hopper indexer), where the sglang package, apache-tvm-ffi and nvcc are there to build it;
* ``torch_indexer``: the twin's torch indexer as it stood for the deployment before (SGLang's torch fallback, which
  scores the whole width the cap sizes: gather, fp32 logits, mask, top-k).

Each is checked first: DeepGEMM's live logits against a float64 reference of the same fp8 inputs (relative norm
error), and each top-k's picks against the reference's. A second live context (4096 tokens, 1024 compressed rows a
request) makes the top-k choose 512 of more rows than it keeps, where 512 tokens' 128 rows are all kept. Every time is ``kernels.bench.do_bench``'s median of CUDA-graph
replays, L2 flushed. A second table holds the FP8 block linear's stand-in gap: DeepGEMM's ``fp8_gemm_nt`` (1x128
activation and 128x128 weight scales, what SGLang runs for V4's FP8 linears on sm_90) beside the twin's
``torch._scaled_mm`` (per-row and per-channel scales) at two V4-Flash shapes.

    python benchmarks/sglang_indexer.py --json $OUT/sglang_indexer.json      # on an sm_90 GPU with deep_gemm
    python benchmarks/sglang_indexer.py --report-from FILE.json --out REPORT.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

BATCHES = (1, 16, 64)
CAPS = (8192, 32768, 262144, 1048576)
LIVE_CONTEXTS = (512, 4096)
HEADS, DIM, TOPK, CSA_RATIO = 64, 128, 512, 4
GEMM_SHAPES = ((32768, 1024), (4096, 8192))  # V4-Flash's q_b (1024 -> 64 x 512) and o_b (8 groups x 1024 -> 4096)


def _sglang_topk_available() -> str:
    """'' where SGLang's JIT top-k builds here, else why not."""
    from search_spaces.hardware import _sglang_jit_buildable

    if not _sglang_jit_buildable():
        return "the sglang package, apache-tvm-ffi or nvcc is missing"
    try:
        from sglang.kernels.ops.attention import dsv4  # noqa: F401
    except Exception as exc:  # an install that cannot import is a reason in the report, not a crash
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return ""


def _indexer_rows(batch: int, cap: int, live_context: int, rep_ms: float, sglang: bool) -> dict:
    import torch

    from kernels.bench import do_bench
    from tuner.targets.workload.ops import indexer_scores_torch
    from tuner.targets.workload.sglang_indexer import (
        SGLangIndexer,
        page_table_width,
        paged_index_state,
        reference_logits,
    )

    dev = "cuda"
    live = -(-live_context // CSA_RATIO)
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + cap)
    keys = torch.randn(1 + batch * live, DIM, device=dev, generator=g)
    width = page_table_width(cap, CSA_RATIO)
    st = paged_index_state(keys, batch, live, width)
    st["idx_live"] = live
    ix = SGLangIndexer(TOPK, "torch")
    ix.prepare(st)
    ix_sg, st_sg = None, dict(st)
    if sglang:
        ix_sg = SGLangIndexer(TOPK, "sglang")
        ix_sg.prepare(st_sg)
    qi = torch.randn(batch, HEADS, DIM, device=dev, generator=g).to(torch.bfloat16)
    w = torch.randn(batch, HEADS, device=dev, generator=g)

    got = ix.logits(qi, w, st)[:, :live].double()
    ref = reference_logits(qi, w, st["idx_cache"], st["idx_table"], live)
    err = float((got - ref).norm() / ref.norm())
    k = min(TOPK, live)
    ref_picks = st["idx_base"][:, None] + ref.topk(k, dim=-1).indices

    def agreement(picks) -> float:
        return float(
            torch.tensor([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(picks[:, :k], ref_picks)]).mean()
        )

    agree = agreement(ix(qi, w, st))

    # the twin's torch indexer at this cap: SGLang's fallback, the whole width scored (fp32 logits, as the twin's
    # default gemm_indexer), keys gathered through the table
    twidth = cap // CSA_RATIO + 64
    j = torch.arange(twidth, device=dev)
    table = torch.where(
        j[None, :] < live,
        1 + torch.arange(batch, device=dev)[:, None] * live + j[None, :],
        torch.zeros_like(j)[None, :],
    )
    lens = torch.full((batch,), live, device=dev)
    qf, wf = qi.float(), w

    def torch_indexer(_):
        scores = indexer_scores_torch(qf, wf, keys[table], torch.float32)
        scores = scores.masked_fill(~(j[None, :] < lens[:, None]), float("-inf"))
        return scores.topk(min(TOPK, twidth), dim=-1).indices

    row = {
        "batch": batch,
        "cap": cap,
        "live_context": live_context,
        "live_rows": live,
        "page_table_width": width,
        "logit_columns": width * 64,
        "err": err,
        "topk_agreement": agree,
    }
    row["dg_logits_us"] = do_bench(lambda _: ix.logits(qi, w, st), [0], rep_ms=rep_ms, cuda_graph=True).median_us
    row["dg_indexer_us"] = do_bench(lambda _: ix(qi, w, st), [0], rep_ms=rep_ms, cuda_graph=True).median_us
    row["torch_indexer_us"] = do_bench(torch_indexer, [0], rep_ms=rep_ms, cuda_graph=True).median_us
    if ix_sg is not None:
        sg = ix_sg(qi, w, st_sg)
        row["sg_topk_agreement"] = agreement(sg)
        row["sg_padding_ok"] = bool(sg[:, k:].eq(-1).all())
        row["sg_indexer_us"] = do_bench(lambda _: ix_sg(qi, w, st_sg), [0], rep_ms=rep_ms, cuda_graph=True).median_us
    torch.cuda.empty_cache()
    return row


def _gemm_rows(rep_ms: float) -> list[dict]:
    import deep_gemm
    import torch

    from kernels.bench import do_bench

    dev, out = "cuda", []
    for n, k in GEMM_SHAPES:
        for m in BATCHES:
            g = torch.Generator(device=dev).manual_seed(m * 31 + n + k)
            a = torch.randn(m, k, device=dev, generator=g)
            b = torch.randn(n, k, device=dev, generator=g)
            ref = a.double() @ b.double().t()
            # DeepGEMM: 1x128 activation scales, 128x128 weight block scales (SGLang's block-FP8 linears)
            av = a.view(m, k // 128, 128)
            sa = av.abs().amax(-1).clamp(min=1e-4) / 448.0
            aq = (av / sa[..., None]).to(torch.float8_e4m3fn).view(m, k)
            bv = b.view(n // 128, 128, k // 128, 128)
            sb = bv.abs().amax(dim=(1, 3)).clamp(min=1e-4) / 448.0
            bq = (bv / sb[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
            d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

            def dg(_):
                deep_gemm.fp8_gemm_nt((aq, sa), (bq, sb), d)
                return d

            # the twin: per-row activation and per-channel weight scales through torch._scaled_mm
            sx = a.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
            xq = (a / sx).to(torch.float8_e4m3fn)
            sw = b.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
            wq = (b / sw).to(torch.float8_e4m3fn)
            swt = sw.t().contiguous()

            def tm(_):
                return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=swt, out_dtype=torch.bfloat16)

            row = {"M": m, "N": n, "K": k}
            for name, fn in (("deepgemm", dg), ("scaled_mm", tm)):
                try:
                    y = fn(0).double()
                    row[f"{name}_err"] = float((y - ref).norm() / ref.norm())
                    row[f"{name}_us"] = do_bench(fn, [0], rep_ms=rep_ms, cuda_graph=True).median_us
                except Exception as exc:  # a kernel that cannot run here is a row with its reason, not a crash
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            out.append(row)
    return out


def measure(rep_ms: float) -> dict:
    from benchmarks.common import run_meta

    rows = []
    why_not = _sglang_topk_available()
    if why_not:
        print(f"SGLang's JIT top-k is not timed here: {why_not}", flush=True)
    for live_context in LIVE_CONTEXTS:
        for batch in BATCHES:
            for cap in CAPS:
                rows.append(_indexer_rows(batch, cap, live_context, rep_ms, not why_not))
                print(json.dumps(rows[-1]), flush=True)
    gemm = _gemm_rows(rep_ms)
    for r in gemm:
        print(json.dumps(r), flush=True)
    return {
        "meta": run_meta(
            rep_ms,
            live_context=LIVE_CONTEXTS[0],
            live_contexts=list(LIVE_CONTEXTS),
            deep_gemm=os.environ.get("DEEPGEMM_SOURCE", ""),
            sglang_topk=why_not or "timed",
            sglang=_sglang_version(),
        ),
        "indexer": rows,
        "gemm": gemm,
    }


def _sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return ""


def report(data: dict, source: str) -> str:
    m = data["meta"]
    rows = data["indexer"]
    sg = any("sg_indexer_us" in r for r in rows)
    lives = sorted({r.get("live_context", m["live_context"]) for r in rows})
    lines = [
        f"# SGLang's Hopper indexer against the context cap ({m['gpu']}, {m['date']}, commit {m['commit']})",
        "",
        f"Source: `{source}` (written by `benchmarks/sglang_indexer.py`). torch {m['torch']}, Triton {m['triton']}; "
        f"DeepGEMM: {m.get('deep_gemm') or 'as installed'}; SGLang: {m.get('sglang') or 'not installed'}"
        f"{'' if sg else ' (its JIT top-k not timed: ' + m.get('sglang_topk', 'not built') + ')'}. Live context "
        + " and ".join(f"{lc} tokens" for lc in lives)
        + " (a compressed row per 4 tokens). Times: median of CUDA-graph replays, L2 flushed, in µs.",
        "",
        "`dg_logits`: DeepGEMM `fp8_paged_mqa_logits` (SGLang's sm_90 kernel); `dg_indexer`: it and `torch.topk` "
        "over the live columns (the twin's `indexer_impl=deepgemm`, `indexer_topk=torch`: the top-k a stand-in); "
        + (
            "`sg_indexer`: it and SGLang's own JIT `topk_transform_paged_v2` (`indexer_topk=sglang`: SGLang's "
            "Hopper indexer whole); "
            if sg
            else ""
        )
        + "`torch_indexer`: the whole width the cap sizes, as the twin's torch indexer and SGLang's torch fallback "
        "score it. Agreement: the share of the float64 reference's top picks each picked.",
        "",
    ]
    head = "| live context | batch | cap | logit columns | err vs float64 | top-k agreement | dg_logits | dg_indexer | "
    if sg:
        head += "sg_indexer | sg agreement | dg_indexer / sg_indexer | "
    head += "torch_indexer | torch / dg_indexer |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [
            str(r.get("live_context", m["live_context"])),
            str(r["batch"]),
            str(r["cap"]),
            str(r["logit_columns"]),
            f"{r['err']:.1e}",
            f"{r['topk_agreement']:.3f}",
            f"{r['dg_logits_us']:.1f}",
            f"{r['dg_indexer_us']:.1f}",
        ]
        if sg:
            cells += (
                [
                    f"{r['sg_indexer_us']:.1f}",
                    f"{r['sg_topk_agreement']:.3f}" + ("" if r.get("sg_padding_ok", True) else " (bad -1 padding)"),
                    f"{r['dg_indexer_us'] / r['sg_indexer_us']:.2f}x",
                ]
                if "sg_indexer_us" in r
                else ["-", "-", "-"]
            )
        cells += [f"{r['torch_indexer_us']:.1f}", f"{r['torch_indexer_us'] / r['dg_indexer_us']:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    key = "sg_indexer_us" if sg else "dg_indexer_us"
    what = "SGLang's indexer, DeepGEMM logits + SGLang's top-k" if sg else "DeepGEMM path, logits + top-k"
    for lc in lives:
        at = [r for r in rows if r.get("live_context", m["live_context"]) == lc]
        lines += [
            "",
            f"Live context {lc}: cap {max(r['cap'] for r in at)} against cap {min(r['cap'] for r in at)}, "
            f"same batch ({what}):",
            "",
        ]
        for b in sorted({r["batch"] for r in at}):
            rs = {r["cap"]: r for r in at if r["batch"] == b}
            lo, hi = rs[min(rs)], rs[max(rs)]
            lines.append(
                f"- batch {b}: {hi[key]:.1f} / {lo[key]:.1f} µs = {hi[key] / lo[key]:.2f}x (logits alone "
                f"{hi['dg_logits_us'] / lo['dg_logits_us']:.2f}x)"
            )
    lines += [
        "",
        "## The FP8 block linear: DeepGEMM against the twin's stand-in",
        "",
        "| M | N | K | DeepGEMM µs | err | torch._scaled_mm µs | err | stand-in / DeepGEMM |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["gemm"]:
        dg, sm = r.get("deepgemm_us"), r.get("scaled_mm_us")
        ratio = f"{sm / dg:.2f}x" if dg and sm else r.get("deepgemm_error", r.get("scaled_mm_error", "-"))
        lines.append(
            f"| {r['M']} | {r['N']} | {r['K']} | {dg if dg is None else f'{dg:.1f}'} | "
            f"{r.get('deepgemm_err', float('nan')):.1e} | {sm if sm is None else f'{sm:.1f}'} | "
            f"{r.get('scaled_mm_err', float('nan')):.1e} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="where to write the measurement (on the GPU)")
    ap.add_argument("--rep-ms", type=float, default=40.0)
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
