"""Side by side: the SGLang plug-in's kernels beside the SGLang functions they would replace, on SGLang's arguments.

For now one replacement: ``sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope`` (V4's decode q path:
RMSNorm of each head without weight, interleaved rope on the last 64 dims) against ``kernels/sglang_q_norm_rope.py``.
Per batch (1/16/64 by default), on a GPU:

1. builds SGLang's own kernel (its JIT needs ``apache-tvm-ffi``); where it cannot, says so once and times ours beside
   a torch implementation of the same semantics instead, every record labelled ``baseline: torch`` (such a record
   never ships in a plug-in);
2. checks ours against SGLang's output (relative norm error) for each config of a small sweep, keeps the fastest
   correct one, captures it in a CUDA graph and checks the replay against eager;
3. times both with ``triton.testing.do_bench`` (median), and writes the records (``tuner.export.sglang_plugin
   .SideBySide``) as JSON: ``$OUT/sglang_plugin_kernels.json`` (``--out``), with a short report beside it.

``--store STUDY --storage URL [--from FILE]`` stores the records of a run (this one, or a JSON written earlier) into
a study, where ``tuner export`` reads them (no GPU needed for that step).

    OUT=/tmp/out TUNER_COMMIT=$(git rev-parse --short HEAD) python benchmarks/sglang_plugin_kernels.py
    python benchmarks/sglang_plugin_kernels.py --store STUDY --storage sqlite:///tuner.db --from out/sglang_plugin_kernels.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

TARGET = "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope"
CONFIGS = [{"BLOCK_H": h, "num_warps": w} for h in (1, 2, 4, 8) for w in (1, 2, 4, 8)]


def torch_q_norm_rope(q_input, q_output, eps, freqs_cis, positions):
    """SGLang's ``fused_q_norm_rope`` semantics in torch ops (the stand-in where SGLang's kernel cannot be built)."""
    import torch

    x = q_input.float()
    if eps is not None:
        x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(q_input.dtype).float()
    B, H, D = x.shape
    R = 2 * freqs_cis.shape[-1]
    rope = torch.view_as_complex(x[..., D - R :].reshape(B, H, R // 2, 2).contiguous()) * freqs_cis[positions][:, None]
    q_output[..., : D - R] = x[..., : D - R].to(q_output.dtype)
    q_output[..., D - R :] = torch.view_as_real(rope).flatten(-2).to(q_output.dtype)


def sglang_kernel(say):
    """SGLang's ``fused_q_norm_rope`` when its JIT builds here, else None (said once, with the reason)."""
    try:
        from sglang.kernels.ops.attention.dsv4.norm_rope import fused_q_norm_rope

        return fused_q_norm_rope
    except Exception as exc:  # noqa: BLE001 - the reason is the report's
        say(
            f"SGLang's fused_q_norm_rope cannot be imported here ({type(exc).__name__}: {exc}); timing ours beside "
            "a torch implementation of the same semantics, labelled baseline=torch"
        )
        return None


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def inputs(batch, heads, head_dim, rope_dim, dtype, seed, max_pos=4096):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, head_dim, generator=g, device="cuda").mul_(3).to(dtype)
    ang = torch.rand(max_pos, rope_dim // 2, generator=g, device="cuda") * 6.2832
    freqs = torch.polar(torch.ones_like(ang), ang)
    pos = torch.randint(0, max_pos, (batch,), generator=g, device="cuda")
    return q, freqs, pos


def measure(args, say) -> list[dict]:
    import torch
    import triton
    import triton.testing

    from kernels.sglang_q_norm_rope import DEFAULT_CONFIG, fused_q_norm_rope

    dtype = getattr(torch, args.dtype)
    theirs = sglang_kernel(say)
    baseline = "sglang"
    if theirs is not None:
        try:  # the JIT builds on the first call
            q, f, p = inputs(1, args.heads, args.head_dim, args.rope_dim, dtype, 0)
            theirs(q, torch.empty_like(q), args.eps, f, p)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            say(
                f"SGLang's fused_q_norm_rope does not build or run here ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); timing ours beside a torch implementation of the "
                "same semantics, labelled baseline=torch"
            )
            theirs = None
    if theirs is None:
        theirs, baseline = torch_q_norm_rope, "torch"
    try:
        from importlib.metadata import version

        release = version("sglang")
    except Exception:  # noqa: BLE001 - named in the records
        release = "not installed"
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "arch": "sm_%d%d" % torch.cuda.get_device_capability(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M"),
        "sglang": release,
        "commit": os.environ.get("TUNER_COMMIT") or os.environ.get("KERNELS_GIT_COMMIT") or _commit(),
    }
    records = []
    for batch in args.batches:
        q, freqs, pos = inputs(batch, args.heads, args.head_dim, args.rope_dim, dtype, seed=batch)
        ref = torch.full_like(q, float("nan"))
        theirs(q, ref, args.eps, freqs, pos)
        best = None
        for cfg in [DEFAULT_CONFIG, *CONFIGS]:
            out = torch.full_like(q, float("nan"))
            try:
                fused_q_norm_rope(q, out, args.eps, freqs, pos, cfg)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a config that fails is a data point
                say(f"  batch {batch} {cfg}: failed ({type(exc).__name__})")
                continue
            err = rel(out, ref)
            if not err <= args.tolerance:
                say(f"  batch {batch} {cfg}: rel err {err:.3g} > {args.tolerance}: not timed")
                continue
            us = 1e3 * triton.testing.do_bench(
                lambda c=cfg, o=out: fused_q_norm_rope(q, o, args.eps, freqs, pos, c),
                warmup=25,
                rep=args.rep_ms,
                return_mode="median",
            )
            if best is None or us < best[0]:
                best = (us, cfg, err)
        if best is None:
            say(f"batch {batch}: no config of ours matched {baseline}'s output; no record")
            continue
        us, cfg, err = best
        # the CUDA graph SGLang's decode runs under: capture ours, replay, compare with eager
        out_g = torch.full_like(q, float("nan"))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fused_q_norm_rope(q, out_g, args.eps, freqs, pos, cfg)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        out_g.fill_(float("nan"))
        with torch.cuda.graph(graph):
            fused_q_norm_rope(q, out_g, args.eps, freqs, pos, cfg)
        graph.replay()
        torch.cuda.synchronize()
        graph_err = rel(out_g, ref)
        if not graph_err <= args.tolerance:
            say(
                f"batch {batch}: ours replayed from a CUDA graph differs from {baseline}'s output ({graph_err:.3g}); "
                "no record"
            )
            continue
        ref_out = torch.empty_like(q)
        # the chosen config (the best of several medians) and SGLang's, timed again in alternating rounds: the
        # plug-in ships a batch only where ours was faster in every round (tuner.export.sglang_plugin.choose)
        ours_rounds, theirs_rounds = [], []
        for _ in range(args.rounds):
            ours_rounds.append(
                1e3
                * triton.testing.do_bench(
                    lambda: fused_q_norm_rope(q, out_g, args.eps, freqs, pos, cfg),
                    warmup=25,
                    rep=args.rep_ms,
                    return_mode="median",
                )
            )
            theirs_rounds.append(
                1e3
                * triton.testing.do_bench(
                    lambda: theirs(q, ref_out, args.eps, freqs, pos), warmup=25, rep=args.rep_ms, return_mode="median"
                )
            )
        us, theirs_us = statistics.median(ours_rounds), statistics.median(theirs_rounds)
        rec = {
            "target": TARGET,
            "batch": batch,
            "baseline": baseline,
            "config": cfg,
            "shape": {
                "heads": args.heads,
                "head_dim": args.head_dim,
                "rope_dim": args.rope_dim,
                "norm": args.eps is not None,
            },
            "dtypes": {"dtype": args.dtype, "out_dtype": args.dtype},
            "ours_us": us,
            "sglang_us": theirs_us,
            "rel_err": err,
            "graph_rel_err": graph_err,
            "ours_rounds_us": ours_rounds,
            "sglang_rounds_us": theirs_rounds,
            **meta,
        }
        say(
            f"batch {batch}: ours {us:.2f} us ({cfg}) vs {baseline} {theirs_us:.2f} us; rel err {err:.2g}, "
            f"CUDA graph replay {graph_err:.2g}"
        )
        records.append(rec)
    return records


def _commit() -> str:
    from benchmarks.common import short_commit

    return short_commit()


def store(study: str, url: str, path: Path) -> int:
    from storage import Repo
    from tuner.export.sglang_plugin import SideBySide, store_records

    doc = json.loads(path.read_text())
    records = [SideBySide.from_dict(dict(r, source=r.get("source") or str(path))) for r in doc["records"]]
    store_records(Repo(url), study, records, path.stem + "-" + (records[0].date if records else "empty"))
    print(f"stored {len(records)} side-by-side record(s) from {path} into study {study!r}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--heads", type=int, default=64, help="q heads per rank (V4-Flash at TP 1: 64)")
    ap.add_argument("--head-dim", type=int, default=512)
    ap.add_argument("--rope-dim", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--eps", type=float, default=1e-6, help="the model's rms_norm_eps")
    ap.add_argument("--no-norm", action="store_true", help="eps=None: SGLang's rope-only q path")
    ap.add_argument("--tolerance", type=float, default=2e-2, help="rel norm error vs SGLang's output (bf16)")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="alternating repeats of ours (chosen) and SGLang's")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/gpu-run")))
    ap.add_argument("--store", metavar="STUDY")
    ap.add_argument("--storage", metavar="URL")
    ap.add_argument("--from", dest="from_json", type=Path, help="store the records of this JSON (no GPU needed)")
    args = ap.parse_args(argv)
    if args.no_norm:
        args.eps = None
    if args.store and not args.storage:
        print("error: --store needs --storage URL (the study's database, e.g. sqlite:///tuner.db)", file=sys.stderr)
        return 2
    if args.from_json:
        if not args.store:
            print("error: --from FILE only stores records: give --store STUDY --storage URL", file=sys.stderr)
            return 2
        return store(args.store, args.storage, args.from_json)
    import torch

    if not torch.cuda.is_available():
        print(
            "error: no CUDA device: this benchmark times GPU kernels; run it on the H200 "
            "(or store an earlier run with --from FILE)",
            file=sys.stderr,
        )
        return 2
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    records = measure(args, say)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sglang_plugin_kernels.json"
    for r in records:
        r["source"] = path.name
    path.write_text(json.dumps({"records": records}, indent=1) + "\n")
    head = (
        f"# SGLang plug-in kernels beside SGLang's own ({records[0]['gpu']}, {records[0]['date']} UTC, commit "
        f"{records[0]['commit']}, SGLang {records[0]['sglang']}; benchmarks/sglang_plugin_kernels.py)"
        if records
        else "# SGLang plug-in kernels beside SGLang's own: no record"
    )
    (args.out / "sglang_plugin_kernels.md").write_text(
        "\n".join([head, "", *lines, "", f"records: {path.name}"]) + "\n"
    )
    print(f"wrote {path}")
    if args.store:
        return store(args.store, args.storage, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
