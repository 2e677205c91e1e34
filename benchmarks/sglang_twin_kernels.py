"""SGLang 0.5.23's glue and block-FP8 GEMM beside the twin's own, side by side in one run (issue 46), on an sm_90 GPU
with the sglang package importable (benchmarks/sglang_jit_gpu.sh installs it; DeepGEMM built for the DeepGEMM rows).

* GEMM: each of V4-Flash's fp8 block linears the twin runs (the attention projections, the indexer's, the shared
  expert's) at M = 1, 16, 64: DeepGEMM ``fp8_gemm_nt`` (SGLang's default on sm_90, ``gemm_impl=deepgemm``), SGLang's
  Triton ``triton_w8a8_block_fp8_linear`` (``--fp8-gemm-backend triton``, ``gemm_impl=sglang_triton``) and
  ``torch._scaled_mm`` per channel (``gemm_impl=torch``), each with its activation quantisation.
* glue: V4's query preparation (64 heads of 512: per-head RMSNorm + RoPE) and KV row (RMSNorm + RoPE + the write into
  V4's fp8 cache) at batch 1, 16, 64: SGLang's JIT kernels (``glue=sglang``), the twin's Triton kernel
  (``glue=fused``; its KV write is torch), eager torch (``glue=eager``).
* step: the whole twin step (dsv4-flash preset, live context 512, CUDA graphs) at c = 1, 16, 64 for the H200 baseline
  (SGLang's glue, DeepGEMM) and the same with one component swapped.

Times are ``kernels.bench.do_bench`` medians (L2 flushed; the GEMMs, with their activation quantisation, always in a
CUDA graph as the twin's step runs them; the glue in graphs below 20 us) and, for the step, the twin's own
measurement (``tuner.targets.workload.bench.measure``).

    python benchmarks/sglang_twin_kernels.py --json $OUT/sglang_twin_kernels.json       # on the GPU
    python benchmarks/sglang_twin_kernels.py --report-from FILE.json --out REPORT.md    # anywhere
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import json_report_main, provenance_line, run_meta  # noqa: E402

BATCHES = (1, 16, 64)


def _probe(torch, Linear) -> tuple:
    lin = Linear.make(torch.ones(128, 128, device="cuda"), "fp8", "sglang_triton")
    return torch.zeros(1, 128, device="cuda", dtype=torch.bfloat16), lin.weight, lin.scale


def _sglang_triton_runs() -> bool:
    import torch

    from tuner.errors import KnobError
    from tuner.targets.workload.ops import Linear
    from tuner.targets.workload.sglang_gemm import block_fp8_linear

    try:
        block_fp8_linear(*_probe(torch, Linear))
        return True
    except KnobError as e:
        print(f"sglang_triton: {e}", flush=True)
        return False


def _gemm_rows(rep_ms: float) -> list[dict]:
    import torch

    from kernels.bench import do_bench
    from tuner.targets.workload.ops import Linear
    from tuner.targets.workload.presets import PRESETS

    p = PRESETS["dsv4-flash"]
    shapes = {
        "q_a": (p.q_lora, p.hidden),
        "q_b": (p.heads * p.head_dim, p.q_lora),
        "kv": (p.head_dim, p.hidden),
        "o_b": (p.hidden, p.o_groups * p.o_lora),
        "idx_q": (p.indexer_heads * p.indexer_dim, p.q_lora),
        "shared_w13": (2 * p.expert_width, p.hidden),
        "shared_w2": (p.hidden, p.expert_width),
    }
    impls = ["torch"] + (["deepgemm"] if importlib.util.find_spec("deep_gemm") else [])
    if _sglang_triton_runs():  # SGLang's fp8_utils imports much of its runtime: where it cannot, the run goes on
        impls.append("sglang_triton")
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", generator=g) / k**0.5
        lins = {i: Linear.make(w, "fp8", i) for i in impls}
        for m in BATCHES:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.double() @ w.double().t()
            row = {"linear": name, "M": m, "N": n, "K": k}
            for i, lin in lins.items():
                out = lin(x)
                row[f"{i}_err"] = ((out.double() - ref).norm() / ref.norm()).item()
                row[f"{i}_us"] = do_bench(lambda lin=lin, x=x: lin(x), rep_ms=rep_ms, cuda_graph=True).median_us
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _glue_rows(rep_ms: float) -> list[dict]:
    import torch

    from kernels.bench import do_bench
    from tuner.targets.workload.gpu_ops import (
        fused_norm_rope,
        quantize_v4,
        sglang_k_norm_rope_store,
        sglang_q_norm_rope,
        store_v4,
    )
    from tuner.targets.workload.ops import NORM_EPS, norm_rope, rope_tables

    L, R = 700, 64
    sq, fq = sglang_q_norm_rope(NORM_EPS), fused_norm_rope(NORM_EPS)
    rows = []
    for b in BATCHES:
        st = rope_tables(b, L, R, "cuda")
        q = (torch.randn(b, 64, 512, device="cuda") * 3).to(torch.bfloat16)
        kv = (torch.randn(b, 512, device="cuda") * 3).to(torch.bfloat16)
        weight = torch.ones(512, device="cuda", dtype=torch.bfloat16)
        cache = quantize_v4(torch.randn(64 * 64, 512, device="cuda"))
        slots = torch.arange(b, device="cuda") * 61 % (64 * 64)
        row = {
            "batch": b,
            "q_sglang_us": do_bench(lambda: sq(q, st), rep_ms=rep_ms).median_us,
            "q_fused_us": do_bench(lambda: fq(q, st), rep_ms=rep_ms).median_us,
            "q_eager_us": do_bench(lambda: norm_rope(q, st["cos"], st["sin"], R), rep_ms=rep_ms).median_us,
            "kv_sglang_us": do_bench(
                lambda: sglang_k_norm_rope_store(kv, weight, 1e-6, st, cache, slots), rep_ms=rep_ms
            ).median_us,
            "kv_fused_us": do_bench(
                lambda: store_v4(cache, fq(kv.unsqueeze(1), st).squeeze(1), slots), rep_ms=rep_ms
            ).median_us,
            "kv_eager_us": do_bench(
                lambda: store_v4(cache, norm_rope(kv, st["cos"], st["sin"], R, weight), slots), rep_ms=rep_ms
            ).median_us,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _step_rows() -> list[dict]:
    import torch

    from tuner.targets.workload.bench import measure
    from tuner.targets.workload.model import DecodeModel, clear_weights
    from tuner.targets.workload.presets import PRESETS

    base = {
        "attention_impl": "flashmla_kv",
        "kv_cache_dtype": "fp8_e4m3",
        "gemm_proj": "fp8",
        "gemm_indexer": "fp8",
        "gemm_moe": "fp8",
        "moe_impl": "triton",
        "glue": "sglang",
        "gemm_impl": "deepgemm" if importlib.util.find_spec("deep_gemm") else "torch",
    }
    if importlib.util.find_spec("deep_gemm"):
        base |= {"indexer_impl": "deepgemm", "indexer_topk": "sglang"}
    cases = [
        ("baseline (SGLang's glue and GEMM backend)", base),
        ("glue=fused (the twin's Triton glue)", {**base, "glue": "fused"}),
        ("glue=eager", {**base, "glue": "eager"}),
    ]
    if _sglang_triton_runs():
        cases.append(("gemm_impl=sglang_triton (--fp8-gemm-backend triton)", {**base, "gemm_impl": "sglang_triton"}))
    rows = []
    for name, knobs in cases:
        model = DecodeModel(PRESETS["dsv4-flash"], knobs, "cuda")
        res = measure(model, list(BATCHES), live_context=512, warmup=3, repeats=10, buckets="pow2:64")
        row = {"case": name, "knobs": knobs, **{f"c{lv.concurrency}_tok_s": lv.tok_s for lv in res.levels}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        clear_weights()
        torch.cuda.empty_cache()
    return rows


def report(data: dict, source: str) -> str:
    m = data["meta"]
    out = [
        "# SGLang's glue and block-FP8 GEMM beside the twin's own (issue 46)",
        "",
        provenance_line(m, "benchmarks/sglang_twin_kernels.py", source),
        "",
        "## GEMM: fp8 block linears, us (median), rel. error vs float64",
        "",
    ]
    impls = [i for i in ("deepgemm", "sglang_triton", "torch") if f"{i}_us" in data["gemm"][0]]
    out.append("| linear | M | N x K | " + " | ".join(impls) + " | sglang_triton / deepgemm |")
    out.append("|---|---|---|" + "---|" * len(impls) + "---|")
    for r in data["gemm"]:
        cells = [f"{r[f'{i}_us']:.1f} ({r[f'{i}_err']:.3f})" for i in impls]
        ratio = (
            f"{r['sglang_triton_us'] / r['deepgemm_us']:.2f}x" if {"deepgemm_us", "sglang_triton_us"} <= set(r) else "-"
        )
        out.append(f"| {r['linear']} | {r['M']} | {r['N']} x {r['K']} | " + " | ".join(cells) + f" | {ratio} |")
    out += [
        "",
        "## Glue: V4's q (64 heads) and KV row (+ the V4 cache write), us (median)",
        "",
        "| batch | q sglang | q fused | q eager | KV sglang | KV fused + write | KV eager + write |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["glue"]:
        out.append(
            f"| {r['batch']} | {r['q_sglang_us']:.1f} | {r['q_fused_us']:.1f} | {r['q_eager_us']:.1f} | "
            f"{r['kv_sglang_us']:.1f} | {r['kv_fused_us']:.1f} | {r['kv_eager_us']:.1f} |"
        )
    if data.get("step"):
        base = data["step"][0]
        out += ["", "## The twin's step (dsv4-flash, live context 512, CUDA graphs): tok/s, and x the baseline", ""]
        out.append("| case | c=1 | c=16 | c=64 |")
        out.append("|---|---|---|---|")
        for r in data["step"]:
            cells = [
                f"{r[f'c{c}_tok_s']:.1f} ({r[f'c{c}_tok_s'] / base[f'c{c}_tok_s']:.2f}x)"
                for c in BATCHES
                if f"c{c}_tok_s" in r
            ]
            out.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _measure(a) -> dict:
    data = {"meta": run_meta(a.rep_ms), "gemm": _gemm_rows(a.rep_ms), "glue": _glue_rows(a.rep_ms)}
    Path(a.json).write_text(json.dumps(data, indent=1))  # kept if the step cases fail
    if not a.no_step:
        data["step"] = _step_rows()
    return data


def main() -> int:
    return json_report_main(
        __doc__,
        _measure,
        report,
        add_args=lambda ap: ap.add_argument("--no-step", action="store_true", help="skip the whole-step cases"),
    )


if __name__ == "__main__":
    raise SystemExit(main())
