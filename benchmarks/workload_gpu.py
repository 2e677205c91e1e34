"""The decode workload on one GPU: the default configuration, single changes, and a hand-written best, side by side.

Each configuration runs in its own subprocess (``python -m tuner.targets.workload.run --json``) so a failing mode
(torch.compile under CUDA graphs, say) is recorded with its reason and the rest still run. Writes a markdown table
with date, GPU, versions and commit.

    python benchmarks/workload_gpu.py --out results.md [--preset dsv4-flash] [--levels 1,16,64]
        [--study-best sqlite:///tuner.db#dsv4-flash-workload] [--only-ends] [--gemm-impl auto] [--attention-impl wgmma]
        [--kv-cache-dtype fp8_e4m3]

``--study-best URL#STUDY`` adds the stored best trial of a search as a case, so "found / hand-written best" is a
ratio of two runs made side by side here, not of figures from different runs; ``--only-ends`` keeps just the
default and the hand-written best besides those.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = {  # the seed's starting point
    "context_length": 1048576,
    "indexer_width": "static",
    "indexer_impl": "torch",
    "attention_impl": "simt",
    "gemm_proj": "bf16",
    "gemm_indexer": "fp32",
    "gemm_moe": "bf16",
    "gemm_mhc": "fp32",
    "glue": "eager",
    "moe_impl": "torch",
    "cuda_graph_buckets": "server_default:256",
}
HAND_BEST = {  # what a deployment can set: the indexer stays sized by the configured context (static width)
    **DEFAULT,
    "context_length": 8192,
    "indexer_impl": "triton",
    "attention_impl": "mma",
    "gemm_indexer": "bf16",
    "gemm_mhc": "bf16",
    "glue": "fused",
    "moe_impl": "triton",
    "cuda_graph_buckets": "pow2:64",
}
TINY_DEFAULT = {  # the CPU twin's (dsv4-flash-tiny on a CPU) defaults: its space's, less the GPU-only values
    "context_length": 131072,
    "indexer_width": "static",
    "attention_impl": "torch",
    "kv_cache_dtype": "bf16",
    "gemm_proj": "bf16",
    "gemm_indexer": "fp32",
    "gemm_moe": "bf16",
    "gemm_mhc": "fp32",
    "gemm_impl": "torch",
}
TINY_HAND_BEST = {
    **TINY_DEFAULT,
    "context_length": 4096,
    "indexer_width": "live",
}  # an eager CPU step scores the live length


def ends(preset: str) -> tuple[dict, dict]:
    """(default, hand-written best) of a preset: the GPU twin's above, or the CPU twin's for ``dsv4-flash-tiny``."""
    return (TINY_DEFAULT, TINY_HAND_BEST) if preset == "dsv4-flash-tiny" else (DEFAULT, HAND_BEST)


CASES = [
    ("default (1M cap, static indexer, SIMT, fp32 indexer+MHC, eager glue, server buckets)", DEFAULT),
    ("default + context cap 8192", {**DEFAULT, "context_length": 8192}),
    ("default + MMA attention", {**DEFAULT, "attention_impl": "mma"}),
    ("default + bf16 indexer and MHC GEMMs", {**DEFAULT, "gemm_indexer": "bf16", "gemm_mhc": "bf16"}),
    ("default + fused Triton MoE", {**DEFAULT, "moe_impl": "triton"}),
    ("default + fused Triton indexer", {**DEFAULT, "indexer_impl": "triton"}),
    (
        "default + fused indexer skipping dead tiles (SGLang PR #40431, not a launch flag)",
        {**DEFAULT, "indexer_impl": "triton", "indexer_dead_tiles": "skip"},
    ),
    ("default + live indexer width (not a launch flag: the ceiling)", {**DEFAULT, "indexer_width": "live"}),
    ("default + torch.compile glue", {**DEFAULT, "glue": "compile"}),
    ("default, no CUDA graphs", {**DEFAULT, "cuda_graph_buckets": "none:1"}),
    ("hand-written best", HAND_BEST),
    ("hand-written best, torch MoE", {**HAND_BEST, "moe_impl": "torch"}),
]


def run_case(knobs: dict, preset: str, levels: str, repeats: int, timeout: float) -> dict:
    argv = [
        sys.executable,
        "-m",
        "tuner.targets.workload.run",
        "--preset",
        preset,
        "--levels",
        levels,
        "--json",
        "--repeats",
        str(repeats),
    ]
    for k, v in knobs.items():
        argv += ["--knob", f"{k}={v}"]
    t0 = time.time()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s", "wall_s": time.time() - t0}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        err = [ln for ln in (out.stderr or "").splitlines() if ln.strip()]
        why = next((ln for ln in reversed(err) if "Error" in ln or "error" in ln), err[-1] if err else "no output")
        return {"error": why[:240], "wall_s": time.time() - t0}
    return {"tok_s": json.loads(lines[-1]), "wall_s": time.time() - t0}


def study_best(spec: str, default: dict | None = None) -> tuple[str, dict]:
    """``URL#STUDY`` -> (case name, knobs) of that study's recorded best trial (over ``default``: :data:`DEFAULT`)."""
    from storage import Repo

    url, _, study = spec.rpartition("#")
    if not url or not study:
        raise SystemExit(
            f"--study-best {spec!r} must be STORAGE_URL#STUDY, e.g. sqlite:///tuner.db#dsv4-flash-workload"
        )
    repo = Repo(url)
    run = repo.get_run(study)
    if run is None or run.best_trial_number is None:
        raise SystemExit(f"--study-best: no study {study!r} with a best trial in {url}; `tuner status` lists them")
    trial = repo.get_trial(run.id, run.best_trial_number)
    knobs = {**(DEFAULT if default is None else default), **{k: v for k, v in trial.params.items() if v is not None}}
    return f"best found by `{study}` (trial {trial.number}, stored {run.best_value:.2f})", knobs


