"""How fast the tensor cores run the two products of the wgmma sparse decode, alone (issue 20's "what limits it").

A Gluon kernel repeats one product ``R`` times on operands that stay in shared memory (and registers), one warpgroup
a program, one or two programs an SM, 132 programs an SM-row, nothing else: no gathers, no softmax, no handshakes.
The products are the sparse decode's:

* ``SS``: S = q K^T, both operands from shared memory: A = q [64, 512], B = a tile of ``N`` rows [N, 512] (K-major),
  a chain of 32 ``wgmma`` m64nNk16 (``N`` = BLOCK_T, 32 or 64; 128 for reference);
* ``RS``: O += P V, A = P from registers [64, K], B = V [K, N] from shared memory (N-major, as the kernel reads a
  tile's first columns), K = BLOCK_T, N = the program's columns of V (256 at ``V_SPLIT=2``, 128 at 4).
* ``RS`` with N = BLOCK_T and K = 512: the scores' product with q in registers (what q in registers would buy).

Each (mode, N, K, programs an SM) is timed with CUDA events over whole launches (median of 5 after a warm-up);
reported as TFLOP/s over the GPU and as ns a product a program, and, from those, the time the batch-64 default's
products take on an SM when nothing else costs anything: ``projection`` = tiles x (ns of its scores' product +
ns of its PV product), at two programs an SM (the two compute warpgroups).

    python3 benchmarks/wgmma_rates.py --json OUT.json                   # on an H200
    python3 benchmarks/wgmma_rates.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

# (mode, N, K): the scores' product per tile size, the PV product per tile size and column share, and references
CASES = [
    ("SS", 32, 512),
    ("SS", 64, 512),
    ("SS", 128, 512),
    ("RS", 32, 512),
    ("RS", 64, 512),
    ("RS", 256, 32),
    ("RS", 256, 64),
    ("RS", 128, 32),
    ("RS", 128, 64),
]
PER_SM = (1, 2)


def _kernels():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

    barrier = getattr(gl, "thread_barrier", None) or gl.barrier

    @gluon.jit
    def products(
        a_ptr, b_ptr, out_ptr, R, MODE_RS: gl.constexpr, N: gl.constexpr, K: gl.constexpr, B_KMAJOR: gl.constexpr
    ):
        copy_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        sl: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128 if (K if B_KMAJOR else N) >= 64 else 64, element_bitwidth=16, rank=2
        )
        a_sl: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128 if K >= 64 else K * 2, element_bitwidth=16, rank=2
        )
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
        offs_m = gl.arange(0, 64, layout=gl.SliceLayout(1, copy_l))
        offs_k = gl.arange(0, K, layout=gl.SliceLayout(0, copy_l))
        a = gl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :])
        if B_KMAJOR:  # B^T stored [N, K] (a tile of rows), used permuted
            offs_n = gl.arange(0, N, layout=gl.SliceLayout(1, copy_l))
            b_smem = gl.allocate_shared_memory(gl.bfloat16, [N, K], sl)
            b_smem.store(gl.load(b_ptr + offs_n[:, None] * K + offs_k[None, :]))
        else:  # B stored [K, N] (V's first N columns of K rows)
            offs_kr = gl.arange(0, K, layout=gl.SliceLayout(1, copy_l))
            offs_nc = gl.arange(0, N, layout=gl.SliceLayout(0, copy_l))
            b_smem = gl.allocate_shared_memory(gl.bfloat16, [K, N], sl)
            b_smem.store(gl.load(b_ptr + offs_kr[:, None] * N + offs_nc[None, :]))
        acc = gl.zeros([64, N], gl.float32, acc_l)
        if MODE_RS:
            a_op = gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2))
            fence_async_shared()
            barrier()
            for _ in range(R):
                if B_KMAJOR:
                    acc = warpgroup_mma(a_op, b_smem.permute((1, 0)), acc)
                else:
                    acc = warpgroup_mma(a_op, b_smem, acc)
        else:
            a_smem = gl.allocate_shared_memory(gl.bfloat16, [64, K], a_sl)
            a_smem.store(a)
            fence_async_shared()
            barrier()
            for _ in range(R):
                acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), acc)
        offs_o = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
        offs_c = gl.arange(0, N, layout=gl.SliceLayout(0, acc_l))
        gl.store(out_ptr + gl.program_id(0) * 64 * N + offs_o[:, None] * N + offs_c[None, :], acc)

    return products


def measure(args, json_path: Path) -> dict:
    import torch
    import triton

    from benchmarks.common import short_commit as _commit

    products = _kernels()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": _commit(),
        "sms": sms,
    }
    rows = []
    for mode, n, k in CASES:
        b_kmajor = mode == "SS" or k == 512  # the scores' product reads a tile of rows; PV reads V's columns
        a = torch.randn(64, k, device="cuda").to(torch.bfloat16) * 0.01
        b = (torch.randn(n, k, device="cuda") if b_kmajor else torch.randn(k, n, device="cuda")).to(
            torch.bfloat16
        ) * 0.01
        for per_sm in PER_SM:
            grid = sms * per_sm
            out = torch.empty(grid, 64, n, device="cuda", dtype=torch.float32)
            reps = max(200, int(args.work // (64 * n * k)))

            def launch(r=reps):
                products[(grid,)](a, b, out, r, MODE_RS=mode == "RS", N=n, K=k, B_KMAJOR=b_kmajor, num_warps=4)

            try:
                launch(4)  # compile, and check one product against torch
            except Exception as exc:  # noqa: BLE001 - a case the GPU refuses (shared memory) is data
                rows.append(
                    {"mode": mode, "N": n, "K": k, "per_sm": per_sm, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                )
                print(f"{mode} N={n} K={k} x{per_sm}: {rows[-1]['error']}", flush=True)
                continue
            ref = (a.float() @ (b.float().t() if b_kmajor else b.float())) * 4
            err = ((out[0] - ref).norm() / ref.norm()).item()
            launch()
            times = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)  # µs
            us = statistics.median(times)
            row = {
                "mode": mode,
                "N": n,
                "K": k,
                "per_sm": per_sm,
                "reps": reps,
                "us": us,
                "err": err,
                "tflops": 2 * 64 * n * k * reps * grid / (us * 1e-6) / 1e12,
                "ns_per_product": us * 1e3 / reps,
            }  # one program's product; per_sm programs share an SM
            rows.append(row)
            print(
                f"{mode} N={n} K={k} x{per_sm}: {row['tflops']:.0f} TFLOP/s, {row['ns_per_product']:.0f} ns a "
                f"product a program, rel err {err:.1e}",
                flush=True,
            )
    data = {"meta": meta, "rows": rows}
    return data


def projection(data: dict, qk_n: int, pv_n: int, pv_k: int, pairs: int) -> float | None:
    """µs an SM spends on ``pairs`` (scores' product, PV product) pairs, two warpgroups sharing the SM (per_sm=2:
    each product's ns is for one of two concurrent programs, so an SM finishes two products in that time): the
    scores' product m64 x ``qk_n`` x 512, the PV product m64 x ``pv_n`` x ``pv_k``."""
    by = {(r["mode"], r["N"], r["K"], r["per_sm"]): r["ns_per_product"] for r in data["rows"] if "error" not in r}
    qk, pv = by.get(("SS", qk_n, 512, 2)), by.get(("RS", pv_n, pv_k, 2))
    if qk is None or pv is None:
        return None
    return pairs * (qk + pv) / 2 / 1e3


# what each warpgroup computes a tile: (schedule, scores' product N, PV product N and K, pairs an SM)
SCHEDULES = [
    ("batch-64 default: SPLIT_WG, BLOCK_T=32, V_SPLIT=2, one split (20 tiles, each one warpgroup's)", 32, 256, 32, 20),
    (
        "previous batch-64 default: BLOCK_T=64, V_SPLIT=2, one split (10 tiles, each both warpgroups': half "
        "the rows' scores, half the 256 columns)",
        32,
        128,
        64,
        20,
    ),
    (
        "V_SPLIT=1, two splits, BLOCK_T=64 (5 tiles, each both warpgroups': half the rows' scores, 256 "
        "columns; no score computed twice)",
        32,
        256,
        64,
        10,
    ),
]


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    lines = [
        "# wgmma rates: the sparse decode's two products alone on the tensor cores",
        "",
        *provenance(meta, "wgmma_rates.py", source, f" ({meta['sms']} SMs)"),
        "- one warpgroup a program, `per SM` programs on each SM, each repeating one product on operands resident "
        "in shared memory (SS: both; RS: A in registers); bf16 in, float32 accumulate; CUDA-event time of "
        "whole launches, median of 5",
        "",
        "| product | A | B | N | K | per SM | TFLOP/s | ns a product a program | rel. error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['mode']} | | | {r['N']} | {r['K']} | {r['per_sm']} | failed: {r['error']} | | |")
            continue
        what = "q K^T" if r["K"] == 512 else "P V"
        a = "shared" if r["mode"] == "SS" else "registers"
        b = "tile rows (K-major)" if r["K"] == 512 else "V columns (N-major)"
        lines.append(
            f"| {what} | {a} | {b} | {r['N']} | {r['K']} | {r['per_sm']} | {r['tflops']:.0f} | "
            f"{r['ns_per_product']:.0f} | {r['err']:.1e} |"
        )
    lines += [
        "",
        "The products of one SM's program of the V4-Flash sparse decode at batch 64 alone, at the rates "
        "above with two warpgroups an SM (nothing else costs):",
        "",
        "| schedule | scores' product | PV product | products an SM | products µs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, qk_n, pv_n, pv_k, pairs in SCHEDULES:
        us = projection(data, qk_n, pv_n, pv_k, pairs)
        lines.append(
            f"| {name} | 64 x {qk_n} x 512 | 64 x {pv_n} x {pv_k} | {pairs} + {pairs} | "
            + (f"{us:.1f} |" if us is not None else "- |")
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchmarks.common import result_path
    from benchmarks.report_cli import run

    def extra(ap):
        ap.add_argument("--work", type=float, default=2e9, help="multiply-adds a program repeats (sets R)")

    return run(argv, __doc__, result_path("wgmma_rates", "h200"), report, measure, extra)


if __name__ == "__main__":
    sys.exit(main())
