"""Check every registered kernel against its reference on this machine, without pytest.

    python3 -m kernels.selfcheck                      # CUDA: V4-Flash shapes, bf16 (+ fp8 where cc >= 8.9)
    TRITON_INTERPRET=1 python3 -m kernels.selfcheck --preset test --dtype float32   # CPU interpreter

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
        return [{"bf16": "bf16", "bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "fp8": "fp8"}.get(d, d)
                if name == "gemm" else d for d in requested]
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
        for dtype in _dtypes(name, dtypes, cuda):
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="check every kernel against its reference")
    ap.add_argument("--preset", default=None, help="shape preset (default: v4flash on CUDA, test otherwise)")
    ap.add_argument("--dtype", action="append", default=None, help="dtype(s) to check (repeatable)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-shapes", type=int, default=2)
    args = ap.parse_args(argv)
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
