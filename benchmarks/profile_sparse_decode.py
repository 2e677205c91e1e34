"""One call of each sparse decode variant, for Nsight Compute; and a summary of what ncu measured.

Run under ncu, which profiles only the calls between ``cudaProfilerStart`` and ``cudaProfilerStop``::

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats \\
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__sass_inst_executed_op_local_ld.sum \\
        --csv --page raw python3 benchmarks/profile_sparse_decode.py > ncu.csv
    python3 benchmarks/profile_sparse_decode.py --summarise ncu.csv

Cases (V4-Flash shapes, fresh random inputs, each checked against the float32 reference first): the issue's batch-1
config (S=32, BLOCK_H=16, BLOCK_T=16, 4 warps, 2 stages) in the previous kernel and in this one, and this one's
shipped config at batch 1, 16 and 64 for the bf16 and the fp8 cache, and 64-head tiles on 16 warps at batch 16 and 64
(not in the search space: tried on 2026-11-30 and slower everywhere; the profile shows why).
``--gemm``: the decode GEMMs instead (``gemm_cases``), the Triton kernel at its shipped config beside cuBLAS.
``--wgmma``: the Gluon wgmma kernel beside the tl.dot kernel's shipped configs (``wgmma_cases``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

ISSUE_CFG = {"S": 32, "BLOCK_H": 16, "BLOCK_T": 16, "num_warps": 4, "num_stages": 2}
COLUMNS = {  # ncu raw metric -> short name
    "gpu__time_duration.sum": "time_ns",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_%",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_%",
    "dram__bytes_read.sum": "dram_read",
    "lts__t_sector_hit_rate.pct": "l2_hit_%",
    "smsp__sass_inst_executed_op_local_ld.sum": "local_loads",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_%",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_%",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles/issue",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "wgmma_pipe_%",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "mma_pipe_%",
    "smsp__inst_executed.sum": "warp_insts",
}


def run_cases() -> None:
    from benchmarks.baselines.sparse_decode_v1 import sparse_decode_v1
    from kernels import get_kernel
    from kernels.configs import lookup

    sd = get_kernel("sparse_decode")
    cases = []
    b1 = sd.shapes("v4flash")[0]
    cases.append(
        (
            "v1 B=1 issue cfg",
            b1,
            "bfloat16",
            lambda i: sparse_decode_v1(i["q"], i["kv"], i["indices"], i["sm_scale"], ISSUE_CFG),
        )
    )
    cases.append(("new B=1 issue cfg", b1, "bfloat16", lambda i: sd.run(i, ISSUE_CFG)))
    for dtype in ("bfloat16", "float8_e4m3fn"):
        for shape in sd.shapes("v4flash"):
            cfg = lookup("sparse_decode", shape, dtype, "cuda")
            cases.append((f"new B={shape['batch']} {dtype} shipped {cfg}", shape, dtype, lambda i, c=cfg: sd.run(i, c)))
    for shape in sd.shapes("v4flash")[1:]:  # 64-head tiles on 16 warps (four warpgroups): 64 accumulator registers
        cfg = {"S": 4 if shape["batch"] == 16 else 2, "BLOCK_H": 64, "BLOCK_T": 64, "num_warps": 16, "num_stages": 2}
        cases.append((f"new B={shape['batch']} bfloat16 {cfg}", shape, "bfloat16", lambda i, c=cfg: sd.run(i, c)))
    profile([(name, sd, shape, dtype, fn) for name, shape, dtype, fn in cases])


def wgmma_cases() -> list:
    """bf16 cache: the Gluon wgmma kernel (``kernels.sparse_decode_wgmma``) at its default config for each batch in
    both schedules (WS 0: every warp gathers and computes; 1: a producer warpgroup gathers; a SPLIT_WG default: it
    and the same without SPLIT_WG, 64-row tiles in a ring of two), at batch 64 with one program a request (each
    walks all 10 tiles and all of V's columns: the cost of a tile) and SEESAW at two splits, beside the tl.dot
    kernel's shipped config."""
    from kernels import get_kernel
    from kernels.configs import lookup
    from kernels.sparse_decode import sparse_decode
    from kernels.sparse_decode_wgmma import default_config, sparse_decode_wgmma

    sd = get_kernel("sparse_decode")
    cases = []
    for shape in sd.shapes("v4flash"):
        shipped = lookup("sparse_decode", shape, "bfloat16", "cuda")
        cases.append(
            (
                f"B={shape['batch']} tl.dot {shipped}",
                sd,
                shape,
                "bfloat16",
                lambda i, c=shipped: sparse_decode(i["q"], i["kv"], i["indices"], i["sm_scale"], c, d_v=i["d_v"]),
            )
        )
        base = default_config(shape["batch"], shape["topk"])
        picks = [base] + ([{**base, "S": 1, "V_SPLIT": 1}] if shape["batch"] == 64 else [])
        if base["SPLIT_WG"]:  # the default without SPLIT_WG: 64-row tiles, a ring of two, both warpgroups a tile
            picks = [
                base,
                {**base, "SPLIT_WG": 0, "BLOCK_T": 64, "STAGES": 2},
                {**base, "SPLIT_WG": 0, "BLOCK_T": 64, "STAGES": 2, "S": 1, "V_SPLIT": 1},
            ]
        for cfg in [{**c, "WS": ws} for c in picks for ws in (0, 1) if not (c["SPLIT_WG"] and ws == 0)]:
            cases.append(
                (
                    f"B={shape['batch']} wgmma {cfg}",
                    sd,
                    shape,
                    "bfloat16",
                    lambda i, c=cfg: sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], c),
                )
            )
    return cases


