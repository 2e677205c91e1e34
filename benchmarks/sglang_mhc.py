"""SGLang 0.5.23's mHC kernels for DeepSeek-V4-Flash's decode beside the twin's stand-in, side by side in one run
(issue 46: the gap of a labelled stand-in, measured at the deployment's shapes), on an sm_90 GPU with the sglang
package importable (``benchmarks/deployment_gpu.sh`` installs it on the lent H200).

Per sublayer SGLang runs (``srt/models/deepseek_v4_mhc.py``; V4-Flash: 4 streams of hidden 4096, so the fused Hopper
combine and post, which need hidden 5120, are not taken):

* the mixing statistics: at 1 row its Triton ``hc_mix_stats_sinkhorn`` (projection, RMS and Sinkhorn in one); at
  2-31 rows its Triton ``hc_mix_stats`` then TileLang ``hc_split_sinkhorn``; from 32 rows its Triton split bf16x3
  projection ``hc_mix_stats_sinkhorn_bf16x3`` (with the compensated bf16 weight parts);
* the combine: its Triton ``mhc_combine`` (sum of the four streams by their pre weights), then RMSNorm
  (``sgl_kernel.rmsnorm``; timed here as the twin's torch RMSNorm, sgl_kernel not being on the GPU image);
* the post: TileLang ``mhc_post``.

TileLang is not on the GPU image: those pieces are named, not timed, and the rows say which pieces the sum holds.
The twin's stand-in per sublayer is its ``_mhc`` (the MHC-pre linear over the four streams in fp32 through torch,
then a sigmoid mix of one stream: ``tuner.targets.workload.model.DecodeModel._mhc``) and its fused add + RMSNorm
(``kernels/glue.py``, what ``glue=sglang`` runs for the residual).

Times are ``kernels.bench.do_bench`` medians (L2 flushed; CUDA graphs below 20 us).

    python benchmarks/sglang_mhc.py --json $OUT/sglang_mhc.json       # on the GPU
    python benchmarks/sglang_mhc.py --report-from FILE.json            # anywhere
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import json_report_main, provenance_line, run_meta  # noqa: E402

BATCHES = (1, 16, 64)
MULT, HIDDEN, ITERS, EPS = 4, 4096, 20, 1e-6
MIX = (2 + MULT) * MULT


def _rows(rep_ms: float) -> list[dict]:
    from types import SimpleNamespace

    import torch
    from sglang.kernels.ops.layernorm import mhc

    from kernels.bench import do_bench
    from tuner.targets.workload.gpu_ops import fused_glue
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.ops import Linear, rms_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    k = MULT * HIDDEN
    fn = (torch.randn(MIX, k, device="cuda", generator=g) / k**0.5).contiguous()
    scale = torch.rand(3, device="cuda", generator=g) + 0.5
    base = torch.randn(MIX, device="cuda", generator=g) * 0.1
    parts = [fn.to(torch.bfloat16)]
    parts.append((fn - parts[0].float()).to(torch.bfloat16))
    parts.append((fn - parts[0].float() - parts[1].float()).to(torch.bfloat16))
    norm_w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    add_norm = fused_glue()
    twin = SimpleNamespace(p=SimpleNamespace(mhc_mult=MULT), w=SimpleNamespace(mhc=Linear.make(fn.clone(), "fp32")))
    rows = []
    for b in BATCHES:
        x = (torch.randn(b, k, device="cuda", generator=g)).to(torch.bfloat16)
        pre = torch.softmax(torch.randn(b, MULT, device="cuda", generator=g), -1).contiguous()
        h = x[:, :HIDDEN].contiguous()
        res = torch.randn_like(h)
        row = {"batch": b}
        if b == 1:
            row["stats_kernel"] = "hc_mix_stats_sinkhorn"
            stats = lambda: mhc.hc_mix_stats_sinkhorn(x, fn, scale, base, MULT, ITERS, EPS, EPS)  # noqa: E731
        elif b < 32:
            row["stats_kernel"] = "hc_mix_stats (TileLang hc_split_sinkhorn not timed)"
            stats = lambda: mhc.hc_mix_stats(x, fn, EPS)  # noqa: E731
        else:
            row["stats_kernel"] = "hc_mix_stats_sinkhorn_bf16x3"
            stats = lambda: mhc.hc_mix_stats_sinkhorn_bf16x3(x, parts, scale, base, ITERS, EPS, EPS, MULT)  # noqa: E731
        y = torch.empty(b, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for key, call in (
            ("sglang_stats_us", stats),
            ("sglang_combine_us", lambda: mhc.mhc_combine(x, pre, MULT, torch.bfloat16)),
            ("norm_standin_us", lambda: rms_norm(y, norm_w)),
            ("twin_mhc_us", lambda: DecodeModel._mhc(twin, h)),
            ("twin_add_norm_us", lambda: add_norm(h, res, norm_w)),
        ):
            try:  # one call that fails is a row's note, not the run's end
                row[key] = do_bench(call, rep_ms=rep_ms).median_us
            except Exception as exc:  # noqa: BLE001
                row[key] = None
                row.setdefault("errors", {})[key] = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def report(data: dict, source: str) -> str:
    m = data["meta"]
    out = [
        "# SGLang's mHC kernels for V4-Flash's decode beside the twin's stand-in (issue 46)",
        "",
        provenance_line(m, "benchmarks/sglang_mhc.py", source),
        "",
        "Per sublayer, us (median). SGLang's sum holds its Triton pieces that run on the GPU image (the statistics"
        " kernel named, the combine) and a torch RMSNorm for its sgl_kernel one; its TileLang post (and, at 2-31 rows,"
        " TileLang Sinkhorn) are not on the image and not in the sum. The twin's: its MHC-pre stand-in and fused"
        " add + RMSNorm.",
        "",
        "| batch | SGLang statistics (kernel) | SGLang combine | RMSNorm (torch stand-in) | SGLang sum | twin mHC | "
        "twin add + RMSNorm | twin sum | twin / SGLang |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def us(v) -> str:
        return "failed" if v is None else f"{v:.1f}"

    errors = []
    for r in data["rows"]:
        sg = [r[k] for k in ("sglang_stats_us", "sglang_combine_us", "norm_standin_us")]
        tw = [r[k] for k in ("twin_mhc_us", "twin_add_norm_us")]
        ours = None if None in sg else sum(sg)
        twin = None if None in tw else sum(tw)
        ratio = f"{twin / ours:.2f}x" if ours and twin else "-"
        out.append(
            f"| {r['batch']} | {us(sg[0])} ({r['stats_kernel']}) | {us(sg[1])} | {us(sg[2])} | {us(ours)} | "
            f"{us(tw[0])} | {us(tw[1])} | {us(twin)} | {ratio} |"
        )
        errors += [f"- batch {r['batch']}, {k}: {e}" for k, e in r.get("errors", {}).items()]
    if errors:
        out += ["", "Failed calls:", "", *errors]
    return "\n".join(out) + "\n"


def main() -> int:
    return json_report_main(__doc__, lambda a: {"meta": run_meta(a.rep_ms), "rows": _rows(a.rep_ms)}, report)


if __name__ == "__main__":
    raise SystemExit(main())