def study_baseline(spec: str, default: dict | None = None) -> tuple[str, dict]:
    """``URL#STUDY`` -> (case name, knobs) of that study's baseline trial: on a GPU the deployment map covers, SGLang's
    default path as the study's machine could run it (``search_spaces.resolve``), over ``default``."""
    from storage import Repo

    url, _, study = spec.rpartition("#")
    repo = Repo(url)
    run = repo.get_run(study) if url and study else None
    trial = repo.baseline_trial(run.id) if run is not None else None
    if trial is None:
        raise SystemExit(f"--study-baseline: no study {study!r} with a baseline trial in {url or spec!r}")
    knobs = {**(DEFAULT if default is None else default), **{k: v for k, v in trial.params.items() if v is not None}}
    return f"SGLang's defaults on this GPU (the baseline of `{study}`, trial {trial.number})", knobs


def study_command(spec: str, default: dict | None = None) -> tuple[str, dict, str] | None:
    """``URL#STUDY`` -> (case name, knobs, the best's case name) of the configuration that study's exported command
    runs (``server_map.command_config`` on the study's GPU: every value the command cannot give replaced by what SGLang
    does instead); ``None`` when the command runs the best itself."""
    from search_spaces import load_space_text
    from search_spaces.hardware import arch_of_environment
    from storage import Repo
    from tuner.targets.workload.server_map import command_config

    best_name, knobs = study_best(spec, default)
    url, _, study = spec.rpartition("#")
    repo = Repo(url)
    run = repo.get_run(study)
    trial = repo.get_trial(run.id, run.best_trial_number)
    cmd = command_config(
        load_space_text(run.space_yaml, source=run.space_name), trial.params, arch_of_environment(run.environment)
    )
    if not cmd.changes:
        return None
    knobs = {**(DEFAULT if default is None else default), **{k: v for k, v in cmd.params.items() if v is not None}}
    # the best's trial and figure in the name, as its best's case has them: every seed's study of the main job has
    # the same name, and the cases (and the best each command is compared with) are keyed by it
    name = (
        f"the exported command of `{study}` (trial {trial.number}, stored {run.best_value:.2f}, "
        f"less {len(cmd.changes)} code changes)"
    )
    return name, knobs, best_name