def gemm_cases() -> list:
    """The decode GEMMs at two V4-Flash shapes (N x K = 4096 x 1024, 1024 x 4096; M = 1, 16, 64), bf16: the Triton
    kernel at its shipped tuned config and the library (cuBLAS through torch), one call each."""
    from kernels import get_kernel
    from kernels.configs import lookup
    from kernels.gemm import gemm, torch_linear

    gm = get_kernel("gemm")
    cases = []
    for n, k in ((4096, 1024), (1024, 4096)):
        for m in (1, 16, 64):
            shape = {"M": m, "N": n, "K": k}
            cfg = lookup("gemm", shape, "bfloat16", "cuda")
            cases.append((f"gemm triton {shape} {cfg}", shape, lambda i, c=cfg: gemm(i["x"], i["w"], "bf16", c)))
            cases.append((f"gemm cuBLAS {shape}", shape, lambda i: torch_linear(i["x"], i["w"], "bf16")))
    return [(name, gm, shape, "bfloat16", fn) for name, shape, fn in cases]


def source_summary(path: Path, top: int = 45) -> str:
    """Where a kernel's warp-stall samples fall (ncu ``--page source --csv --print-source sass``): by program region
    (before the first wgmma, up to the last, after it), by kind of instruction, and the ``top`` SASS lines in program
    order with their share of the samples."""
    text = path.read_text(errors="replace")
    start = text.find('"Address"') if '"Address"' in text else text.find('"#"')
    rows = list(csv.reader(text[start:].splitlines()))
    header, data = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    src = next((i for i, h in enumerate(header) if h == "Source"), None)
    if col is None or src is None:
        return "no 'Warp Stall Sampling (All Samples)' / 'Source' columns; header: " + ", ".join(header[:40])

    def num(x: str) -> float:
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[col]) for r in data) or 1.0
    ranked = sorted(range(len(data)), key=lambda i: -num(data[i][col]))[:top]
    lines = [f"{len(data)} SASS lines, {total:.0f} stall samples"]
    # by kind of instruction, and by program region: before the first tensor-core instruction, up to the last one,
    # after it (for a kernel whose main loop holds its products, the prologue, the loop and the epilogue)
    # first match wins: the wgmma waits (WARPGROUP.DEPBAR) before the cp.async waits (DEPBAR.LE SB...)
    kinds = {
        "wgmma and its waits": ("HGMMA", "WARPGROUP"),
        "global store": ("STG",),
        "global load": ("LDG.",),
        "cp.async": ("LDGSTS", "LDGDEPBAR", "DEPBAR"),
        "barrier": ("BAR.SYNC", "BAR.ARV"),
        "shared": ("LDS", "STS"),
        "exp2": ("MUFU",),
    }
    by_kind = {k: 0.0 for k in kinds}
    for r in data:
        op = r[src].split("  ")[-1].strip()
        for k, prefixes in kinds.items():
            if any(p in op for p in prefixes):
                by_kind[k] += num(r[col])
                break
    mma = [i for i, r in enumerate(data) if "HGMMA" in r[src] or "WARPGROUP" in r[src]]
    if mma:
        parts = {
            "before the first wgmma": data[: mma[0]],
            "the wgmma region": data[mma[0] : mma[-1] + 1],
            "after the last wgmma": data[mma[-1] + 1 :],
        }
        lines.append(
            "by region: " + ", ".join(f"{k} {100 * sum(num(r[col]) for r in v) / total:.1f}%" for k, v in parts.items())
        )
    lines.append("by instruction: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_kind.items()))
    lines.append(f"the top {top} lines in program order:")
    for i in sorted(ranked):
        lines.append(f"{i:5d} {100 * num(data[i][col]) / total:5.1f}%  {data[i][src][:110]}")
    return "\n".join(lines)


def profile(cases, only=()) -> None:
    """Check each case against its kernel's reference (and compile it), then run each once between profiler marks;
    with ``only``, just the cases whose name contains one of its strings."""
    import torch

    from kernels.base import rel_error

    prepared = []
    for name, kernel, shape, dtype, fn in [c for c in cases if not only or any(o in c[0] for o in only)]:
        inputs = kernel.make_inputs(shape, dtype, "cuda", seed=7)
        try:
            err = rel_error(fn(inputs), kernel.reference(inputs))  # also compiles
        except Exception as exc:  # noqa: BLE001 - a config the GPU refuses (out of resources) is left out, said why
            print(f"{name}: not profiled: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            continue
        print(f"{name}: rel error {err:.2e}", file=sys.stderr)
        prepared.append((fn, inputs))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn, inputs in prepared:
        fn(inputs)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def summarise(path: Path) -> str:
    """One line per profiled kernel: time, DRAM and SM throughput, registers, occupancy, top stall reasons."""
    text = path.read_text()
    start = text.find('"ID"')
    rows = list(csv.reader(text[start:].splitlines()))
    header, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    stall_cols = [i for i, h in enumerate(header) if "issue_stalled" in h]
    ratio_cols = [i for i in stall_cols if header[i].endswith("per_issue_active.ratio")]
    stall_cols = ratio_cols or stall_cols  # cycles stalled per issued instruction, by reason
    lines = []
    for r in data:
        rec = {short: r[header.index(col)] for col, short in COLUMNS.items() if col in header}
        stalls = []
        for i in stall_cols:
            try:
                stalls.append((float(r[i].replace(",", "")), header[i].split("issue_stalled_")[1].split("_per_")[0]))
            except ValueError:
                continue
        top = ", ".join(f"{name} {v:.2f}" for v, name in sorted(stalls, reverse=True)[:4])
        lines.append(
            f"{r[header.index('Kernel Name')][:40]:40s} "
            + " ".join(f"{k}={v}" for k, v in rec.items())
            + (f" | top stalls: {top}" if top else "")
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarise", type=Path, default=None, help="print a summary of an ncu --csv --page raw file")
    ap.add_argument("--gemm", action="store_true", help="profile the decode GEMMs (gemm_cases) instead")
    ap.add_argument("--wgmma", action="store_true", help="profile the Gluon wgmma kernel (wgmma_cases)")
    ap.add_argument("--case", action="append", default=[], help="only the cases whose name contains this (repeatable)")
    ap.add_argument(
        "--source-summary",
        type=Path,
        default=None,
        help="print the SASS lines that hold most warp-stall samples in an `ncu --page source --csv` file",
    )
    args = ap.parse_args(argv)
    if args.summarise:
        print(summarise(args.summarise))
        return 0
    if args.source_summary:
        print(source_summary(args.source_summary))
        return 0

    if args.gemm:
        profile(gemm_cases(), args.case)
    elif args.wgmma:
        profile(wgmma_cases(), args.case)
    else:
        run_cases()
    return 0


if __name__ == "__main__":
    sys.exit(main())
