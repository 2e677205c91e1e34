"""The plug-in's kernels timed beside the SGLang functions they would replace, on SGLang's arguments, on a GPU.

The search runs this after its trials, on the GPU it searched on, for the shapes the deployment runs
(``python -m tuner.export.sglang_plugin_measure``, a child process: the driver imports no CUDA); the records it
prints are :class:`tuner.export.sglang_plugin.SideBySide` dictionaries, stored in the study, from which
``tuner export`` chooses what ships (:func:`tuner.export.sglang_plugin.choose`). ``benchmarks/sglang_plugin_kernels.py``
runs the same measurement on its own and files it.

One replacement so far: ``sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope`` (V4's decode q path:
RMSNorm of each head without weight, interleaved RoPE on the last 64 dims) against ``kernels/sglang_q_norm_rope.py``.
Per batch size:

1. SGLang's own kernel (its JIT needs ``apache-tvm-ffi`` and nvcc); where it cannot build, ours is timed beside a
   torch implementation of the same semantics instead, every record labelled ``baseline: torch`` (such a record
   never ships);
2. each config of a small sweep checked against SGLang's output (relative norm error), the fastest correct one kept,
   captured in a CUDA graph and its replay checked;
3. the kept config and SGLang's kernel timed again in alternating rounds (``triton.testing.do_bench`` medians): a
   batch ships only where ours was faster in every round.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

TARGET = "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope"
CONFIGS = [{"BLOCK_H": h, "num_warps": w} for h in (1, 2, 4, 8) for w in (1, 2, 4, 8)]


@dataclass(frozen=True)
class QCase:
    """The q path's shape and timing settings (V4-Flash at TP 1 by default)."""

    batches: tuple[int, ...] = (1, 16, 64)
    heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    dtype: str = "bfloat16"
    eps: float | None = 1e-6
    """The model's rms_norm_eps; None: SGLang's rope-only q path."""
    tolerance: float = 2e-2
    rep_ms: int = 200
    rounds: int = 5
    commit: str = ""


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


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _inputs(batch, c: QCase, seed, max_pos=4096):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, c.heads, c.head_dim, generator=g, device="cuda").mul_(3).to(getattr(torch, c.dtype))
    ang = torch.rand(max_pos, c.rope_dim // 2, generator=g, device="cuda") * 6.2832
    freqs = torch.polar(torch.ones_like(ang), ang)
    pos = torch.randint(0, max_pos, (batch,), generator=g, device="cuda")
    return q, freqs, pos


def _sglangs(c: QCase, say: Callable[[str], None]):
    """SGLang's ``fused_q_norm_rope`` built and run once here, else None (said once, with the reason)."""
    import torch

    try:
        from sglang.kernels.ops.attention.dsv4.norm_rope import fused_q_norm_rope

        q, f, p = _inputs(1, c, 0)
        fused_q_norm_rope(q, torch.empty_like(q), c.eps, f, p)  # the JIT builds on the first call
        torch.cuda.synchronize()
        return fused_q_norm_rope
    except Exception as exc:  # noqa: BLE001 - the reason goes into the output
        say(
            f"SGLang's fused_q_norm_rope does not build or run here ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); timing ours beside a torch implementation of the "
            "same semantics, labelled baseline=torch (such records never ship)"
        )
        return None


def measure(c: QCase, say: Callable[[str], None]) -> list[dict]:
    """The side-by-side records of the q path at each of ``c.batches`` (a batch with no correct config: none)."""
    import torch
    import triton.testing

    from kernels.sglang_q_norm_rope import DEFAULT_CONFIG, fused_q_norm_rope

    def bench(fn) -> float:
        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=c.rep_ms, return_mode="median")

    theirs, baseline = _sglangs(c, say), "sglang"
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
        "commit": c.commit,
    }
    records = []
    for batch in c.batches:
        q, freqs, pos = _inputs(batch, c, seed=batch)
        ref = torch.full_like(q, float("nan"))
        theirs(q, ref, c.eps, freqs, pos)
        best = None
        for cfg in [DEFAULT_CONFIG, *CONFIGS]:
            out = torch.full_like(q, float("nan"))
            try:
                fused_q_norm_rope(q, out, c.eps, freqs, pos, cfg)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a config that fails is a data point
                say(f"  batch {batch} {cfg}: failed ({type(exc).__name__})")
                continue
            err = _rel(out, ref)
            if not err <= c.tolerance:
                say(f"  batch {batch} {cfg}: rel err {err:.3g} > {c.tolerance}: not timed")
                continue
            us = bench(lambda cfg=cfg, out=out: fused_q_norm_rope(q, out, c.eps, freqs, pos, cfg))
            if best is None or us < best[0]:
                best = (us, cfg, err)
        if best is None:
            say(f"batch {batch}: no config of ours matched {baseline}'s output; no record")
            continue
        _, cfg, err = best
        # the CUDA graph SGLang's decode runs under: capture ours, replay, compare with eager
        out_g = torch.full_like(q, float("nan"))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fused_q_norm_rope(q, out_g, c.eps, freqs, pos, cfg)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        out_g.fill_(float("nan"))
        with torch.cuda.graph(graph):
            fused_q_norm_rope(q, out_g, c.eps, freqs, pos, cfg)
        graph.replay()
        torch.cuda.synchronize()
        graph_err = _rel(out_g, ref)
        if not graph_err <= c.tolerance:
            say(f"batch {batch}: ours replayed from a CUDA graph differs from {baseline}'s output ({graph_err:.3g})")
            continue
        ref_out = torch.empty_like(q)
        ours_rounds, theirs_rounds = [], []
        for _ in range(c.rounds):  # alternating: a drift of the clock or the neighbours hits both
            ours_rounds.append(bench(lambda: fused_q_norm_rope(q, out_g, c.eps, freqs, pos, cfg)))
            theirs_rounds.append(bench(lambda: theirs(q, ref_out, c.eps, freqs, pos)))
        us, theirs_us = statistics.median(ours_rounds), statistics.median(theirs_rounds)
        records.append(
            {
                "target": TARGET,
                "batch": batch,
                "baseline": baseline,
                "config": cfg,
                "shape": {"heads": c.heads, "head_dim": c.head_dim, "rope_dim": c.rope_dim, "norm": c.eps is not None},
                "dtypes": {"dtype": c.dtype, "out_dtype": c.dtype},
                "ours_us": us,
                "sglang_us": theirs_us,
                "rel_err": err,
                "graph_rel_err": graph_err,
                "ours_rounds_us": ours_rounds,
                "sglang_rounds_us": theirs_rounds,
                **meta,
            }
        )
        say(
            f"batch {batch}: ours {us:.2f} us ({cfg}) vs {baseline} {theirs_us:.2f} us; rel err {err:.2g}, "
            f"CUDA graph replay {graph_err:.2g}"
        )
    return records


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tuner.export.sglang_plugin_measure", description=__doc__.split("\n")[0]
    )
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
    ap.add_argument("--commit", default=os.environ.get("TUNER_COMMIT", ""), help="the commit the records name")
    return ap


def case_of(args: argparse.Namespace) -> QCase:
    for name in ("batches", "heads", "head_dim", "rope_dim", "rep_ms", "rounds"):
        vals = getattr(args, name)
        if any(v < 1 for v in (vals if isinstance(vals, list) else [vals])):
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, but got {vals}")
    return QCase(
        tuple(args.batches),
        args.heads,
        args.head_dim,
        args.rope_dim,
        args.dtype,
        None if args.no_norm else args.eps,
        args.tolerance,
        args.rep_ms,
        args.rounds,
        args.commit,
    )


def main(argv: list[str] | None = None) -> int:
    """Print each progress line to stderr and, last, one JSON line ``{"records": [...], "lines": [...]}``."""
    c = case_of(parser().parse_args(argv))
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device: the side by side times GPU kernels", file=sys.stderr)
        return 2
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        lines.append(line)

    records = measure(c, say)
    print(json.dumps({"records": records, "lines": lines}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
