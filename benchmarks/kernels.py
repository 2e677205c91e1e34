"""Benchmark every kernel of `kernels/` at DeepSeek-V4-Flash decode shapes against its roofline.

For each kernel and shape: the default config's time, the best time of a sweep over a pruned sample
of the config space (every timed config first checked against the reference), the plain-PyTorch
time, and the memory/compute floor of the cost model using the copy bandwidth and the bf16 matmul
rate measured in the same run. Writes a markdown report (``--out``) and the raw numbers plus the
best configs as JSON beside it (``--json``), ready for ``kernels.configs.write_config_file``.

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels.py --out kernels.md --budget-s 200

Compilation dominates a sweep (~1 s a config); configs are compiled first by a pool of worker
processes (``--jobs``) that fill Triton's on-disk cache, then timed one by one in this process.
The git commit comes from ``$KERNELS_GIT_COMMIT`` when set, else ``git rev-parse HEAD``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import multiprocessing as mp
import os
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as a script, this folder is sys.path[0] and this file would shadow the `kernels` package
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

import torch
import triton

from benchmarks.common import _effective, _time, git_commit, read_json, stored_path
from kernels import classify_failure, get_kernel
from kernels.base import dtype_name, rel_error
from kernels.bench import do_bench, measure_copy_bandwidth, measure_launch_us, measure_matmul_tflops

log = logging.getLogger("benchmarks.kernels")

# Tile configs of the sparse decode kernel that the recorded H200 sweep (batch 16) ranked best,
# always included in the sample (S is a runtime argument: every S is timed for each tile config).
SD_SEEDS = [
    (16, 128, 4, 2),
    (32, 128, 8, 2),
    (16, 64, 4, 2),
    (64, 64, 8, 2),
    (64, 32, 8, 2),
    (32, 64, 8, 2),
    (16, 32, 4, 3),
    (32, 32, 4, 2),
    (16, 128, 8, 2),
    (32, 64, 4, 2),
    (64, 128, 8, 1),
    (16, 16, 4, 2),
    (32, 128, 4, 2),
    (64, 64, 8, 3),
    (64, 32, 8, 3),
    (64, 16, 8, 2),
    (32, 32, 8, 3),
    (16, 64, 8, 3),
]


# Skinny-GEMM configs worth timing whatever the random sample: long K loops per program (deep
# cp.async pipelines) with enough programs (tiles x SPLIT_K ~ 128) to cover 132 SMs.
GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "GROUP_M", "num_warps", "num_stages")
GEMM_SEEDS = [
    (16, 32, 256, 4, 1, 4, 4),
    (16, 32, 256, 2, 1, 4, 4),
    (16, 64, 256, 4, 1, 4, 3),
    (16, 32, 128, 4, 1, 4, 5),
    (16, 64, 128, 8, 1, 4, 4),
    (16, 32, 128, 8, 1, 4, 4),
    (16, 64, 128, 4, 1, 4, 5),
    (16, 32, 256, 8, 1, 4, 3),
    (64, 64, 128, 4, 1, 4, 3),
    (64, 32, 128, 4, 1, 4, 4),
    (64, 64, 64, 8, 1, 4, 4),
    (32, 64, 128, 4, 1, 4, 4),
    (64, 32, 256, 2, 1, 4, 3),
    (32, 32, 256, 4, 1, 4, 4),
]


# ---------------------------------------------------------------------------------------------------
# what to run
# ---------------------------------------------------------------------------------------------------
def plan(quick: bool, gemm_sweep: bool = True) -> list[dict]:
    """Jobs: kernel, dtype, shapes, sample of configs (the same sample for every shape of a job)."""
    rng = random.Random(0)
    jobs = []

    sd = get_kernel("sparse_decode")
    # V4-Flash, bf16 and fp8 caches: every tile with 2 or 3 stages (1 stage never won a sweep), every split count
    # (the sweep drops split counts that give the same effective splits, see split_rows); V3.2: a sample
    for preset, dtype, n_tiles in (
        ("v4flash", "bfloat16", 999),
        ("v4flash", "float8_e4m3fn", 999),
        ("v32", "bfloat16", 4 if quick else 8),
    ):
        shapes = sd.shapes(preset)
        rest = [(bh, bt, nw, ns) for bh in (16, 32, 64) for bt in (16, 32, 64, 128) for nw in (4, 8) for ns in (2, 3)]
        if n_tiles < len(rest):
            rng.shuffle(rest)
            rest = SD_SEEDS + rest
        tiles, seen = [], set()
        for bh, bt, nw, ns in rest:
            cfg = {"S": 1, "BLOCK_H": bh, "BLOCK_T": bt, "num_warps": nw, "num_stages": ns}
            if (bh, bt, nw, ns) in seen or sd.check_config(cfg, shapes[-1], dtype=dtype):
                continue
            seen.add((bh, bt, nw, ns))
            tiles.append(cfg)
            if len(tiles) >= n_tiles:
                break
        configs = [dict(t, S=s) for t in tiles for s in (1, 2, 4, 8, 16, 32)]
        jobs.append({"kernel": "sparse_decode", "dtype": dtype, "shapes": shapes, "configs": configs, "preset": preset})
    jobs.append(
        {
            "kernel": "sparse_decode_simt",
            "dtype": "bfloat16",
            "shapes": sd.shapes("v4flash"),
            "configs": list(get_kernel("sparse_decode_simt").configs(sd.shapes("v4flash")[0])),
        }
    )
    wg = get_kernel("sparse_decode_wgmma")
    if wg.unavailable() is None:  # an sm_90 GPU with Gluon: the Hopper kernel beside the tl.dot one (issue 20)
        from benchmarks.sparse_decode_wgmma import wgmma_configs

        shapes = sd.shapes("v4flash")
        space = wgmma_configs(None, space={"STAGES": [2]})  # canonical configs, one ring depth
        seeds = [wg.default_config(s) for s in shapes]
        sample = seeds + rng.sample(space, min(24 if quick else 64, len(space)))
        jobs.append(
            {
                "kernel": "sparse_decode_wgmma",
                "dtype": "bfloat16",
                "shapes": shapes,
                "configs": list({json.dumps(c, sort_keys=True): c for c in sample}.values()),
            }
        )

    idx = get_kernel("indexer")
    for dtype, n in (("float8_e4m3fn", 20), ("bfloat16", 12)):
        shapes = idx.shapes("v4flash")
        valid = list(idx.configs(shapes[0], dtype=dtype))
        sample = rng.sample(valid, min(n if not quick else n // 2, len(valid)))
        jobs.append({"kernel": "indexer", "dtype": dtype, "shapes": shapes, "configs": sample})

    gm = get_kernel("gemm")
    sweep = (
        (("bf16", 48), ("fp8", 12), ("fp16", 0), ("tf32", 0), ("fp32", 0)) if gemm_sweep else (("bf16", 0), ("fp8", 0))
    )
    for mode, n in sweep:
        shapes = gm.shapes("v4flash")
        sample: list[dict] = []
        if n:
            for m in (1, 64):  # configs valid at M=1 (BLOCK_M 16) and at M=64
                valid = list(gm.configs(dict(shapes[0], M=m), dtype=mode))
                seeds = [dict(zip(GEMM_KEYS, c)) for c in GEMM_SEEDS]
                seeds = [c for c in seeds if c in valid]
                sample += seeds + rng.sample(valid, min(n // 2 if not quick else n // 4, len(valid)))
        unique = list({json.dumps(c, sort_keys=True): c for c in sample}.values())
        jobs.append({"kernel": "gemm", "dtype": mode, "shapes": shapes, "configs": unique})

    gv = get_kernel("gemv")  # the one-row GEMV, which linear(impl="auto") may ship at M = 1 (see choose_gemm_impls)
    for mode, n in (("bf16", 48), ("fp8", 24)) if gemm_sweep else (("bf16", 0), ("fp8", 0)):
        shapes = gv.shapes("v4flash")
        valid = list({json.dumps(c, sort_keys=True): c for s in shapes for c in gv.configs(s, dtype=mode)}.values())
        sample = [
            *gv.seed_configs(shapes[0], dtype=mode),
            *rng.sample(valid, min(n if not quick else n // 2, len(valid))),
        ]
        jobs.append(
            {
                "kernel": "gemv",
                "dtype": mode,
                "shapes": shapes,
                "configs": list({json.dumps(c, sort_keys=True): c for c in sample}.values()),
            }
        )

    moe = get_kernel("moe")
    shapes = moe.shapes("v4flash")
    sample = []
    for shape in shapes:  # a sample valid at each batch (16-row blocks only at one token)
        valid = list(moe.configs(shape, dtype="bfloat16"))
        sample += rng.sample(valid, min(8 if quick else 16, len(valid)))
    jobs.append(
        {
            "kernel": "moe",
            "dtype": "bfloat16",
            "shapes": shapes,
            "configs": list({json.dumps(c, sort_keys=True): c for c in sample}.values()),
        }
    )

    for name in ("rmsnorm", "rope"):
        k = get_kernel(name)
        shapes = k.shapes("v4flash")
        valid = list(k.configs(shapes[-1]))
        jobs.append(
            {"kernel": name, "dtype": "bfloat16", "shapes": shapes, "configs": rng.sample(valid, min(12, len(valid)))}
        )
    return jobs


# ---------------------------------------------------------------------------------------------------
# parallel compilation (fills Triton's on-disk cache)
# ---------------------------------------------------------------------------------------------------
def _compile_one(item):
    name, shape, dtype, config = item
    try:
        kernel = get_kernel(name)
        inputs = kernel.make_inputs(shape, dtype, "cuda", seed=0)
        kernel.run(inputs, config)
        torch.cuda.synchronize()
        return item, "ok", ""
    except Exception as exc:  # a failed config is data
        return item, classify_failure(exc), f"{type(exc).__name__}: {str(exc)[:300]}"


def _tile_key(name, config):
    return json.dumps({k: v for k, v in config.items() if not (name == "sparse_decode" and k == "S")}, sort_keys=True)


def precompile(jobs, n_procs: int, deadline: float) -> dict:
    """Compile every distinct (kernel, dtype, tile config) once, in parallel; return failures."""
    items, seen = [], set()
    for job in jobs:
        name, dtype = job["kernel"], job["dtype"]
        kernel = get_kernel(name)
        shapes = sorted(job["shapes"], key=lambda s: s.get(kernel.batch_dim, 1))
        for cfg in job["configs"] + [kernel.default_config(s) for s in job["shapes"]]:
            variants = [cfg] if name != "sparse_decode" else [dict(cfg, S=1), dict(cfg, S=2)]  # direct and split
            for v in variants:
                key = (name, dtype, _tile_key(name, v), v.get("S", 0) == 1)
                fits = [s for s in shapes if kernel.check_config(v, s, dtype=dtype) is None]
                if key in seen or not fits:
                    continue
                seen.add(key)
                items.append((name, fits[0], dtype, v))
    failures = {}
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(n_procs) as pool:
        results = pool.imap_unordered(_compile_one, items)
        for _ in items:
            try:
                item, outcome, msg = results.next(timeout=max(1.0, deadline - time.time()))
            except (mp.TimeoutError, StopIteration):
                log.warning("precompile deadline reached; the rest compiles on first use")
                break
            if outcome in ("compile_error", "out_of_resources"):  # facts about the tile config itself
                failures[(item[0], item[2], _tile_key(item[0], item[3]))] = (outcome, msg)
        pool.terminate()
    log.info(
        "precompiled %d configs in %.1f s with %d processes (%d failed)",
        len(items),
        time.time() - t0,
        n_procs,
        len(failures),
    )
    return failures


# ---------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------
def _input_sets(kernel, shape, dtype, cost_bytes):
    n = 4 if cost_bytes < 16e6 else 1  # small problems: 4 distinct input sets rotate inside one graph
    return [kernel.make_inputs(shape, dtype, "cuda", seed=i) for i in range(n)]


def _other_merge_time(name, cfg, sets, rep_ms):
    """The default config with the other split-K merge than the launcher's default (gemm: the opposite of its
    M <= 16 rule)."""
    try:
        if name == "gemm" and cfg["SPLIT_K"] > 1:
            from kernels.gemm import gemm

            def fn(i):
                return gemm(
                    i["x"],
                    i["w"],
                    i["mode"],
                    cfg,
                    x_scale=i["x_scale"],
                    w_scale=i["w_scale"],
                    fused_split_k=i["x"].shape[0] > 16,
                )
        else:
            return None
        return _time(fn, sets, rep_ms).median_us
    except Exception as exc:
        log.warning("other-merge timing failed: %s", exc)
        return None


def _frozen_rows(row, cases, run, tolerance, sets, ref, rep_ms):
    """Time a frozen previous kernel side by side: ``run(inputs, config)`` at each ``{tag: config}`` of ``cases``,
    checked against ``ref`` first; ``row[tag + "_us"]`` (or ``_error``) and ``_config``."""
    for tag, cfg in cases.items():
        if not cfg:
            continue
        try:

            def fn(i, c=cfg):
                return run(i, c)

            err = rel_error(fn(sets[0]), ref)
            if not err <= tolerance:
                row[f"{tag}_error"] = f"wrong result: rel error {err:.3g}"
                continue
            row[f"{tag}_us"] = _time(fn, sets, rep_ms).median_us
            row[f"{tag}_config"] = cfg
        except Exception as exc:
            row[f"{tag}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def _prev_version_rows(row, shape, sets, ref, rep_ms, best_cfg):
    """The frozen previous sparse decode kernel: at its shipped tuned config and at this run's best config."""
    from benchmarks.baselines.sparse_decode_v1 import sparse_decode_v1
    from kernels.configs import nearest_key, read_config_file

    kernel = get_kernel("sparse_decode")
    old = read_config_file(ROOT / "benchmarks" / "baselines" / "sparse_decode_v1_tuned.json")
    key = nearest_key(old, kernel.shape_key(shape), kernel.batch_dim)
    cases = {
        "prev_shipped": old[key]["config"] if key else kernel.default_config(shape),
        "prev_at_best": best_cfg,
        "prev_at_issue": ISSUE_CFG,
    }
    cases = {tag: dict(cfg, S=min(cfg["S"], 32)) for tag, cfg in cases.items() if cfg}
    _frozen_rows(
        row,
        cases,
        lambda i, c: sparse_decode_v1(i["q"], i["kv"], i["indices"], i["sm_scale"], c, d_v=i["d_v"]),
        kernel.tolerance(row["dtype"]),
        sets,
        ref,
        rep_ms,
    )


