"""Check every registered kernel against its reference on this machine, without pytest.

    python3 -m kernels.selfcheck                      # CUDA: V4-Flash shapes, bf16 (+ fp8 where cc >= 8.9)
    TRITON_INTERPRET=1 python3 -m kernels.selfcheck --preset test --dtype float32   # CPU interpreter
    python3 -m kernels.selfcheck --compile-only --arch 90   # no GPU: compile every kernel for sm_90

Each check runs the looked-up config (tuned file or default) on fresh random inputs into a
NaN-poisoned output and compares with the float32/float64 reference. Exit status 1 if any fails.
This is what an exported launch script can run on its target before trusting the kernels.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from .base import check, classify_failure, dtype_name
from .configs import lookup
from .registry import KERNELS, get_kernel

logger = logging.getLogger(__name__)


def _dtypes(name: str, requested: list[str] | None, cuda: bool) -> list[str]:
    if requested:
        return [
            {"bf16": "bf16", "bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "fp8": "fp8"}.get(d, d)
            if name == "gemm"
            else d
            for d in requested
        ]
    fp8 = cuda and torch.cuda.get_device_capability() >= (8, 9)
    if name == "gemm":
        return ["bf16"] + (["fp8"] if fp8 else [])
    if name == "indexer":
        return ["bfloat16"] + (["float8_e4m3fn"] if fp8 else [])
    return ["bfloat16"]


def run_checks(preset: str, dtypes: list[str] | None, device: str, max_shapes: int = 2) -> list[dict]:
    """One record per (kernel, dtype, shape): error, tolerance, outcome."""
    results = []
    cuda = device.startswith("cuda")
    for name in KERNELS:
        kernel = get_kernel(name)
        if kernel.unavailable():
            logger.info("%s skipped: %s", name, kernel.unavailable())
            continue
        for dtype in _dtypes(name, dtypes, cuda):
            if kernel.dtypes and dtype_name(dtype) not in kernel.dtypes:
                logger.info("%s skipped at %s: it runs %s", name, dtype, ", ".join(kernel.dtypes))
                continue
            for shape in kernel.shapes(preset)[:max_shapes]:
                rec = {"kernel": name, "dtype": dtype_name(dtype), "shape": kernel.shape_key(shape)}
                try:
                    config = lookup(name, shape, dtype, device if cuda else None)
                    err = check(kernel, shape, dtype, config, device, seed=1)
                    tol = kernel.tolerance(dtype)
                    rec.update(err=err, tol=tol, config=config, outcome="ok" if err <= tol else "wrong_result")
                except Exception as exc:  # every failure is a result
                    rec.update(outcome=classify_failure(exc), error=f"{type(exc).__name__}: {exc}"[:200])
                logger.info("%s", rec)
                results.append(rec)
    return results


def compile_all(arch: int = 90) -> list[dict]:
    """Compile each kernel's main variants for ``sm_<arch>`` with the installed Triton, no GPU needed
    (ahead-of-time ``triton.compile``; not available under TRITON_INTERPRET=1). Tile sizes are the
    V4-Flash defaults; the record holds the shared memory the compiler allocated."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .gemm import _gemm_kernel, _split_k_reduce_kernel
    from .gemv import _gemv_kernel
    from .glue import _add_rmsnorm_kernel, _rope_kernel
    from .indexer import _indexer_kernel
    from .moe import _moe_down_kernel, _moe_up_kernel
    from .sparse_decode import _sparse_decode_kernel, _sparse_decode_simt_kernel
    from .sparse_decode_common import combine_kernel

    P = lambda t: "*" + t  # noqa: E731
    jobs = []
    sd = {
        "q_ptr": P("bf16"),
        "kv_ptr": P("bf16"),
        "kv_scale_ptr": "*fp32",
        "out_ptr": P("bf16"),
        "idx_ptr": "*i32",
        "part_ptr": "*fp32",
        "lse_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    for direct, dt, fp8 in ((True, 0, False), (False, 64, False), (False, 0, True)):
        jobs.append(
            (
                f"sparse_decode{' fp8 cache' if fp8 else ''}",
                _sparse_decode_kernel,
                sd | ({"kv_ptr": P("fp8e4nv")} if fp8 else {}),
                dict(
                    DV=512,
                    DT=dt,
                    D_TAIL=dt,
                    BLOCK_H=16,
                    BLOCK_T=64,
                    DIRECT=direct,
                    KV_SCALED=fp8,
                    PREFETCH=True,
                    PDL=not direct,
                ),
                4,
                2,
            )
        )
    jobs.append(
        (
            "sparse_decode combine",
            combine_kernel,
            {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": P("bf16")},
            dict(S_PAD=32, BLOCK_D=128, PDL=True),
            4,
            1,
        )
    )
    jobs.append(
        (
            "sparse_decode_simt",
            _sparse_decode_simt_kernel,
            {"q_ptr": P("bf16"), "kv_ptr": P("bf16"), "idx_ptr": "*i32", "out_ptr": P("bf16"), "qk_scale": "fp32"},
            dict(DV=512, DT=0, D_TAIL=0, BLOCK_T=16),
            4,
            1,
        )
    )
    for dt, skip in (("fp8e4nv", True), ("bf16", True), ("bf16", False)):  # False: every tile of the width computed
        jobs.append(
            (
                f"indexer {dt}{'' if skip else ' dead tiles'}",
                _indexer_kernel,
                {
                    "q_ptr": P(dt),
                    "k_ptr": P(dt),
                    "w_ptr": "*fp32",
                    "ks_ptr": "*fp32",
                    "len_ptr": "*i32",
                    "out_ptr": "*fp32",
                },
                dict(D=128, BLOCK_H=64, BLOCK_N=64, TILES=4, HAS_SCALE=True, HAS_LEN=True, SKIP_DEAD=skip),
                4,
                2,
            )
        )
    for dt, ieee, scale in (("bf16", False, False), ("fp8e4nv", False, True), ("fp32", True, False)):
        jobs.append(
            (
                f"gemm {dt}",
                _gemm_kernel,
                {
                    "x_ptr": P(dt),
                    "w_ptr": P(dt),
                    "y_ptr": P("fp32" if ieee else "bf16"),
                    "xs_ptr": "*fp32",
                    "ws_ptr": "*fp32",
                    "p_ptr": "*fp32",
                    "lock_ptr": "*i32",
                },
                dict(
                    BLOCK_M=16,
                    BLOCK_N=64,
                    BLOCK_K=128,
                    GROUP_M=8,
                    EVEN_K=True,
                    IEEE=ieee,
                    HAS_SCALE=scale,
                    SPLIT=True,
                    FUSED=True,
                ),
                4,
                4,
            )
        )
    for dt, scale in (("bf16", False), ("fp8e4nv", True)):
        jobs.append(
            (
                f"gemv {dt}",
                _gemv_kernel,
                {
                    "x_ptr": P(dt),
                    "w_ptr": P(dt),
                    "y_ptr": P("bf16"),
                    "xs_ptr": "*fp32",
                    "ws_ptr": "*fp32",
                    "p_ptr": "*fp32",
                    "lock_ptr": "*i32",
                },
                dict(BLOCK_N=8, BLOCK_K=1024, EVEN_K=True, HAS_SCALE=scale, SPLIT=True),
                8,
                1,
            )
        )
    jobs.append(
        (
            "gemm split_k_reduce",
            _split_k_reduce_kernel,
            {"p_ptr": "*fp32", "y_ptr": P("bf16")},
            dict(SPLIT_K=4, BLOCK=1024),
            4,
            1,
        )
    )
    moe = {"pair_ptr": "*i32", "block_expert_ptr": "*i32", "gw_ptr": "*fp32", "y_ptr": "*fp32"}
    jobs.append(
        (
            "moe up",
            _moe_up_kernel,
            moe | {n: P("bf16") for n in ("x_ptr", "w_ptr", "act_ptr")},
            dict(TOPK=6, N_EXPERTS=32, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, EVEN_K=True, IEEE=False),
            4,
            3,
        )
    )
    jobs.append(
        (
            "moe down",
            _moe_down_kernel,
            moe | {n: P("bf16") for n in ("act_ptr", "w_ptr")},
            dict(N_EXPERTS=32, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, EVEN_K=True, IEEE=False),
            4,
            3,
        )
    )
    jobs.append(
        (
            "rmsnorm",
            _add_rmsnorm_kernel,
            {n: P("bf16") for n in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "rout_ptr")} | {"eps": "fp32"},
            dict(BLOCK=4096, SINGLE=True),
            8,
            1,
        )
    )
    jobs.append(
        (
            "rope",
            _rope_kernel,
            {"x_ptr": P("bf16"), "pos_ptr": "*i64", "cs_ptr": "*fp32", "y_ptr": P("bf16")},
            dict(NOPE=448, BLOCK_NOPE=512, HALF=32, BLOCK_H=8),
            4,
            1,
        )
    )
    results = []
    for label, fn, types, consts, num_warps, num_stages in jobs:
        if not hasattr(fn, "arg_names"):
            raise RuntimeError("ahead-of-time compilation needs TRITON_INTERPRET unset")
        signature, constexprs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in consts:
                signature[name], constexprs[(i,)] = "constexpr", consts[name]
            else:
                signature[name] = types.get(name, "i32")
        rec = {"kernel": label, "arch": arch, "triton": triton.__version__}
        try:
            compiled = triton.compile(
                ASTSource(fn, signature, constexprs),
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": num_warps, "num_stages": num_stages},
            )
            rec.update(outcome="ok", shared=compiled.metadata.shared)
        except Exception as exc:
            rec.update(outcome=classify_failure(exc), error=f"{type(exc).__name__}: {exc}"[:300])
        logger.info("%s", rec)
        results.append(rec)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="check every kernel against its reference")
    ap.add_argument("--preset", default=None, help="shape preset (default: v4flash on CUDA, test otherwise)")
    ap.add_argument("--dtype", action="append", default=None, help="dtype(s) to check (repeatable)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-shapes", type=int, default=2)
    ap.add_argument("--compile-only", action="store_true", help="compile for --arch without running (no GPU needed)")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args(argv)
    if args.compile_only:
        records = compile_all(args.arch)
        for r in records:
            print(
                f"{r['outcome']:>16}  {r['kernel']:<22} sm_{r['arch']} shared={r.get('shared', '-')} {r.get('error', '')}"
            )
        ok = sum(r["outcome"] == "ok" for r in records)
        print(f"{ok}/{len(records)} compiled with triton {records[0]['triton'] if records else '?'}")
        return 0 if ok == len(records) else 1
    preset = args.preset or ("v4flash" if args.device.startswith("cuda") else "test")
    results = run_checks(preset, args.dtype, args.device, args.max_shapes)
    bad = [r for r in results if r["outcome"] != "ok"]
    for r in results:
        err = f"{r['err']:.2e} <= {r['tol']:.0e}" if "err" in r else r.get("error", "")
        print(f"{r['outcome']:>16}  {r['kernel']:<18} {r['dtype']:<14} {r['shape']:<60} {err}")
    print(f"{len(results) - len(bad)}/{len(results)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
