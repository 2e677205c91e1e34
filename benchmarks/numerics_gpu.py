"""How stable is the twin's numerics gate? Its relative error per configuration over several weight and input seeds.

The workload's numerics gate (``tuner.targets.workload.numerics``) compares one decode step's output with the default
configuration's, at one weight seed and one input seed, and calls a trial ``wrong_result`` beyond its dtype family's
tolerance (fp8 0.25, bf16 0.08). One H200 run put the search's best at 0.23 and its worst kept knob value at 0.247:
close to the line. This script measures the same error, with the gate's own functions, for a set of configurations
(single dtype changes, the all-fp8 one, the hand-written best, and a stored study's best) over ``--weight-seeds`` x
``--input-seeds``, and writes the spread, so a tolerance is chosen from a distribution rather than from one draw.

    python benchmarks/numerics_gpu.py --out $OUT [--study-best sqlite:///db#study] [--hand-best]
    python benchmarks/numerics_gpu.py --report stored.json --out benchmarks/results/numerics_gpu/h200/<date>_<commit>.md   # the table, on a CPU

Writes ``$OUT/numerics_gpu.json`` (every measured error) and ``$OUT/numerics_gpu.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

import torch  # noqa: E402

from tuner.targets.workload import numerics as nm  # noqa: E402
from tuner.targets.workload.model import DecodeModel  # noqa: E402
from tuner.targets.workload.presets import get_preset  # noqa: E402

BASE = {"moe_impl": "torch"}  # the default configuration (DEFAULT_KNOBS): fp32 indexer + MHC GEMMs, bf16 proj + MoE
CASES: list[tuple[str, dict]] = [
    ("default (determinism)", {}),
    ("moe_impl=triton", {"moe_impl": "triton"}),
    ("gemm_indexer=bf16", {"gemm_indexer": "bf16"}),
    ("gemm_mhc=bf16", {"gemm_mhc": "bf16"}),
    ("attention_impl=mma", {"attention_impl": "mma"}),
    ("gemm_indexer=fp8", {"gemm_indexer": "fp8"}),
    ("gemm_proj=fp8", {"gemm_proj": "fp8"}),
    ("gemm_moe=fp8, moe_impl=triton", {"gemm_moe": "fp8", "moe_impl": "triton"}),
    ("gemm_proj=fp8, gemm_indexer=fp8", {"gemm_proj": "fp8", "gemm_indexer": "fp8"}),
    (
        "every fp8 GEMM of the space, moe_impl=triton",
        {"gemm_proj": "fp8", "gemm_indexer": "fp8", "gemm_moe": "fp8", "moe_impl": "triton"},
    ),  # the space has no fp8 MHC
]


def study_best(spec: str) -> dict:
    """The stored best trial's knobs of a workload study, ``URL#STUDY``."""
    from storage.repo import Repo

    url, _, name = spec.partition("#")
    repo = Repo(url)
    run = repo.get_run(name)
    if run is None or run.best_trial_number is None:
        raise SystemExit(f"--study-best: no study {name!r} with a best trial in {url}")
    trial = next(t for t in repo.list_trials(run.id) if t.number == run.best_trial_number)
    return {k: v for k, v in trial.params.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--preset", default="dsv4-flash")
    ap.add_argument("--weight-seeds", type=int, default=3)
    ap.add_argument("--input-seeds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2, help="as the gate's numerics_batch")
    ap.add_argument("--live-context", type=int, default=512, help="as the space's live_context")
    ap.add_argument("--study-best", default=None, help="URL#STUDY: add that study's stored best as a case")
    ap.add_argument("--hand-best", action="store_true", help="add benchmarks/workload_gpu.py's hand-written best")
    ap.add_argument(
        "--report",
        metavar="JSON",
        help="only write the table (to --out, .md beside the name) from a stored JSON; runs on a CPU",
    )
    args = ap.parse_args()
    if args.report:
        src = Path(args.report)
        dest = Path(args.out) / (src.stem + ".md") if Path(args.out).is_dir() else Path(args.out)
        dest.write_text(report(json.loads(src.read_text()), str(src)))
        print(dest)
        return 0
    if not torch.cuda.is_available():
        print("error: numerics_gpu.py needs a CUDA GPU (the fp8 and Triton paths run there only)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    preset = get_preset(args.preset)
    cases = list(CASES)
    if args.hand_best:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from workload_gpu import HAND_BEST

        cases.append(("hand-written best", dict(HAND_BEST)))
    if args.study_best:
        cases.append((f"best of {args.study_best.partition('#')[2]}", study_best(args.study_best)))
    rows: list[dict] = []
    t0 = time.time()
    for ws in range(args.weight_seeds):
        base = DecodeModel(preset, BASE, dev, seed=ws)
        refs = {}
        for s in range(args.input_seeds):
            st = base.state(args.batch, args.live_context, seed=nm.INPUT_SEED + s)
            with torch.inference_mode():
                refs[s] = base.step(st).detach().to("cpu", torch.float64)
            torch.cuda.synchronize()
        del base
        torch.cuda.empty_cache()
        for name, knobs in cases:
            try:
                model = DecodeModel(preset, {**BASE, **knobs}, dev, seed=ws)
            except Exception as exc:  # noqa: BLE001 - a configuration the twin refuses is reported, not fatal
                print(f"seed w{ws} {name}: cannot build ({exc})", flush=True)
                rows.append(
                    {
                        "case": name,
                        "knobs": {k: str(v) for k, v in knobs.items()},
                        "weight_seed": ws,
                        "input_seed": None,
                        "family": None,
                        "tolerance": None,
                        "rel_err": None,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                continue
            family = max(
                nm.dtype_family(model.knobs, dev),
                nm.dtype_family(nm.normalized(preset, BASE), dev),
                key=nm.FAMILIES.index,
            )
            for s in range(args.input_seeds):
                st = model.state(args.batch, args.live_context, seed=nm.INPUT_SEED + s)
                with torch.inference_mode():
                    out = model.step(st).detach().to("cpu", torch.float64)
                torch.cuda.synchronize()
                err = nm.rel_err(out, refs[s])
                rows.append(
                    {
                        "case": name,
                        "knobs": {k: str(v) for k, v in knobs.items()},
                        "weight_seed": ws,
                        "input_seed": s,
                        "family": family,
                        "tolerance": nm.tolerance_for(family, {}),
                        "rel_err": err if math.isfinite(err) else None,
                    }
                )
                print(f"seed w{ws} i{s} {name:40s} {family:5s} rel_err {err:.4g}", flush=True)
            del model
            torch.cuda.empty_cache()
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("TUNER_COMMIT", "unknown"),
        "torch": torch.__version__,
        "preset": args.preset,
        "batch": args.batch,
        "live_context": args.live_context,
        "weight_seeds": args.weight_seeds,
        "input_seeds": args.input_seeds,
        "wall_s": round(time.time() - t0, 1),
        "tolerances": nm.DEFAULT_TOLERANCE,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics_gpu.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (out / "numerics_gpu.md").write_text(report({**meta, "rows": rows}, "numerics_gpu.json"))
    print((out / "numerics_gpu.md").read_text())
    return 0


def report(doc: dict, source: str) -> str:
    """The table, from the stored JSON (also runs on a CPU: ``python -c 'from benchmarks.numerics_gpu import ...'``)."""
    lines = [
        f"# Numerics gate of the twin over {doc['weight_seeds']} weight x {doc['input_seeds']} input seeds",
        "",
        f"{doc['date']}, {doc['gpu']}, commit {doc['commit']}, torch {doc['torch']}; preset {doc['preset']}, "
        f"batch {doc['batch']}, live context {doc['live_context']}; written by `benchmarks/numerics_gpu.py` "
        f"from `{source}`. Error = relative norm error of one decode step's output against the default "
        "configuration's (same weights, same inputs), as the gate computes it.",
        "",
        "| configuration | family | tolerance | min | median | max | beyond tolerance |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    by: dict[str, list[dict]] = {}
    for r in doc["rows"]:
        by.setdefault(r["case"], []).append(r)
    for name, rs in by.items():
        failed = [r for r in rs if r.get("error")]
        if failed:
            lines.append(f"| {name} | - | - | - | - | - | could not run: {failed[0]['error'][:120]} |")
            continue
        errs = [r["rel_err"] if r["rel_err"] is not None else math.inf for r in rs]
        tol = rs[0]["tolerance"]
        over = sum(e > tol for e in errs)
        lines.append(
            f"| {name} | {rs[0]['family']} | {tol:g} | {min(errs):.4g} | {statistics.median(errs):.4g} | "
            f"{max(errs):.4g} | {over}/{len(errs)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