def _prev_schedule_rows(row, shape, trial, best_cfg):
    """The wgmma kernel's previous versions: its single-partition schedule (``WS=0``: every warp gathers and
    computes), and its warp-specialised one with both compute warpgroups on every tile (``SPLIT_WG=0``). Timed at
    this run's best config with the schedule flipped (SPLIT_WG where the best has it, else WS), and the fastest
    ``WS=0`` trial of the sweep (``prev_best_us``)."""
    from kernels.sparse_decode_wgmma import DEFAULT_CONFIG

    kernel = get_kernel("sparse_decode_wgmma")
    best_cfg = {**DEFAULT_CONFIG, **best_cfg}  # a config from before a switch existed ran with it off
    flip = "SPLIT_WG" if best_cfg["SPLIT_WG"] else "WS"
    other = {**best_cfg, flip: 1 - best_cfg[flip]}
    done = next(
        (
            t
            for t in row["trials"]
            if _effective(kernel.name, t["config"], shape) == _effective(kernel.name, other, shape)
        ),
        None,
    )
    rec = done or (trial(other, "other_schedule") if kernel.check_config(other, shape) is None else None)
    row["other_schedule"] = rec  # beside the trials: the best stays the sweep's
    prev = [t for t in row["trials"] + [rec] if t and t.get("outcome") == "ok" and not t["config"].get("WS")]
    row["prev_best_us"] = min((t["time_us"] for t in prev), default=None)