def report(data: dict) -> str:
    """The markdown of a run (``main`` writes it beside its JSON; ``--report-from`` rewrites it from a stored one):
    every case against the default, and each case in ``compared`` (a search's best, a variant of the hand-written
    best) against the hand-written best measured in the same run."""
    from benchmarks.common import stored_path

    cases = data["cases"]
    levels = data.get("levels") or sorted(
        {lv for c in cases for lv in c.get("tok_s", {})}, key=lambda lv: int(lv.split("=")[1])
    )
    base = cases[0].get("tok_s", {})
    default, hand_best = data.get("default_knobs", DEFAULT), data.get("hand_knobs", HAND_BEST)
    lines = [
        f"# Decode workload ({data['preset']}) side by side on {data['gpu']}",
        "",
        f"date {data['date']}, torch {data['torch']}, triton {data['triton']}, commit {data['commit']}, live context "
        f"512, median of {data['repeats']} steps after warm-up; tok/s = batch / step time; x = versus the default",
        *(
            [
                f"written by `benchmarks/workload_gpu.py --report-from {stored_path(data['source'])}` from the stored "
                f"results `{stored_path(data['source'])}`"
            ]
            if data.get("source")
            else []
        ),
        "",
        "| configuration | " + " | ".join(f"{lv} tok/s (x)" for lv in levels) + " | wall s |",
        "| --- | " + " | ".join("---" for _ in levels) + " | --- |",
    ]
    for c in cases:
        if "error" in c:
            lines.append(f"| {c['name']} | failed: {c['error']} |" + " |" * (len(levels) - 1) + f" {c['wall_s']:.0f} |")
            continue
        cells = []
        for lv in levels:
            v = c["tok_s"].get(lv)
            ratio = f" ({v / base[lv]:.2f}x)" if base.get(lv) and v else ""
            cells.append(f"{v:.1f}{ratio}" if v else "-")
        lines.append(f"| {c['name']} | " + " | ".join(cells) + f" | {c['wall_s']:.0f} |")
    lines += ["", "Knobs of the hand-written best: " + ", ".join(f"{k}={v}" for k, v in hand_best.items()), ""]
    hand = next((c for c in cases if c["knobs"] == hand_best and "tok_s" in c), None)
    by_name = {c["name"]: c for c in cases if "tok_s" in c}
    for c in cases:
        if c["name"] not in data.get("compared", []) or "tok_s" not in c:
            continue
        # against the case it varies (a found best's attention_impl variant: that found best), else the hand-written
        base = by_name.get(c.get("base", ""), hand)
        if base is None:
            continue
        ratios = [
            (lv, c["tok_s"][lv] / base["tok_s"][lv]) for lv in levels if base["tok_s"].get(lv) and c["tok_s"].get(lv)
        ]
        geo = math.exp(sum(math.log(x) for _, x in ratios) / len(ratios)) if ratios else float("nan")
        lines.append(
            f"{c['name']} / {'hand-written best' if base is hand else base['name']}, measured side by side: "
            + ", ".join(f"{lv} {x:.3f}" for lv, x in ratios)
            + f"; geomean {geo:.3f}"
        )
        lines.append("Its knobs: " + ", ".join(f"{k}={v}" for k, v in c["knobs"].items() if default.get(k) != v))
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="workload_gpu.md")
    ap.add_argument("--preset", default="dsv4-flash")
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--quick", action="store_true", help="only the default, single changes that matter, hand best")
    ap.add_argument(
        "--only-ends",
        action="store_true",
        help="only the default and the hand-written best (with --preset dsv4-flash-tiny: the CPU twin's)",
    )
    ap.add_argument(
        "--study-best",
        action="append",
        default=[],
        metavar="URL#STUDY",
        help="add a stored search's best trial as a case (repeatable)",
    )
    ap.add_argument(
        "--study-command",
        action="append",
        default=[],
        metavar="URL#STUDY",
        help="add the configuration a stored search's exported command runs (its best with every value "
        "the command cannot give replaced by SGLang's), compared with that best (repeatable; give "
        "the same URL#STUDY as --study-best)",
    )
    ap.add_argument(
        "--study-baseline",
        default="",
        metavar="URL#STUDY",
        help="add a stored search's baseline trial as a case, last (on a GPU the deployment map covers: SGLang's "
        "default path as that machine ran it)",
    )
    ap.add_argument(
        "--gemm-impl",
        default="",
        metavar="IMPL[,IMPL]",
        help="add the hand-written best with its linears' GEMMs run by each IMPL (auto: the tuned files' "
        "choice per shape; triton: kernels/gemm.py everywhere), beside it with the library's",
    )
    ap.add_argument(
        "--attention-impl",
        default="",
        metavar="IMPL[,IMPL]",
        help="add the hand-written best (and each --study-best) with its sparse decode attention run by "
        "each IMPL (wgmma: the Gluon Hopper kernel), beside it with its own",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        default="",
        metavar="DTYPE[,DTYPE]",
        help="add the hand-written best and each of its --attention-impl variants with the KV cache in "
        "each DTYPE (fp8_e4m3: e4m3 rows and a scale per row), each beside the same case with bf16",
    )
    ap.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="rewrite --out from a stored run's JSON (no GPU needed): adds the side-by-side ratios of its "
        "variants and found bests to the hand-written best (a JSON without 'compared': every case "
        "named 'hand-written best, ...' or 'best found by ...')",
    )
    args = ap.parse_args()
    if args.report_from:
        data = {**json.loads(args.report_from.read_text()), "source": str(args.report_from)}
        data.setdefault(
            "compared",
            [c["name"] for c in data["cases"] if c["name"].startswith(("hand-written best, ", "best found by "))],
        )
        Path(args.out).write_text(report(data))
        print(Path(args.out).read_text())
        return 0
    import torch

    from tuner.fingerprint import fingerprint

    env = fingerprint()
    levels = [f"c={c}" for c in args.levels.split(",")]
    results = []
    cases = [c for c in CASES if not args.quick or "compile" not in c[0] and "no CUDA" not in c[0]]
    default, hand_best = ends(args.preset)
    if args.only_ends:
        cases = [c for c in CASES if c[1] in (DEFAULT, HAND_BEST)]
        if hand_best is not HAND_BEST:
            cases = [("default (the CPU twin's space defaults)", default), ("hand-written best", hand_best)]
    variants = [
        (f"hand-written best, gemm_impl={impl}", {**HAND_BEST, "gemm_impl": impl})
        for impl in args.gemm_impl.split(",")
        if impl
    ]
    variants += [
        (f"hand-written best, attention_impl={impl}", {**HAND_BEST, "attention_impl": impl})
        for impl in args.attention_impl.split(",")
        if impl
    ]
    cases += variants
    # the hand-written best and its attention variants with each --kv-cache-dtype, each against its bf16 case
    kv_variants = [
        (f"{name}, kv_cache_dtype={kv}", {**knobs, "kv_cache_dtype": kv}, name)
        for name, knobs in [("hand-written best", HAND_BEST)] + variants
        for kv in args.kv_cache_dtype.split(",")
        if kv and knobs.get("kv_cache_dtype", "bf16") != kv
    ]
    cases += [(name, knobs) for name, knobs, _ in kv_variants]
    found = [study_best(spec, default) for spec in args.study_best]
    cases += found
    # each found best again with each --attention-impl, compared with that found best as measured here
    found_variants = [
        (f"{name}, attention_impl={impl}", {**knobs, "attention_impl": impl}, name)
        for name, knobs in found
        for impl in args.attention_impl.split(",")
        if impl and knobs.get("attention_impl") != impl
    ]
    cases += [(name, knobs) for name, knobs, _ in found_variants]
    commands = [c for c in (study_command(spec, default) for spec in args.study_command) if c is not None]
    cases += [(name, knobs) for name, knobs, _ in commands]
    if args.study_baseline:
        cases.append(study_baseline(args.study_baseline, default))
    bases = {name: base for name, _, base in found_variants + kv_variants + commands}
    for name, knobs in cases:
        r = run_case(knobs, args.preset, args.levels, args.repeats, args.timeout)
        results.append((name, knobs, r))
        print(name, json.dumps(r), flush=True)
    data = {
        "gpu": env["gpus"][0]["name"] if env["gpus"] else "cpu",
        "date": str(dt.date.today()),
        "commit": os.environ.get("TUNER_COMMIT") or env.get("git_sha"),
        "torch": torch.__version__,
        "triton": env.get("triton"),
        "preset": args.preset,
        "repeats": args.repeats,
        "levels": levels,
        "default_knobs": default,
        "hand_knobs": hand_best,
        "cases": [{"name": n, "knobs": k, **({"base": bases[n]} if n in bases else {}), **r} for n, k, r in results],
        "compared": [n for n, _ in found] + [n for n, _ in variants] + list(bases),
    }
    lines = report(data).splitlines()
    Path(args.out).write_text("\n".join(lines))
    Path(args.out).with_suffix(".json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