def _prev_gemm_rows(row, sets, ref, rep_ms, shipped_cfg, best_cfg):
    """The frozen GEMM before its tiles were known to be aligned (``benchmarks/baselines/gemm_v1.py``): at the
    shipped tuned config (tuned on that kernel) and at this run's best config."""
    from benchmarks.baselines.gemm_v1 import gemm_v1

    _frozen_rows(
        row,
        {"prev_shipped": shipped_cfg, "prev_at_best": best_cfg},
        lambda i, c: gemm_v1(i["x"], i["w"], i["mode"], c, x_scale=i["x_scale"], w_scale=i["w_scale"]),
        get_kernel("gemm").tolerance(row["dtype"]),
        sets,
        ref,
        rep_ms,
    )


def bench_job(job, rates, failures, deadline, rep_ms) -> list[dict]:
    from kernels.configs import lookup

    kernel = get_kernel(job["kernel"])
    dtype = job["dtype"]
    rows = []
    for i_shape, shape in enumerate(job["shapes"]):
        shape_deadline = time.time() + max(2.0, (deadline - time.time()) / (len(job["shapes"]) - i_shape))
        cost = kernel.cost(shape, dtype)
        flops_rate = rates["flops"] * (2.0 if dtype_name(dtype) == "float8_e4m3fn" and kernel.name == "gemm" else 1.0)
        flops_rate *= 0.5 if dtype == "tf32" else 1.0
        if dtype == "fp32":
            flops_rate = 60e12  # no tensor cores: CUDA-core fp32 (datasheet ~67 TFLOP/s), an assumption
        floor = cost.floor_us(rates["bw"], flops_rate)
        sets = _input_sets(kernel, shape, dtype, cost.bytes)
        ref = kernel.reference(sets[0])
        row = {
            "kernel": kernel.name,
            "dtype": dtype_name(dtype),
            "shape": shape,
            "key": kernel.shape_key(shape),
            "floor_us": floor,
            "bound": cost.bound(rates["bw"], flops_rate),
            "bytes": cost.bytes,
            "flops": cost.flops,
            "trials": [],
        }
        try:
            row["torch_us"] = _time(kernel.torch_baseline, sets, rep_ms).median_us
        except Exception as exc:
            row["torch_us"] = None
            row["torch_error"] = f"{type(exc).__name__}: {exc}"[:200]

        def trial(cfg, tag, sets=sets, ref=ref):
            rec = {"config": cfg, "tag": tag}
            fail = failures.get((kernel.name, dtype, _tile_key(kernel.name, cfg)))
            if fail:
                rec.update(outcome=fail[0], error=fail[1])
                return rec
            try:
                err = rel_error(kernel.run(sets[0], cfg), ref)
                rec["err"] = err
                if not err <= kernel.tolerance(dtype):
                    rec["outcome"] = "wrong_result"
                    return rec
                t = _time(lambda inp: kernel.run(inp, cfg), sets, rep_ms)
                rec.update(outcome="ok", time_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us, graph=t.graph)
            except Exception as exc:
                rec.update(outcome=classify_failure(exc), error=f"{type(exc).__name__}: {str(exc)[:300]}")
            return rec

        default = kernel.default_config(shape)
        shipped = lookup(kernel.name, shape, dtype, "cuda")  # the tuned file in kernels/tuned/ (or the default)
        d = trial(default, "default")
        row["trials"].append(d)
        row["default_us"] = d.get("time_us")
        row["default_err"] = d.get("err")
        seen = {_effective(kernel.name, default, shape)}
        if _effective(kernel.name, shipped, shape) not in seen:
            row["trials"].append(trial(shipped, "shipped"))
            seen.add(_effective(kernel.name, shipped, shape))
        row["shipped_us"] = next((t.get("time_us") for t in row["trials"] if t["config"] == shipped), None)
        row["shipped_config"] = shipped
        row["default_other_merge_us"] = _other_merge_time(kernel.name, default, sets, rep_ms)
        for cfg in job["configs"]:
            if time.time() > shape_deadline:
                row["truncated"] = True
                break
            if kernel.check_config(cfg, shape, dtype=dtype) is not None or _effective(kernel.name, cfg, shape) in seen:
                continue
            seen.add(_effective(kernel.name, cfg, shape))
            if (
                kernel.name == "sparse_decode"
                and cfg["S"] > 1
                and shape["batch"] * triton.cdiv(shape["heads"], cfg["BLOCK_H"]) * cfg["S"] > 2048
            ):
                continue  # far more programs than 132 SMs need: pruned
            if kernel.name == "sparse_decode_wgmma":
                from benchmarks.sparse_decode_wgmma import WAVES, programs

                if programs(cfg, shape["batch"], shape["topk"]) > WAVES * rates["sms"]:
                    continue  # more than two programs an SM (one fits): pruned, as its own benchmark does
            row["trials"].append(trial(cfg, "sweep"))
        ok = [t for t in row["trials"] if t.get("outcome") == "ok"]
        best = min(ok, key=lambda t: t["time_us"]) if ok else None
        row["best_us"] = best["time_us"] if best else None
        row["best_config"] = best["config"] if best else None
        row["best_spread"] = ((best["p80_us"] - best["p20_us"]) / best["time_us"]) if best else None
        row["n_ok"], row["n_failed"] = len(ok), len(row["trials"]) - len(ok)
        if kernel.name == "sparse_decode" and row["dtype"] != "float8_e4m3fn":
            _prev_version_rows(row, shape, sets, ref, rep_ms, row["best_config"])
        if kernel.name == "sparse_decode" and best and best["config"]["S"] > 1:
            # the same best config with the merge kernel launched plainly, not with programmatic dependent launch
            from kernels.sparse_decode import sparse_decode

            cfg = best["config"]

            def fn(i, cfg=cfg):
                return sparse_decode(
                    i["q"], i["kv"], i["indices"], i["sm_scale"], cfg, d_v=i["d_v"], kv_scale=i["kv_scale"], pdl=False
                )

            row["best_no_pdl_us"] = _time(fn, sets, rep_ms).median_us
        if kernel.name == "sparse_decode_wgmma" and best:
            _prev_schedule_rows(row, shape, trial, best["config"])
        if kernel.name == "gemm" and row["dtype"] in ("bfloat16", "float8_e4m3fn"):
            _prev_gemm_rows(row, sets, ref, rep_ms, shipped, row["best_config"])
        if kernel.name == "gemm":
            # what a caller gets today (the implementation a tuned file ships is chosen once every row is in:
            # choose_gemm_impls): kernels.linear.linear(impl="auto") with the tuned files of this checkout
            from kernels.linear import linear, resolve_impl

            def auto(i):
                return linear(i["x"], i["w"], i["mode"], "auto", x_scale=i["x_scale"], w_scale=i["w_scale"])

            row["auto_impl"] = resolve_impl("auto", shape["M"], shape["N"], shape["K"], sets[0]["mode"], "cuda")
            row["auto_us"] = _time(auto, sets, rep_ms).median_us
        log.info(
            "%s %s %s: floor %.1f torch %s default %s shipped %s best %s prev %s (%d ok, %d failed)",
            kernel.name,
            dtype,
            row["key"],
            floor,
            _f(row["torch_us"]),
            _f(row["default_us"]),
            _f(row["shipped_us"]),
            _f(row["best_us"]),
            _f(row.get("prev_shipped_us")),
            row["n_ok"],
            row["n_failed"],
        )
        rows.append(row)
        del sets, ref
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------
def _f(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def _r(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _shape_text(shape):
    return ",".join(f"{k}={v}" for k, v in shape.items() if k not in ("num_rows",))


GOALS_US = {1: 9.0, 16: 12.0, 64: 17.0}  # issue 20: V4-Flash sparse decode on one H200
ISSUE_CFG = {"S": 32, "BLOCK_H": 16, "BLOCK_T": 16, "num_warps": 4, "num_stages": 2}  # issue 20's batch-1 comparison
FLOOR_GOAL = 1.45  # batch 64: <= 1.45x its floor
TORCH_GOAL = 5.0  # >= 5x the torch path at every batch


def _ratio_text(a, b, nd=2):
    r = _r(a, b)
    return "—" if r is None else f"{r:.{nd}f}x"


def _goal_verdict(r, best) -> str:
    """Issue 20's sparse-decode goals for a V4-Flash row at its batch: the time, the floor (batch 64), the torch
    ratio; ``met`` or what is missed."""
    b, goal = r["shape"]["batch"], GOALS_US[r["shape"]["batch"]]
    misses = []
    if best > goal:
        misses.append(f"{best - goal:.1f} µs over {goal:g}")
    if b == 64 and best / r["floor_us"] > FLOOR_GOAL:
        misses.append(f"{best / r['floor_us']:.2f}x floor > {FLOOR_GOAL}")
    if r["torch_us"] and r["torch_us"] / best < TORCH_GOAL:
        misses.append(f"{r['torch_us'] / best:.1f}x torch < {TORCH_GOAL:g}")
    return "met" if not misses else "missed: " + "; ".join(misses)


def sparse_decode_table(rows) -> list[str]:
    """V4-Flash sparse decode: floor, torch, the previous kernel, and this one, side by side (same run, same inputs)."""
    sd = [r for r in rows if r["kernel"] == "sparse_decode"]
    if not sd:
        return []
    swept = any(t["tag"] == "sweep" for r in sd for t in r["trials"])
    lines = [
        "",
        "## Sparse decode side by side: V4-Flash (64 heads, d 512, 640 rows); V3.2 (128 heads, d 576/512, 2048 rows)",
        "",
        (
            "prev = the kernel before issue 20 (`benchmarks/baselines/sparse_decode_v1.py`), at its shipped tuned "
            "config and at this run's best config of the new kernel; new = `kernels/sparse_decode.py`: default config, "
            "the tuned config shipped in `kernels/tuned/` at the time of the run, and the best of this run's sweep."
            + (
                ""
                if swept
                else " This run had no sweep (`--shipped-only`): new best = the faster of default and shipped."
            )
        ),
        "",
        (
            "| model | cache | batch | floor µs | torch µs | prev shipped µs | prev at new best µs | new default µs | "
            "new best, merge without PDL µs | new shipped µs | new best µs | prev shipped / new best | torch / new best | new best / floor | goal | "
            "best config |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sd:
        b = r["shape"]["batch"]
        best = r["best_us"]
        v4 = r["shape"]["topk"] == 640
        goal = GOALS_US.get(b) if v4 else None
        if r["dtype"] == "float8_e4m3fn":
            verdict = "—"
        elif goal and best:
            verdict = _goal_verdict(r, best)
        else:
            verdict = "—"
        cfg = "" if not r["best_config"] else " ".join(f"{k}={v}" for k, v in r["best_config"].items())
        lines.append(
            f"| {'V4-Flash' if v4 else 'V3.2'} | {r['dtype']} | {b} | {_f(r['floor_us'], 2)} | {_f(r['torch_us'])} | {_f(r.get('prev_shipped_us'))} | "
            f"{_f(r.get('prev_at_best_us'))} | {_f(r['default_us'])} | {_f(r.get('best_no_pdl_us'))} | "
            f"{_f(r.get('shipped_us'))} | {_f(best)} | "
            f"{_ratio_text(r.get('prev_shipped_us'), best)} | {_ratio_text(r['torch_us'], best, 1)} | "
            f"{_ratio_text(best, r['floor_us'])} | {verdict} | {cfg} |"
        )
    return lines


def sparse_decode_wgmma_table(rows) -> list[str]:
    """The Gluon wgmma sparse decode beside the tl.dot kernel's best of the same run (same shapes, bf16 cache), the
    torch path, the floor, and its own previous schedule (WS=0)."""
    wg = [r for r in rows if r["kernel"] == "sparse_decode_wgmma"]
    if not wg:
        return []
    tl = {r["key"]: r for r in rows if r["kernel"] == "sparse_decode" and r["dtype"] == "bfloat16"}
    lines = [
        "",
        "## Sparse decode on Hopper: the Gluon wgmma kernel (V4-Flash, bf16 cache)",
        "",
        (
            "wgmma = `kernels/sparse_decode_wgmma/`: default config, the tuned config shipped in `kernels/tuned/`, "
            "and the best of this run's sample of its space (one ring depth, P in registers; the kernel's own "
            "benchmark, `benchmarks/sparse_decode_wgmma.py`, sweeps the rest); other schedule = the best config "
            "with SPLIT_WG flipped where it has it, else WS; WS=0 best = the single-partition schedule's best of "
            "the sample (every warp gathers and computes); tl.dot best = `kernels/sparse_decode.py`'s best in this run."
        ),
        "",
        (
            "| batch | floor µs | torch µs | tl.dot best µs | default µs | shipped µs | best µs | other schedule at best "
            "µs | WS=0 best µs | tl.dot best / best | WS=0 best / best | torch / best | best / floor | goal | best "
            "config |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in wg:
        b, best = r["shape"]["batch"], r["best_us"]
        t = tl.get(r["key"])
        other = (r.get("other_schedule") or {}).get("time_us")
        verdict = _goal_verdict(r, best) if best and b in GOALS_US else "—"
        cfg = "" if not r["best_config"] else " ".join(f"{k}={v}" for k, v in r["best_config"].items())
        lines.append(
            f"| {b} | {_f(r['floor_us'], 2)} | {_f(r['torch_us'])} | {_f(t and t['best_us'])} | "
            f"{_f(r['default_us'])} | {_f(r.get('shipped_us'))} | {_f(best)} | {_f(other)} | "
            f"{_f(r.get('prev_best_us'))} | {_ratio_text(t and t['best_us'], best)} | "
            f"{_ratio_text(r.get('prev_best_us'), best)} | {_ratio_text(r['torch_us'], best, 1)} | "
            f"{_ratio_text(best, r['floor_us'])} | {verdict} | {cfg} |"
        )
    launch = [r for r in wg if r.get("best_no_trigger_us")]
    if launch:
        lines += [
            "",
            (
                "The best config's merge kernel launched each way in the same run: best = the launcher's choice "
                "(`merge_starts_early`); early = programmatic dependent launch, the split kernel letting the "
                "merge start as soon as all its programs have started (the merge waits in-kernel for the "
                "partials); at exit = the same launch, the merge started only as the split kernel's programs "
                "exit (the launch before 2026-12-01); plain = no PDL:"
            ),
            "",
            "| batch | best µs | early µs | at exit µs | plain µs | early / best | at exit / best | plain / best |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        if any("best_early_us" not in r for r in launch):  # a run at a0b4bea: no rule yet, every merge early
            lines[-4] = lines[-4].replace(
                "best = the launcher's choice (`merge_starts_early`)",
                "best = early (this run's launcher started every merge early)",
            )
        for r in launch:
            early = r.get("best_early_us", r["best_us"])
            lines.append(
                f"| {r['shape']['batch']} | {_f(r['best_us'])} | {_f(early)} | "
                f"{_f(r['best_no_trigger_us'])} | {_f(r.get('best_no_pdl_us'))} | "
                f"{_ratio_text(early, r['best_us'])} | "
                f"{_ratio_text(r['best_no_trigger_us'], r['best_us'])} | "
                f"{_ratio_text(r.get('best_no_pdl_us'), r['best_us'])} |"
            )
    return lines


def issue_config_table(rows) -> list[str]:
    """Issue 20's question: at the same config (S=32, BLOCK_H=16, BLOCK_T=16, 4 warps, 2 stages), the old kernel and
    the new one, per batch (the old splits 640 rows into 32 splits of 20; the new into 20 whole 32-row tiles)."""
    lines = []
    for r in rows:
        if r["kernel"] != "sparse_decode" or r["dtype"] != "bfloat16" or r["shape"]["topk"] != 640:
            continue
        new = next((t.get("time_us") for t in r["trials"] if t["config"] == ISSUE_CFG), None)
        lines.append(
            f"| {r['shape']['batch']} | {_f(r.get('prev_at_issue_us'))} | {_f(new)} | "
            f"{_ratio_text(r.get('prev_at_issue_us'), new)} |"
        )
    if not lines:
        return []
    return [
        "",
        "## The issue's batch-1 config in both kernels (S=32, BLOCK_H=16, BLOCK_T=16, 4 warps, 2 stages)",
        "",
        "| batch | prev µs | new µs | prev / new |",
        "| --- | --- | --- | --- |",
        *lines,
    ]


def choose_gemm_impls(rows) -> None:
    """Each GEMM row's ``impl``: the fastest of the library, the Triton GEMM's best and, at one row, the GEMV's best
    (the GEMV row of the same dtype and shape in this run); a tuned file written from the run ships it."""
    gemv = {(r["dtype"], r["key"]): r for r in rows if r["kernel"] == "gemv"}
    for r in rows:
        if r["kernel"] != "gemm":
            continue
        g = gemv.get((r["dtype"], r["key"]))
        r["gemv_us"] = g["best_us"] if g else None
        times = _impl_times(r)
        r["impl"] = min(times, key=times.get) if times else "torch"


def _impl_times(r) -> dict[str, float]:
    """A GEMM row's measured time per implementation: the library, the GEMM's best, the GEMV's best (where timed)."""
    times = {"torch": r["torch_us"], "triton": r["best_us"], "gemv": r.get("gemv_us")}
    return {k: v for k, v in times.items() if v}


def gemm_table(rows) -> list[str]:
    """Decode GEMMs: the Triton kernel (shipped tuned config, best of the run) beside the library, and the choice."""
    gm = [r for r in rows if r["kernel"] == "gemm" and r["dtype"] in ("bfloat16", "float8_e4m3fn")]
    if not gm:
        return []
    lines = [
        "",
        "## Decode GEMMs: Triton beside the library (cuBLAS through torch; `torch._scaled_mm` for fp8)",
        "",
        (
            'impl = what a tuned file written from this run ships for the key (`kernels.linear.linear(impl="auto")`): '
            "a Triton kernel (the GEMM, or at one row the GEMV of `kernels/gemv.py`) only where it measured faster "
            "than the library. prev = the kernel before its tiles were "
            "known to be aligned (`benchmarks/baselines/gemm_v1.py`, 2-byte loads of W), at the shipped tuned config "
            "and at this run's best config; prev / best is measured side by side in this run."
        ),
        "",
        (
            "| dtype | shape | floor µs | library µs | prev shipped µs | prev at best µs | Triton shipped µs | "
            "Triton best µs | GEMV best µs | prev shipped / best | best / library | best / floor | impl | "
            "shipped choice µs | linear(auto) at run time: impl, µs |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in gm:
        chosen = min(_impl_times(r).values(), default=None)
        lines.append(
            f"| {r['dtype']} | {_shape_text(r['shape'])} | {_f(r['floor_us'])} | {_f(r['torch_us'])} | "
            f"{_f(r.get('prev_shipped_us'))} | {_f(r.get('prev_at_best_us'))} | "
            f"{_f(r.get('shipped_us'))} | {_f(r['best_us'])} | {_f(r.get('gemv_us'))} | "
            f"{_ratio_text(r.get('prev_shipped_us'), r['best_us'])} | "
            f"{_ratio_text(r['best_us'], r['torch_us'])} | {_ratio_text(r['best_us'], r['floor_us'])} | "
            f"{r.get('impl', '—')} | {_f(chosen)} | {r.get('auto_impl', '—')}, {_f(r.get('auto_us'))} |"
        )
    return lines


def aims(rows) -> list[str]:
    out = []
    for r in rows:
        if (
            r["kernel"] in ("sparse_decode", "sparse_decode_wgmma")
            and r["shape"]["topk"] == 640
            and r["best_us"]
            and r["dtype"] == "bfloat16"
        ):
            b = r["shape"]["batch"]
            goal = GOALS_US[b]
            out.append(
                f"- {r['kernel'].replace('_', ' ')} B={b} <= {goal:g} us: {r['best_us']:.1f} us -> "
                f"{'met' if r['best_us'] <= goal else 'missed by {:.1f} us ({:.2f}x)'.format(r['best_us'] - goal, r['best_us'] / goal)}"
            )
            if b == 64:
                ratio = r["best_us"] / r["floor_us"]
                out.append(
                    f"- {r['kernel'].replace('_', ' ')} B=64 within {FLOOR_GOAL}x of floor: {ratio:.2f}x -> "
                    f"{'met' if ratio <= FLOOR_GOAL else f'missed by {ratio / FLOOR_GOAL:.2f}x'}"
                )
            if r["torch_us"]:
                sp = r["torch_us"] / r["best_us"]
                out.append(
                    f"- {r['kernel'].replace('_', ' ')} B={b} >= {TORCH_GOAL:g}x faster than PyTorch: {sp:.1f}x -> "
                    f"{'met' if sp >= TORCH_GOAL else 'missed'}"
                )
        if r["kernel"] == "indexer" and r["shape"]["width"] == 65536 and r["best_us"]:
            ratio = r["best_us"] / r["floor_us"]
            out.append(
                f"- indexer {r['dtype']} B={r['shape']['batch']} 64K rows within 1.5x of floor: {ratio:.2f}x -> {'met' if ratio <= 1.5 else f'missed by {ratio / 1.5:.2f}x'}"
            )
        if r["kernel"] == "gemm" and r["dtype"] in ("bfloat16", "float8_e4m3fn") and r["torch_us"]:
            chosen = min(_impl_times(r).values())
            out.append(
                f"- gemm {r['dtype']} {r['key']}: shipped choice ({r.get('impl')}) {chosen:.1f} us vs library "
                f"{r['torch_us']:.1f} us -> {'never slower' if chosen <= r['torch_us'] else 'slower'}"
            )
    return out


def report(rows, meta, ncu_summary: Path | None = None, source: Path | None = None) -> str:
    lines = [
        f"# Kernel benchmarks: {meta['gpu']}",
        "",
        f"- date: {meta['date']}",
        f"- GPU: {meta['gpu']} ({meta['sms']} SMs)",
        f"- torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}",
        f"- git commit: {meta['commit']}",
        *(
            [
                (
                    f"- generated by `benchmarks/kernels.py --report-from {stored_path(source)}` from the stored results "
                    f"`{stored_path(source)}`"
                )
            ]
            if source
            else []
        ),
        f"- measured in this run: copy {meta['bw'] / 1e12:.2f} TB/s (read+write), bf16 matmul {meta['flops'] / 1e12:.0f} TFLOP/s (8192^3, cuBLAS)",
        "- floor = max(bytes / copy rate, FLOPs / matmul rate) from each kernel's cost model (fp8 GEMM: 2x the bf16 rate; sparse decode with an fp8 cache still multiplies in bf16: 1x; tf32: 0.5x; fp32: 60 TFLOP/s assumed)",
        (
            "- times: median µs of CUDA-graph replays, L2 flushed (256 MB clean read) before every replay; problems under 16 MB rotate 4 distinct "
            "input sets inside one graph, so every call reads cold data; torch = plain PyTorch in the same dtype (cuBLAS for GEMM)"
        ),
        *(
            [
                f"- an empty kernel (one program storing one value), timed the same way: {meta['launch_us']:.1f} µs per call; "
                "no kernel timed so goes below it"
            ]
            if meta.get("launch_us")
            else []
        ),
        f"- wall time of the run: {meta['wall_s']:.0f} s (precompile {meta['precompile_s']:.0f} s)",
        "",
    ]
    lines += [
        "| kernel | dtype | shape | floor µs (bound) | torch µs | default µs | best µs | default/floor | best/floor | torch/best | best config | ok/failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cfg = "" if not r["best_config"] else " ".join(f"{k}={v}" for k, v in r["best_config"].items())
        lines.append(
            f"| {r['kernel']} | {r['dtype']} | {_shape_text(r['shape'])} | {_f(r['floor_us'])} ({r['bound'][:3]}) | {_f(r['torch_us'])} | "
            f"{_f(r['default_us'])} | {_f(r['best_us'])} | {_f(_r(r['default_us'], r['floor_us']), 2)} | {_f(_r(r['best_us'], r['floor_us']), 2)} | "
            f"{_f(_r(r['torch_us'], r['best_us']), 2)} | {cfg} | {r['n_ok']}/{r['n_failed']}{' (cut by budget)' if r.get('truncated') else ''} |"
        )
    lines += sparse_decode_table(rows) + sparse_decode_wgmma_table(rows) + issue_config_table(rows) + gemm_table(rows)
    two = [r for r in rows if r.get("default_other_merge_us") and r.get("default_us")]
    if two:
        lines += [
            "",
            "## Split-K merge: the launcher's default path vs the other one (default config)",
            "",
            (
                "sparse_decode merges in a second launch by default (other: fused into the main launch); "
                "gemm fuses for M <= 16 and uses a second pass above (other: the opposite)."
            ),
            "",
            "| kernel | dtype | shape | default path µs | other path µs |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r['kernel']} | {r['dtype']} | {_shape_text(r['shape'])} | {_f(r['default_us'])} | {_f(r['default_other_merge_us'])} |"
            for r in two
        ]
    lines += ["", "## Aims", ""] + aims(rows)
    if ncu_summary is not None:
        lines += [
            "",
            f"## Nsight Compute, one call each (`{ncu_summary.name}`, `--clock-control none`, caches flushed by ncu)",
            "",
            (
                "Cases in order: the issue's batch-1 config in the previous kernel (split kernel, merge kernel), the "
                "same in the new kernel, then the new kernel's shipped config at batch 1, 16, 64 for the bf16 and the fp8 "
                "cache (split kernel, then merge kernel where S > 1). Stalls: cycles per issued instruction by reason."
            ),
            "",
            "```",
            ncu_summary.read_text().rstrip(),
            "```",
        ]
    fails = {}
    for r in rows:
        for t in r["trials"]:
            if t.get("outcome") not in (None, "ok"):
                fails.setdefault((r["kernel"], t["outcome"]), []).append(t)
    if fails:
        lines += ["", "## Failed configs", ""]
        for (k, o), ts in sorted(fails.items()):
            lines.append(f"- {k}: {o} x{len(ts)}, e.g. {ts[0]['config']} {ts[0].get('error', '')[:160]}")
    return "\n".join(lines) + "\n"


def write_tuned(results: Path, directory: Path) -> list[Path]:
    """Tuned-config files in ``directory`` (any folder but ``kernels/tuned/``, which only ``tuner search --target
    kernels`` writes) from the ``tuned`` part of a results JSON (GPU and Triton version from its ``meta``); each
    entry records the run's commit and date beside its config and times."""
    from benchmarks.common import tuned_output_dir
    from kernels.configs import write_config_file

    directory = tuned_output_dir(directory)
    data = read_json(results)
    meta = data["meta"]
    paths = []
    for name_dtype, entries in data["tuned"].items():
        name, dtype = name_dtype.split("|")
        stamped = {
            k: dict(v, measured=f"{meta['date']}, commit {meta['commit'][:12]}, {results.name}")
            for k, v in entries.items()
        }
        paths.append(
            write_config_file(name, meta["gpu"], dtype, stamped, triton_version=meta["triton"], directory=directory)
        )
    return paths


def flashmla_table(
    out: Path, batches=(1, 16, 64), rows: int = 65536, topk: int = 640, heads: int = 64, rep_ms: float = 12.0
) -> str:
    """FlashMLA (the sgl-flash-mla wheel, as SGLang 0.5.23 calls it: ``flash_mla_with_kvcache(..., use_legacy=True,
    kv_format="V4")`` on V4's fp8 cache, ``flash_mla_sparse_fwd(..., use_legacy=True)`` on a bf16 cache) beside the
    project's sparse decode (``wgmma`` on bf16 and on its fp8 cache, ``mma``) at V4-Flash's shape (64 heads, d 512,
    top-k 640), each checked against the float32 reference first, in one run (one CUDA-graph replay a call, L2
    flushed), with each cache format's memory floor (the bytes it reads over the copy bandwidth measured in the same
    run). Writes the markdown table (date, GPU, commit, this file) to ``out`` and its JSON beside it."""
    from kernels.sparse_decode import quantize_kv_fp8, sparse_decode
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma
    from tuner.targets.workload.gpu_ops import V4_BYTES, dequantize_v4, flashmla_attention, quantize_v4
    from tuner.targets.workload.ops import sparse_attention_torch

    bw = measure_copy_bandwidth()
    d, scale = 512, 512**-0.5
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.randn(rows, d, device="cuda", generator=g).to(torch.bfloat16)
    fp8, fp8_scale = quantize_kv_fp8(pool)
    v4 = quantize_v4(pool.float())
    v4_rows = dequantize_v4(v4, rows).to(torch.bfloat16)
    kv_fn, sparse_fn = flashmla_attention("flashmla_kv"), flashmla_attention("flashmla_sparse")
    ways = {  # name: (cache format, bytes a selected row, the call, the pool its reference reads)
        "flashmla_kv (FlashMLA, V4 fp8 cache)": ("V4 fp8", V4_BYTES, lambda q, i: kv_fn(q, v4, i, scale), v4_rows),
        "flashmla_sparse (FlashMLA, bf16 cache)": ("bf16", 2 * d, lambda q, i: sparse_fn(q, pool, i, scale), pool),
        "wgmma (project, bf16 cache)": ("bf16", 2 * d, lambda q, i: sparse_decode_wgmma(q, pool, i, scale), pool),
        "wgmma (project, fp8 cache)": (
            "e4m3 + fp32 scale",
            d + 4,
            lambda q, i: sparse_decode_wgmma(q, fp8, i, scale, kv_scale=fp8_scale),
            (fp8.float() * fp8_scale[:, None]).to(torch.bfloat16),
        ),
        "mma (project, bf16 cache)": ("bf16", 2 * d, lambda q, i: sparse_decode(q, pool, i, scale), pool),
    }
    results = []
    for b in batches:
        q = torch.randn(b, heads, d, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, rows, (b, topk), device="cuda", generator=g, dtype=torch.int32)
        for name, (fmt, row_bytes, call, ref_pool) in ways.items():
            row = {"batch": b, "way": name, "format": fmt, "bytes_per_row": row_bytes}
            try:
                ref = sparse_attention_torch(q.float(), ref_pool.float(), idx.long(), scale)
                row["err"] = rel_error(call(q, idx).float(), ref)
                row["us"] = do_bench(lambda _: call(q, idx), [0], rep_ms=rep_ms, cuda_graph=True).median_us
            except Exception as exc:  # noqa: BLE001 - a way that cannot run here is a row with its reason
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            moved = b * topk * row_bytes + 2 * b * heads * d * 2  # the selected rows, q in and o out
            row["floor_us"] = moved / bw * 1e6
            results.append(row)
            log.info("%s", row)
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": git_commit(),
        "source": "benchmarks/kernels.py --flashmla",
        "bw": bw,
    }
    lines = [
        f"# FlashMLA beside the project's sparse decode ({meta['date']}, {meta['gpu']}, commit {meta['commit']})",
        "",
        f"From `{meta['source']}` (torch {meta['torch']}, triton {meta['triton']}); V4-Flash's decode "
        f"attention: {heads} heads, d {d}, top-k {topk}, {rows} cached rows; one CUDA-graph replay a call, L2 "
        f"flushed; floor = bytes read / copy bandwidth {bw / 1e12:.2f} TB/s measured in the same run.",
        "",
        "| batch | way | cache format (bytes a row) | µs | floor µs | x floor | rel. error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        us = f"{r['us']:.1f}" if "us" in r else r.get("error", "-")
        xf = f"{r['us'] / r['floor_us']:.2f}" if "us" in r else "-"
        err = f"{r['err']:.1e}" if "err" in r else "-"
        lines.append(
            f"| {r['batch']} | {r['way']} | {r['format']} ({r['bytes_per_row']}) | {us} | "
            f"{r['floor_us']:.1f} | {xf} | {err} |"
        )
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1, default=str))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="kernels.md")
    ap.add_argument("--json", default=None, help="raw results (default: --out with .json)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this many seconds")
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--rep-ms", type=float, default=12.0)
    ap.add_argument("--only", default="", help="comma-separated kernel names")
    ap.add_argument("--quick", action="store_true", help="smaller samples")
    ap.add_argument("--no-gemm-sweep", action="store_true", help="GEMM: time the shipped config and the library only")
    ap.add_argument("--v32", action="store_true", help="also sweep the DeepSeek-V3.2 sparse decode shapes")
    ap.add_argument(
        "--shipped-only",
        action="store_true",
        help="no sweep: time the default and the shipped tuned config (with the torch path and the previous kernel)",
    )
    ap.add_argument(
        "--report-from",
        metavar="RESULTS_JSON",
        default=None,
        help="no benchmark: write the markdown report (--out) of a stored results JSON",
    )
    ap.add_argument(
        "--ncu-summary",
        metavar="FILE",
        default=None,
        help="append this Nsight Compute summary (benchmarks/profile_sparse_decode.py --summarise) to the report",
    )
    ap.add_argument(
        "--write-tuned",
        metavar="RESULTS_JSON",
        default=None,
        help="no benchmark: write the tuned-config files of a results JSON into --tuned-dir, for the GPU "
        "and Triton version it names",
    )
    ap.add_argument(
        "--tuned-dir",
        metavar="DIR",
        default=None,
        help="with --write-tuned: a folder of your own (never kernels/tuned/, which only `tuner search "
        "--target kernels` writes); point $TUNER_KERNEL_CONFIG_DIR at it to use its configs",
    )
    ap.add_argument(
        "--flashmla",
        metavar="OUT_MD",
        default=None,
        help="only time FlashMLA beside the project's sparse decode at V4-Flash's shape (needs sm_90 and "
        "sgl-flash-mla) and write that table",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    if args.flashmla:
        if not torch.cuda.is_available():
            log.error("no CUDA device: nothing to benchmark")
            return 2
        print(flashmla_table(Path(args.flashmla), rep_ms=args.rep_ms))
        return 0
    if args.write_tuned:
        from tuner.errors import InputError

        if not args.tuned_dir:
            print(
                "error: --write-tuned needs --tuned-dir DIR (a folder of your own; kernels/tuned/ is written only "
                "by `tuner search --target kernels`)",
                file=sys.stderr,
            )
            return 2
        try:
            paths = write_tuned(Path(args.write_tuned), Path(args.tuned_dir))
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for path in paths:
            print(path)
        return 0
    if args.report_from:
        data = read_json(args.report_from)
        text = report(
            data["rows"],
            data["meta"],
            Path(args.ncu_summary) if args.ncu_summary else None,
            source=Path(args.report_from),
        )
        Path(args.out).write_text(text)
        print(text)
        return 0
    if not torch.cuda.is_available():
        log.error("no CUDA device: nothing to benchmark")
        return 2
    t_start = time.time()
    deadline = t_start + args.budget_s
    jobs = plan(args.quick, gemm_sweep=not args.no_gemm_sweep)
    if not args.v32:
        jobs = [j for j in jobs if j.get("preset") != "v32"]
    if args.shipped_only:
        jobs = [dict(j, configs=[]) for j in jobs]
    if args.only:
        keep = set(args.only.split(","))
        jobs = [j for j in jobs if j["kernel"] in keep]
    failures = precompile(jobs, args.jobs, t_start + 0.45 * args.budget_s)
    precompile_s = time.time() - t_start
    bw, flops = measure_copy_bandwidth(), measure_matmul_tflops()
    launch_us = measure_launch_us().median_us
    rates = {"bw": bw, "flops": flops, "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    log.info("copy %.2f TB/s, bf16 matmul %.0f TFLOP/s", bw / 1e12, flops / 1e12)
    rows = []
    weights = [len(j["shapes"]) * (1 + len(j["configs"])) for j in jobs]
    for i, job in enumerate(jobs):
        # share what is left of the budget among the remaining jobs, by their number of trials
        job_deadline = time.time() + max(5.0, (deadline - time.time()) * weights[i] / sum(weights[i:]))
        try:
            rows += bench_job(job, rates, failures, job_deadline, args.rep_ms)
        except Exception:
            log.error("job %s %s failed:\n%s", job["kernel"], job["dtype"], traceback.format_exc())
    choose_gemm_impls(rows)
    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
        "bw": bw,
        "flops": flops,
        "launch_us": launch_us,
        "wall_s": time.time() - t_start,
        "precompile_s": precompile_s,
    }
    text = report(rows, meta)
    Path(args.out).write_text(text)
    json_path = Path(args.json) if args.json else Path(args.out).with_suffix(".json")
    tuned = {}
    for r in rows:
        if r["best_config"] and r["default_us"]:
            entry = {
                "config": r["best_config"],
                "time_us": round(r["best_us"], 2),
                "default_time_us": round(r["default_us"], 2),
            }
            if r["kernel"] == "gemm":
                entry.update(impl=r["impl"], library_time_us=round(r["torch_us"], 2) if r["torch_us"] else None)
            tuned.setdefault(f"{r['kernel']}|{r['dtype']}", {})[r["key"]] = entry
    json_path.write_text(json.dumps({"meta": meta, "rows": rows, "tuned": tuned}, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
