"""How fast does the kernel search get near the exhaustive best, and what does it cost against triton.autotune?

Replay mode (default, CPU, no GPU): the recorded H200 sweep of the split-K sparse decode kernel at batch 16
(``tests/kernels/data/sparse_decode_sweep_h200_b16.json``) is replayed: Optuna TPE, configured exactly as the tuner's
sub-studies are (``tuner.search.open_context``: multivariate, grouped, constant liar, same start-up count), and random
search, each at 5%, 10% and 20% of the exhaustive evaluation count, over many seeds. A config that breaks a
``check_config`` rule is pruned before compile (costs nothing, told to Optuna as infeasible); a repeat is answered
from the table (costs nothing); every other ask is one evaluation (one compile + one timing). Reported: median
and worst gap to the exhaustive best, how often within 3%, with and without the default config enqueued first
(the tuner always enqueues it), and the wall time of each against what triton.autotune spends (every config
compiled and timed serially).

GPU mode (``--gpu``, one H200; ``benchmarks/tuner_efficiency_gpu.sh`` runs it with the kernels' GPU tests in one
command): the cases of ``GPU_CASES`` (issue 20: the sparse decode kernel at batch 1/16/64, its FP8 KV variant at batch
1/64, the skinny GEMM at M=1/16/64 on two V4-Flash shapes as samples of its space, the indexer with the time left),
every table HELD OUT from tuning the kernel search; ``--cases`` picks another set of ``CASE_SETS`` (the GEMM with
aligned tile copies: its tuning tables and its held-out tables, swept to separate files). Configs are compiled in helper processes
(``tuner.execution.compile_ahead``, nothing launched) while this process checks each config against the float32
reference and times it with ``kernels.bench.do_bench`` (L2 flush, CUDA graphs, input rotation), the torch path beside;
the tables are written as JSON and analysed on a CPU (``--analyze-gpu FILE``; ``--goal held_out`` reports issue 20's
goal per table; ``--goal tuning`` the same on the recorded tables the configuration was tuned on).

    python benchmarks/tuner_efficiency.py                       # replay -> benchmarks/results/tuner_efficiency/cpu/<date>_<commit>.md
    python benchmarks/tuner_efficiency.py --gpu --out $OUT      # GPU sweep -> $OUT/tuner_efficiency_gpu.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as a script, this folder is sys.path[0] and its kernels.py would shadow the `kernels` package
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

from benchmarks.common import read_json, result_path, short_commit

TABLE = ROOT / "tests" / "kernels" / "data" / "sparse_decode_sweep_h200_b16.json"
COMPILE_S = 1.15  # recorded: compiling one config of the sparse decode kernel on the H200 host
TIMING_S = 0.06  # recorded: timing one config
TRIAL_OVERHEAD_S = 2.0  # a fresh trial process (python + torch import), measured on the CPU box; the kernel
# search's persistent worker pays it once per GPU (then ~0.1 s per trial on the H200, benchmarks/results/tuner_efficiency/h200/2026-11-29_e12a643.md)
AUTOTUNE_TIMING_S = 0.125  # triton.testing.do_bench defaults used by triton.autotune: warmup 25 ms + rep 100 ms
FRACTIONS = (0.05, 0.10, 0.20)


# -- replay ------------------------------------------------------------------------------------------------------
@dataclass
class _Record:
    """One replayed trial as ``tuner.search.refine.choose_move`` reads a stored one."""

    number: int
    params: dict
    outcome: str
    value: float | None
    repeat_of: int | None = None
    """The earlier record whose timing this one copies (a configuration TPE proposed again)."""


def resolved_space(space: dict, default: dict | None):
    """The replay's space as the tuner resolves a kernel space (one categorical per config field)."""
    from search_spaces.hardware import Hardware
    from search_spaces.loader import load_space_text
    from search_spaces.resolve import resolve

    params = {}
    for k, values in space.items():
        values = list(values)
        d = (default or {}).get(k, values[0])
        params[k] = {"type": "categorical", "values": values if d in values else sorted([*values, d]), "default": d}
    doc = {
        "name": "replay",
        "target": "kernels",
        "params": params,
        "objective": {"metric": "time_us", "direction": "minimize", "combine": "level", "levels": [1], "level": 1},
    }
    return resolve(load_space_text(json.dumps(doc)), Hardware())


def replay_once(
    table: dict,
    space: dict,
    rule,
    budget: int,
    seed: int,
    strategy: str,
    first: list[dict] | None,
    lookahead: int = 1,
    resolved=None,
    canonical=None,
    nearest=None,
) -> tuple[float, int]:
    """One search over a measured table; returns (best time found, evaluations spent). ``first``: the configs
    enqueued before sampling (the default, then the kernel's seed configs), as the tuner does. ``lookahead``:
    trials asked before the oldest is told, as the kernel search does when it compiles ahead. ``strategy``:
    ``tpe``, ``random``, ``tpe+moves`` (a repeat is followed by a one-change move from the best, ``tuner.search.refine``)
    or ``tpe+refine:S`` (that, and moves before every ask in the last share S of the evaluations). ``canonical``: the
    kernel's ``canonical_config``; a config whose canonical form was seen is a repeat, as in the kernel search.
    ``nearest`` (a sampled table): a rule-passing config outside the table is one evaluation that gets the time of
    the table's config ``nearest(key)`` names (the sample stands for the space around it); without it such a config
    is pruned for free, as every rule-passing config of an exhaustive table is in it."""
    import optuna

    from tuner.search.context import set_constraints
    from tuner.search.kernel_search import kernel_sampler
    from tuner.search.trial import penalty_value

    keys = list(space)
    if resolved is None:
        resolved = resolved_space(space, (first or [None])[0])
    if strategy.startswith("tpe"):  # the kernel search's own sampler: asked ahead, it runs with a constant liar
        sampler = kernel_sampler(resolved, seed, parallel=lookahead > 1)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    moves_on_repeat = strategy.startswith("tpe+")
    share = float(strategy.split(":")[1]) if strategy.startswith("tpe+refine:") else 0.0
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for config in first or []:
        study.enqueue_trial(config)
    seen: dict[tuple, float] = {}
    timed_at: dict[tuple, int] = {}
    records: list[_Record] = []
    best, evals, repeats, asks = math.inf, 0, 0, 0
    move = False
    pending: list = []
    while evals < budget and asks < 40 * budget + 200:
        while len(pending) < max(1, min(lookahead, budget - evals)):
            if moves_on_repeat and (move or (share and evals >= math.ceil((1 - share) * budget))):
                _enqueue_move(study, resolved, records, rule, canonical)
            move = False
            asks += 1
            trial = study.ask()  # sampled when asked, as the kernel search does before compiling ahead
            pending.append((trial, {k: trial.suggest_categorical(k, space[k]) for k in keys}))
        trial, config = pending.pop(0)
        key = tuple((canonical(config) if canonical else config)[k] for k in keys)
        if key in seen:  # told what the earlier trial was told, as tuner.search.run_one does
            set_constraints(trial, [0.0 if seen[key] < penalty_value("minimize") else 1.0])
            study.tell(trial, seen[key])
            records.append(_Record(len(records), config, "ok", seen[key], timed_at[key]))
            move = moves_on_repeat
            repeats += 1
            if repeats >= 25:  # tuner.search.MAX_REPEATS_IN_A_ROW
                break
            continue
        repeats = 0
        if rule(config) or (key not in table and nearest is None):
            value, outcome = penalty_value("minimize"), "invalid_config"  # pruned before compile: free
        else:
            evals += 1
            t = table[key] if key in table else table[nearest(key)]
            value, outcome = (t, "ok") if t is not None else (penalty_value("minimize"), "failed")
            if t is not None:
                best = min(best, t)
        seen[key], timed_at[key] = value, len(records)
        records.append(_Record(len(records), config, outcome, value if outcome == "ok" else None))
        set_constraints(trial, [0.0 if outcome == "ok" else 1.0])  # as tuner.search.trial._record
        study.tell(trial, value)
    return best, evals


def _enqueue_move(study, resolved, records: list[_Record], rule, canonical=None) -> None:
    """Enqueue ``tuner.search.refine``'s next one-change move (the real chooser, over the replayed records)."""
    from tuner.search.refine import asked_keys, choose_move

    m = choose_move(
        resolved, records, "minimize", lambda c: rule(c) or None, asked_keys(study, resolved, canonical), canonical
    )
    if m is not None:
        study.enqueue_trial(m.params)


def analyse(
    name: str,
    rows: list[dict],
    space: dict,
    rule,
    default: dict | None,
    seeds: int,
    compile_s: float,
    timing_s: float,
    autotune_timing_s: float = AUTOTUNE_TIMING_S,
    starts: list[dict] | None = None,
    lookahead: int = 1,
    strategies: tuple[str, ...] = ("tpe", "random"),
    firsts: tuple[bool, ...] = (True, False),
    canonical=None,
    sampled: bool = False,
    fractions: tuple[float, ...] = FRACTIONS,
) -> dict:
    """Replay TPE and random at each fraction of the table over ``seeds`` seeds; with ``starts`` (the kernel's
    seed configs) the "first" runs enqueue the default and then them, as ``tuner.search.kernel_search`` does.
    ``canonical`` (the kernel's ``canonical_config``): rows of one program are one row (its fastest timing), the
    fractions are of the programs, and a config is looked up by its program, as the kernel search finds repeats.
    ``sampled``: the rows are a sample of the space; a draw outside it takes its nearest sampled config's time
    (:func:`nearest_in`). ``fractions``: the fractions of the table replayed (``--fractions``; each is a separate
    replay of that budget)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    keys = list(space)
    if canonical is not None:
        rows = collapse_programs(rows, canonical)
    table = {tuple(r["config"][k] for k in keys): r["time_us"] for r in rows}
    ok = [r for r in rows if r["time_us"] is not None]
    best_all = min(r["time_us"] for r in ok)
    passing = [r for r in ok if not rule(r["config"])]
    best_rules = min(r["time_us"] for r in passing) if passing else math.inf
    canon = canonical or (lambda c: c)
    default_t = table.get(tuple(canon(default)[k] for k in keys)) if default else None
    n = len(rows)
    keyset = set(table)
    starts = [c for c in (starts or []) if tuple(canon(c)[k] for k in keys) in keyset]
    first = ([default] if default else []) + starts
    resolved = resolved_space(space, default)
    nearest = nearest_in(list(table), space) if sampled else None
    out = {
        "name": name,
        "n": n,
        "ok": len(ok),
        "starts": len(starts),
        "failed": n - len(ok),
        "rule_pruned": sum(1 for r in rows if rule(r["config"])),
        "best": best_all,
        "best_rules": best_rules,
        "default": default_t,
        "runs": [],
    }
    for frac in fractions:
        budget = max(1, round(frac * n))
        for strategy in strategies:
            for with_default in firsts:
                gaps, evals = [], []
                for seed in range(seeds):
                    b, e = replay_once(
                        table,
                        space,
                        rule,
                        budget,
                        seed,
                        strategy,
                        first if with_default else None,
                        lookahead,
                        resolved,
                        canonical,
                        nearest,
                    )
                    gaps.append(b / best_all - 1 if math.isfinite(b) else math.inf)
                    evals.append(e)
                out["runs"].append(
                    {
                        "frac": frac,
                        "budget": budget,
                        "strategy": strategy,
                        "default_first": with_default,
                        "median_gap": statistics.median(gaps),
                        "worst_gap": max(gaps),
                        "within3": sum(g <= 0.03 for g in gaps),
                        "seeds": seeds,
                        "mean_evals": statistics.mean(evals),
                    }
                )
    per_eval = compile_s + timing_s
    tpe10 = next(
        r
        for r in out["runs"]
        if r["frac"] == 0.10 and r["strategy"] == strategies[0] and r["default_first"] == firsts[0]
    )
    out["wall"] = {
        "per_eval_s": per_eval,
        "tpe10_s": tpe10["mean_evals"] * per_eval,
        "tpe10_with_process_s": tpe10["mean_evals"] * (per_eval + TRIAL_OVERHEAD_S),
        "exhaustive_serial_s": n * per_eval,
        "autotune_s": n * (compile_s + autotune_timing_s),
    }
    return out


def nearest_in(keys: list[tuple], space: dict):
    """``nearest(key)``: the key of ``keys`` (a sampled table's) with the fewest fields different from ``key``, ties
    broken by the summed log2 distance of the differing values, then by the table's order; remembered per key."""
    names = list(space)
    memo: dict[tuple, tuple] = {}

    def dist(a: tuple, b: tuple) -> tuple[int, float]:
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        return len(diff), sum(abs(math.log2(max(float(x), 1.0) / max(float(y), 1.0))) for x, y in diff)

    def nearest(key: tuple) -> tuple:
        if key not in memo:
            memo[key] = min(keys, key=lambda k: dist(key, k))
        return memo[key]

    assert all(len(k) == len(names) for k in keys)
    return nearest


def collapse_programs(rows: list[dict], canonical) -> list[dict]:
    """One row per program: rows whose configs have the same ``canonical`` form merge into the first of them, with
    that form as its config and the fastest of their timings (``None`` only if every one failed)."""
    merged: dict[str, dict] = {}
    for r in rows:
        c = canonical(r["config"])
        key = json.dumps(c, sort_keys=True)
        if key not in merged:
            merged[key] = {**r, "config": c}
        elif r["time_us"] is not None:
            t = merged[key]["time_us"]
            merged[key] = {
                **merged[key],
                "time_us": r["time_us"] if t is None else min(t, r["time_us"]),
                "status": "ok",
            }
    return list(merged.values())


def _starts(kernel: str, shape: dict, dtype: str) -> list[dict]:
    """What the kernel search tries right after the default (``tuner.search.kernel_search.starting_configs``)."""
    from tuner.search.kernel_search import KernelCase, starting_configs

    return starting_configs(KernelCase(kernel, dict(shape), dtype), None)


def recorded_case(seeds: int, lookahead: int = 1, **kw) -> dict:
    from kernels.sparse_decode import SparseDecodeKernel

    data = json.loads(TABLE.read_text())
    cols = data["columns"][:5]
    kernel = SparseDecodeKernel()
    shape = next(s for s in kernel.shapes("v4flash") if s["batch"] == data["batch"])
    rows = [
        {"config": dict(zip(cols, r[:5])), "time_us": r[5] if r[6] == "ok" else None, "status": r[6]}
        for r in data["rows"]
    ]
    space = {c: sorted({r["config"][c] for r in rows}) for c in cols}

    def rule(config):
        return kernel.check_config(config, shape, None, dtype="bfloat16")

    return analyse(
        f"sparse_decode, batch {data['batch']} (recorded H200 sweep)",
        rows,
        space,
        rule,
        kernel.default_config(shape),
        seeds,
        data.get("compile_seconds_per_config_approx", COMPILE_S),
        TIMING_S,
        starts=_starts(kernel.name, shape, "bfloat16"),
        lookahead=lookahead,
        **kw,
    )


def _pct(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{100 * x:.1f}%"


def markdown(results: list[dict], header: list[str]) -> str:
    lines = header + [""]
    for res in results:
        lines += [
            f"## {res['name']}",
            "",
            f"{res['n']} configs in the table ({res['ok']} ran correctly, {res['failed']} failed); "
            f"{res['rule_pruned']} are pruned by `check_config` before compile in the tuner. Exhaustive best "
            f"{res['best']:.2f} us (best among rule-passing configs {res['best_rules']:.2f} us); the default config "
            + (
                f"{res['default']:.2f} us ({_pct(res['default'] / res['best'] - 1)} off)."
                if res["default"]
                else "not in the table."
            )
            + (
                f' "First" = the default, then the kernel\'s {res["starts"]} seed configs (`seed_configs`: grids that '
                "fill the GPU in one wave), as the tuner enqueues them."
                if res.get("starts")
                else ""
            ),
            "",
            "| budget (evals) | strategy | default (+ seeds) first | median gap | worst gap | within 3% | mean evals |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in res["runs"]:
            lines.append(
                f"| {int(r['frac'] * 100)}% ({r['budget']}) | {r['strategy']} | {'yes' if r['default_first'] else 'no'} | "
                f"{_pct(r['median_gap'])} | {_pct(r['worst_gap'])} | {r['within3']}/{r['seeds']} | {r['mean_evals']:.1f} |"
            )
        w = res["wall"]
        lines += [
            "",
            f"Wall time at {w['per_eval_s']:.2f} s per evaluation (compile + timing): TPE at 10% "
            f"{w['tpe10_s']:.0f} s ({w['tpe10_with_process_s']:.0f} s counting a ~{TRIAL_OVERHEAD_S:.0f} s "
            f"process start per trial, which the persistent trial worker now pays once per GPU); exhaustive serial sweep {w['exhaustive_serial_s']:.0f} s; triton.autotune over "
            f"every config (serial compile + do_bench 25+100 ms, no L2 flush) {w['autotune_s']:.0f} s = "
            f"{w['autotune_s'] / w['tpe10_s']:.1f}x TPE@10% ({w['autotune_s'] / w['tpe10_with_process_s']:.1f}x with "
            "the subprocess overhead).",
            "",
        ]
        if "extra" in res:
            lines += res["extra"] + [""]
    return "\n".join(lines) + "\n"


# -- GPU: exhaustive sweep ----------------------------------------------------------------------------------------
INDEXER_CASE = ("indexer", {"batch": 16, "heads": 64, "dim": 128, "width": 65536, "shared_k": 0})
"""The case of the triton.autotune comparisons (``--autotune-probe``, ``--vs-autotune``)."""
RESULTS = ROOT / "benchmarks" / "results"
RECORDED_SWEEPS = (
    "tuner_efficiency/h200/2026-11-29_634ba5c_sweeps.json.gz",
    "tuner_efficiency/h200/2026-11-29_634ba5c_moe.json.gz",
    "tuner_efficiency/h200/2026-11-30_a39226e_issue20.json.gz",
    "tuner_efficiency/h200/2026-11-30_a677738_gemm_aligned_tuning.json.gz",
)
"""The tuning set, with ``TABLE``: exhaustive H200 tables the kernel search's configuration may be tuned on. The first
two were recorded before issue 20; the third (2026-11-30 at a39226e: GEMM samples at M = 1/16/64, N x K = 1024 x 4096
and 4096 x 2048, the indexer at batch 1) was held out once, reported in that state, and then read to set the GEMM's
``seed_configs``, so it is tuning data now. The fourth (2026-11-30 at a677738, ``--cases gemm_aligned_tuning``) holds
the same GEMM shapes for the kernel with aligned tile copies; its tables replace the third file's GEMM tables (a later
file's table of a kernel and shape wins), which timed the earlier kernel."""


@dataclass(frozen=True)
class SweepCase:
    kernel: str
    shape: dict
    dtype: str = "bfloat16"
    held_out: bool = True
    """Held out: never used to tune the kernel search's configuration, only to report it."""
    max_configs: int | None = None
    """A uniform random sample (fixed seed) of at most this many rule-passing configs, where the whole space does not
    fit the sweep's time (plus the default and the starting configs, which every search runs); the replay then
    searches the sample and gaps are relative to its best."""
    optional: bool = False
    """Swept only with the time the others leave (not counted when the time is shared out)."""
    cost: float = 1.0
    """Relative time per config, for sharing the time out: compiling is the bottleneck (about 2.5 s per sparse decode
    config on a 16-CPU H200 host, 14 at a time, against ~0.05 s of timing), and a case whose binaries an earlier
    case compiled (same specialisation) only pays for timing."""


_SD = {"heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}  # V4-Flash sparse decode
_GEMM = ({"N": 2048, "K": 4096}, {"N": 4096, "K": 1024})  # V4-Flash decode GEMMs no table of the tuning set has
GEMM_SAMPLE = 600
GPU_CASES = [  # issue 20, second held-out set, fixed before it ran. Sparse decode: the kernel as issue 20 rewrote it
    # (the tuning set's sparse decode tables are the earlier kernel's), swept with 16 warps in its space too, which then
    # left it (never the best). GEMM: shapes that no tuning table has, the M=1 and M=16 tables exhaustive. In order of
    # priority; `--only KERNEL[@KEY=VALUE]` runs some of them.
    SweepCase("sparse_decode", {"batch": 1, **_SD}, cost=2.0),
    SweepCase("sparse_decode", {"batch": 64, **_SD}, cost=2.0),
    SweepCase("sparse_decode", {"batch": 16, **_SD}),  # batch 64's binaries (batch is not 1 in either)
    SweepCase("sparse_decode", {"batch": 64, **_SD}, "float8_e4m3fn", optional=True),
    SweepCase("sparse_decode", {"batch": 1, **_SD}, "float8_e4m3fn", optional=True),
    # M=16 compiles its own binaries (Triton specialises an int divisible by 16): the first run's cost of 0.3 for it,
    # which assumed M=1's binaries, left both M=16 tables a third timed; `--only gemm@M=16` completed them
    *(SweepCase("gemm", {"M": m, **nk}) for nk in _GEMM for m in (1, 16)),
    *(SweepCase("gemm", {"M": 64, **nk}, max_configs=GEMM_SAMPLE, optional=True) for nk in _GEMM),
]
_GEMM_TUNING = ({"N": 1024, "K": 4096}, {"N": 4096, "K": 2048})  # the shapes of the a39226e tuning tables
GEMM_ALIGNED_TUNING = [  # the GEMM after 0998650 (16-byte async tile copies; every earlier GEMM table timed 2-byte
    # loads, a different kernel): the tuning set's shapes again, exhaustive at M=1 and 16 and a sample at M=64. Tuning
    # data: read to set the GEMM's seed configs; each replaces the earlier kernel's table of its shape.
    *(SweepCase("gemm", {"M": m, **nk}, held_out=False) for nk in _GEMM_TUNING for m in (1, 16)),
    *(SweepCase("gemm", {"M": 64, **nk}, held_out=False, max_configs=GEMM_SAMPLE) for nk in _GEMM_TUNING),
]
GEMM_ALIGNED_HELD_OUT = [  # the same kernel at the held-out set's GEMM shapes, fixed before either ran; never read
    # to set anything, only reported
    *(SweepCase("gemm", {"M": m, **nk}) for nk in _GEMM for m in (1, 16)),
    *(SweepCase("gemm", {"M": 64, **nk}, max_configs=GEMM_SAMPLE) for nk in _GEMM),
]
_GEMM_FRESH = ({"N": 1536, "K": 7168}, {"N": 7168, "K": 2048})  # shapes no table had (DeepSeek-V3-like decode)
GEMM_M64_HELD_OUT = [  # fixed 2026-11-30 before it ran, after the kernel search learnt to time each program once: M=64
    # exhaustive (the earlier M=64 tables were 600-config samples) at two fresh shapes, then the two held-out V4-Flash
    # shapes whose samples missed the goal; never read to set anything, only reported
    *(SweepCase("gemm", {"M": 64, **nk}) for nk in _GEMM_FRESH),
    *(SweepCase("gemm", {"M": 64, **nk}, optional=True) for nk in _GEMM),
]
WGMMA_SAMPLE = 600
WGMMA_HELD_OUT = [  # fixed 2026-12-01 before it ran: the Gluon wgmma sparse decode (the H200's default attention
    # kernel; 4389 canonical configs a batch, too many to compile and time whole in one device session), a uniform
    # sample at batch 64 then 1; never read to set anything, only reported
    SweepCase("sparse_decode_wgmma", {"batch": 64, **_SD}, max_configs=WGMMA_SAMPLE),
    SweepCase("sparse_decode_wgmma", {"batch": 1, **_SD}, max_configs=WGMMA_SAMPLE, optional=True),
]
WGMMA_EXHAUSTIVE = [  # fixed 2026-12-02 before it ran: the wgmma kernel's whole space at batch 64 then 1 (4389
    # canonical configs a batch, 1710 distinct builds, the same at both batches); never read to set anything, only
    # reported. Its first run (b7d17bf, in git history:
    # git show d1e7663:benchmarks/results/data/tuner_efficiency_h200_wgmma_exhaustive_partial_b7d17bf.json) timed 1596
    # of batch 64's 4389 in a 540 s window: each config's first launch took 0.30 s (median), most of it rel_error's
    # copy of the 2M-value output and reference to the host beside 14 busy compile helpers. With rel_error on the
    # GPU (3d03109, tuner_efficiency/h200/2026-12-02_3d03109_wgmma_exhaustive.json.gz) first launches took 0.004 s and both
    # batches were timed whole in one call (418 + 91 s, bound by the compiles)
    SweepCase("sparse_decode_wgmma", {"batch": 64, **_SD}),
    SweepCase("sparse_decode_wgmma", {"batch": 1, **_SD}, optional=True),
]
CASE_SETS = {
    "issue20_held_out": GPU_CASES,
    "gemm_aligned_tuning": GEMM_ALIGNED_TUNING,
    "gemm_aligned_held_out": GEMM_ALIGNED_HELD_OUT,
    "gemm_m64_held_out": GEMM_M64_HELD_OUT,
    "wgmma_held_out": WGMMA_HELD_OUT,
    "wgmma_exhaustive": WGMMA_EXHAUSTIVE,
}
"""``--cases``: which sweep ``--gpu`` runs (a tuning set and a held-out set go to separate files)."""


def sweep_configs(case: SweepCase, device: str | None) -> tuple[list[dict], int]:
    """The configs a case times, in the order it times them (shuffled, so a cap cuts an unbiased sample), and the
    number of rule-passing programs in its space: each program once, in the kernel's canonical form
    (``canonical_config``; GEMM: GROUP_M=1 where there is one row block), as the kernel search times it."""
    from kernels.registry import get_kernel

    kernel = get_kernel(case.kernel)
    configs = [
        c for c in kernel.configs(case.shape, device, dtype=case.dtype) if kernel.canonical_config(c, case.shape) == c
    ]
    space_size = len(configs)
    random.Random(0).shuffle(configs)
    if case.max_configs and case.max_configs < space_size:
        must = [
            kernel.canonical_config(c, case.shape)
            for c in (kernel.default_config(case.shape), *_starts(case.kernel, case.shape, case.dtype))
        ]
        must = [c for i, c in enumerate(must) if c in configs and c not in must[:i]]
        configs = must + [c for c in configs if c not in must][: max(0, case.max_configs - len(must))]
        random.Random(1).shuffle(configs)
    return configs, space_size


def _first_run(kernel, inputs, out, ref, config, device: str) -> float:
    """One launch into a NaN-poisoned output, synchronised; the relative error against ``ref``."""
    import torch

    from kernels.base import rel_error

    if out is not None:
        out.fill_(float("nan")) if out.is_floating_point() else out.fill_(-7)
        result = kernel.run(inputs, config, out=out)
    else:
        result = kernel.run(inputs, config)
    if device == "cuda":
        torch.cuda.synchronize()
    return rel_error(result, ref)


def _bench(fn, sets, rep_ms: float, device: str) -> dict:
    """``kernels.bench.do_bench`` on a GPU; on a CPU (Triton's interpreter: tests of this script only) the median
    wall time of three calls after a warm-up, which says nothing about speed."""
    if device == "cuda":
        from kernels.bench import do_bench

        t = do_bench(fn, sets, rep_ms=rep_ms)
        return {"time_us": t.median_us, "spread": t.spread, "graph": t.graph}
    fn(sets[0])
    samples = []
    for i in range(3):
        s = time.perf_counter()
        fn(sets[i % len(sets)])
        samples.append((time.perf_counter() - s) * 1e6)
    return {"time_us": statistics.median(samples), "spread": None, "graph": False}


def gpu_sweep(
    cases: list[SweepCase], deadline_s: float, helpers: int, rep_ms: float, on_case=None, device: str = "cuda"
) -> list[dict]:
    """Every case's configs compiled by ``helpers`` processes (``tuner.execution.compile_ahead``: Triton's warmup
    path on meta tensors, nothing launched, so timings are not disturbed; every case's configs are queued at once so
    the helpers compile the next case while this one is timed), and in this process, config by config as their
    binaries arrive: one launch into a poisoned output checked against the float32 reference of the first input
    set, then ``kernels.bench.do_bench`` over the input sets (L2 flush, CUDA graphs for short calls, input rotation),
    and the torch path of the kernel timed the same way. Each case gets a share of the time left in proportion to
    its configs' cost; configs past its share stay untimed (``not_timed``) and their compiles are cancelled.
    ``device="cpu"`` (no helpers, Triton's interpreter) exercises the same code in tests; its times mean nothing."""
    import torch

    from kernels.base import classify_failure
    from kernels.registry import get_kernel
    from tuner.targets.kernels import H200_BYTES_PER_S  # the H200's measured copy rate: each case's floor

    start = time.time()
    plans = [sweep_configs(c, device if device == "cuda" else None) for c in cases]
    ahead = None
    if helpers and device == "cuda":
        from tuner.execution.compile_ahead import CompileAhead

        ahead = CompileAhead(helpers)
        futures = [
            [ahead.submit(c.kernel, c.shape, c.dtype, cfg) for cfg in configs] for c, (configs, _) in zip(cases, plans)
        ]
    else:
        futures = [[None] * len(configs) for configs, _ in plans]
    out_cases = []
    try:
        for i, (case, (configs, space_size)) in enumerate(zip(cases, plans)):
            left = deadline_s - (time.time() - start)
            if left < 5:  # nothing to time it with: not recorded at all
                for fut in futures[i]:
                    if fut is not None:
                        fut.cancel()
                continue
            rest = sum(c.cost * len(p[0]) for c, p in zip(cases[i:], plans[i:]) if not c.optional)
            share = left if case.optional else left * case.cost * len(configs) / max(1.0, rest)
            t0 = time.time()
            kernel = get_kernel(case.kernel)
            sets = []
            for k in range(max(1, min(4, int(2 * 1024**3 // max(kernel.cost(case.shape, case.dtype).bytes, 1.0))))):
                inputs = kernel.make_inputs(case.shape, case.dtype, device, 1 + k)
                sets.append((inputs, kernel.output_like(inputs)))
            ref = kernel.reference(sets[0][0])
            tol = kernel.tolerance(case.dtype)
            torch_t = _bench(lambda item: kernel.torch_baseline(item[0]), sets, rep_ms, device)
            rows = []
            for config, fut in zip(configs, futures[i]):
                row = {"config": config, "status": "not_timed", "time_us": None}
                rows.append(row)
                if time.time() - t0 > share or time.time() - start > deadline_s:
                    if fut is not None:
                        fut.cancel()
                    continue
                if fut is not None:
                    try:
                        row["compile_s"] = fut.result(timeout=max(1.0, min(120.0, share - (time.time() - t0))))
                    except Exception as exc:  # noqa: BLE001 - a helper's failure: the launch below compiles, says why
                        row["helper_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                s = time.time()
                try:
                    err = _first_run(kernel, sets[0][0], sets[0][1], ref, config, device)
                    row.update(rel_error=err, first_launch_s=time.time() - s)
                    if not err <= tol:
                        row["status"] = "wrong_result"
                        continue
                    s = time.time()
                    t = _bench(lambda item, c=config: kernel.run(item[0], c, out=item[1]), sets, rep_ms, device)
                    row.update(status="ok", timing_s=time.time() - s, **t)
                except Exception as exc:  # noqa: BLE001 - a config that fails is a data point
                    row.update(status=classify_failure(exc), reason=f"{type(exc).__name__}: {str(exc)[:200]}")
            timed = [r for r in rows if r["status"] != "not_timed"]
            compiles = [r["compile_s"] for r in rows if r.get("compile_s")]
            out_cases.append(
                {
                    "kernel": case.kernel,
                    "shape": case.shape,
                    "dtype": case.dtype,
                    "held_out": case.held_out,
                    "space_size": space_size,
                    "sampled": len(configs),
                    "compiled": len(timed),
                    "compile_s_per_config": statistics.median(compiles) if compiles else COMPILE_S,
                    "case_wall_s": time.time() - t0,
                    "share_s": share,
                    "workers": helpers,
                    "rows": rows,
                    "default": kernel.default_config(case.shape),
                    "torch_us": torch_t["time_us"],
                    "floor_us": kernel.cost(case.shape, case.dtype).bytes / H200_BYTES_PER_S * 1e6,
                }
            )
            del sets, ref
            if device == "cuda":
                torch.cuda.empty_cache()
            if on_case:
                on_case(out_cases[-1])
    finally:
        if ahead is not None:
            ahead.close()
    return out_cases


def autotune_probe(n: int) -> dict:
    """Real triton.autotune over ``n`` indexer configs in a fresh Triton cache (run in its own process)."""
    import torch
    import triton

    from kernels.indexer import _indexer_kernel
    from kernels.registry import get_kernel

    name, shape = INDEXER_CASE
    kernel = get_kernel(name)
    configs = list(kernel.configs(shape, "cuda", dtype="bfloat16"))
    random.Random(1).shuffle(configs)
    configs = configs[:n] if n > 0 else configs  # n <= 0: every rule-passing config
    inp = kernel.make_inputs(shape, "bfloat16", "cuda", 0)
    q, k, w = inp["q"], inp["k"], inp["w"].float()
    B, H, D = q.shape
    width = inp["width"]
    out = torch.empty(B, width, device="cuda", dtype=torch.float32)
    tuned = triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_N": c["BLOCK_N"], "TILES": c["TILES"]}, num_warps=c["num_warps"], num_stages=c["num_stages"]
            )
            for c in configs
        ],
        key=["width"],
    )(_indexer_kernel)

    def launch():
        grid = lambda meta: (B, triton.cdiv(width, meta["BLOCK_N"] * meta["TILES"]))  # noqa: E731
        tuned[grid](
            q,
            k,
            w,
            w,
            w,
            out,
            width,
            H,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(-2),
            w.stride(0),
            0,
            out.stride(0),
            D=D,
            BLOCK_H=max(16, triton.next_power_of_2(H)),
            HAS_SCALE=False,
            HAS_LEN=False,
            SKIP_DEAD=True,
        )

    torch.cuda.synchronize()
    t0 = time.time()
    launch()
    torch.cuda.synchronize()
    wall = time.time() - t0
    ref = kernel.reference(inp)
    from kernels.base import rel_error

    best = getattr(tuned, "best_config", None)
    best_dict = (
        {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages} if best is not None else None
    )
    return {
        "n": len(configs),
        "wall_s": wall,
        "per_config_s": wall / len(configs),
        "rel_error": rel_error(out, ref),
        "best": str(best or ""),
        "best_config": best_dict,
    }


def vs_autotune(frac: float, out: Path) -> list[str]:
    """Same run, cold Triton caches, the indexer case: real ``triton.autotune`` over every rule-passing config
    (its own process) against the tuner's kernel search with ``frac`` of that count as trials (TPE, persistent
    worker, correctness gate), then both winners re-timed side by side with ``kernels.bench.do_bench``."""
    import tempfile

    from kernels.bench import do_bench
    from kernels.registry import get_kernel
    from tuner.search.context import SearchOptions
    from tuner.search.kernel_search import KernelCase, tune_cases

    name, shape = INDEXER_CASE
    kernel = get_kernel(name)
    n = len(list(kernel.configs(shape, "cuda", dtype="bfloat16")))
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-autotune-")}
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, __file__, "--autotune-probe", "0"], env=env, capture_output=True, text=True, timeout=3600
    )
    if p.returncode != 0:
        return [f"triton.autotune failed: {p.stderr[-800:]}"]
    at = json.loads(p.stdout.strip().splitlines()[-1])
    at_process_s = time.time() - t0
    trials = max(1, round(frac * n))
    runs = {}
    for label, ahead in (("tuner, compile ahead off", "0"), ("tuner", "auto")):
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-tuner-")  # workers and helpers inherit it
        work = Path(tempfile.mkdtemp(prefix="tuner-vs-autotune-"))
        url = f"sqlite:///{work / 't.db'}"
        t0 = time.time()
        res = tune_cases(
            [KernelCase(name, dict(shape), "bfloat16")],
            SearchOptions(
                budget_s=3600,
                storage_url=url,
                out_dir=str(work / "out"),
                seed=0,
                n_trials=trials,
                confirm_top=0,
                settings={"retune": True, "compile_ahead": ahead},
            ),
            study="vs-autotune",
        )
        runs[label] = (time.time() - t0, res, _first_launch_s(url, res.cases[0].study))
    sets = []
    for i in range(2):
        inputs = kernel.make_inputs(shape, "bfloat16", "cuda", 11 + i)
        sets.append((inputs, kernel.output_like(inputs)))
    picked = {"triton.autotune": at["best_config"]}
    picked.update(
        {label: {**kernel.default_config(shape), **(r[1].cases[0].config or {})} for label, r in runs.items()}
    )
    times = {
        label: do_bench(lambda item, c=cfg: kernel.run(item[0], c, out=item[1]), sets, rep_ms=100.0).median_us
        for label, cfg in picked.items()
    }
    lines = [
        f"Same run, fresh Triton caches, {name} {kernel.shape_key(shape)} bfloat16, {n} rule-passing configs:",
        f"- triton.autotune over all {n}: {at['wall_s']:.1f} s in the tuned call ({at_process_s:.1f} s with its "
        f"process start); picked {at['best_config']}, re-timed {times['triton.autotune']:.2f} us",
    ]
    for label, (wall, res, first) in runs.items():
        case = res.cases[0]
        fl = (
            f"first launch (compile or cache load) median {statistics.median(first):.2f} s over {len(first)} trials"
            if first
            else "no first-launch times"
        )
        lines.append(
            f"- {label}: {trials} trials ({case.evaluated} configs run), {wall:.1f} s wall, "
            f"{res.compile_ahead or res.preflight.facts.get('compile_ahead', '')}; {fl}; {case.status}, "
            f"picked {picked[label]}, "
            f"re-timed {times[label]:.2f} us ({times[label] / times['triton.autotune'] - 1:+.1%} vs autotune's)"
        )
        lines.append(
            f"  - wall-time ratio autotune / this: {at_process_s / wall:.1f}x "
            f"(in-call only: {at['wall_s'] / wall:.1f}x)"
        )
    (out / "tuner_vs_autotune.md").write_text("\n".join(lines) + "\n")
    return lines


def _first_launch_s(storage_url: str, study: str) -> list[float]:
    """The ``first_launch_s`` metric (compile or cache load + first run + check) of every trial of ``study``."""
    from storage import Repo

    repo = Repo(storage_url)
    run = repo.get_run(study)
    if run is None:
        return []
    return [
        m.value
        for t in repo.list_trials(run.id, with_measurements=True)
        for m in t.measurements
        if m.metric == "first_launch_s" and m.value is not None
    ]


def end_to_end(budget_s: float, out: Path) -> list[str]:
    """A real ``run_kernel_search`` (trials in subprocesses, SQLite) on the first sparse_decode case."""
    import tempfile

    from tuner.search.context import SearchOptions
    from tuner.search.kernel_search import run_kernel_search

    db = Path(tempfile.mkdtemp()) / "tuner.db"
    t0 = time.time()
    try:
        res = run_kernel_search(
            SearchOptions(
                budget_s=budget_s,
                storage_url=f"sqlite:///{db}",
                out_dir=str(out / "e2e"),
                seed=0,
                settings={"only": "sparse_decode", "max_cases": 1},
            )
        )
        lines = res.summary_lines()
        for c in res.cases:
            lines.append(f"  outcomes {c.counts}")
    except Exception as exc:  # noqa: BLE001
        lines = [f"end-to-end kernel search failed: {type(exc).__name__}: {exc}"]
    return [f"run_kernel_search, budget {budget_s:.0f}s, wall {time.time() - t0:.0f}s:"] + lines


def gpu_analysis(data: dict, seeds: int, lookahead: int = 1, held_out: bool | None = None, **kw) -> list[dict]:
    """Replay every case of a sweep (``held_out``: only the held-out cases, or only the others)."""
    from kernels.registry import get_kernel

    results = []
    for case in data["cases"]:
        if held_out is not None and bool(case.get("held_out", False)) != held_out:
            continue
        kernel = get_kernel(case["kernel"])
        shape = case["shape"]
        rows = [
            {"config": r["config"], "time_us": r["time_us"], "status": r["status"]}
            for r in case["rows"]
            if r["status"] != "not_timed"
        ]
        if not any(r["time_us"] for r in rows):
            continue
        space = kernel.config_space(shape)
        timings = [r["timing_s"] for r in case["rows"] if r.get("timing_s")]
        if "compile_s_per_config" in case:  # measured per config in the compile helpers
            compile_s = case["compile_s_per_config"]
        else:  # per-config compile time as one serial process would see it: the pool's wall x workers / configs
            compile_s = case["compile_wall_s"] * case["workers"] / max(1, case["compiled"])
        timing_s = statistics.mean(timings) if timings else TIMING_S

        def rule(config, kernel=kernel, shape=shape, dtype=case["dtype"]):
            return kernel.check_config(config, shape, None, dtype=dtype)

        name = f"{case['kernel']} {kernel.shape_key(shape)} {case['dtype']} (measured on {data['gpu']})"
        sampled = len(rows) < case["space_size"]
        res = analyse(
            name,
            rows,
            space,
            rule,
            case["default"],
            seeds,
            compile_s,
            timing_s,
            starts=_starts(case["kernel"], shape, case["dtype"]),
            lookahead=lookahead,
            canonical=lambda c, kernel=kernel, shape=shape: kernel.canonical_config(c, shape),
            sampled=sampled,
            **kw,
        )
        res["held_out"] = bool(case.get("held_out", False))
        res["sampled"] = sampled
        res["torch_us"], res["floor_us"] = case.get("torch_us"), case.get("floor_us")
        statuses: dict[str, int] = {}
        for r in case["rows"]:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        if "compile_s_per_config" in case:
            sweep = (
                f"Sweep: {len(rows)} of the {case['space_size']} rule-passing configs timed "
                f"(median compile {compile_s:.2f} s per config in a helper, {timing_s * 1e3:.0f} ms of timing "
                f"per config), {case['case_wall_s']:.0f} s wall; outcomes {statuses}. "
            )
        else:
            firsts = [r["first_launch_s"] for r in case["rows"]]
            sweep = (
                f"Sweep: {case['compiled']} of {case['space_size']} rule-passing configs compiled in "
                f"{case['compile_wall_s']:.1f} s on {case['workers']} processes (median first launch "
                f"{statistics.median(firsts):.2f} s per config in a worker), then timed serially in "
                f"{case['timing_wall_s']:.1f} s ({timing_s * 1e3:.0f} ms per config); outcomes {statuses}. "
            )
        res["extra"] = [
            sweep
            + (
                "The table is a uniform random sample of the space (time cap): gaps are relative "
                "to the sample's best, and a rule-passing config outside the sample is one evaluation "
                "at its nearest sampled config's time (fewest differing fields). "
                if res["sampled"]
                else ""
            )
            + (
                f"torch path {case['torch_us']:.2f} us, floor {case['floor_us']:.2f} us, best config "
                f"{res['best']:.2f} us."
                if case.get("torch_us")
                else ""
            )
        ]
        results.append(res)
    return results


def write_tuned(
    files: list[str], directory, kernels: tuple[str, ...] = ("sparse_decode",), min_gain: float = 0.01
) -> list[str]:
    """Tuned-config entries from exhaustive sweep tables: for each table of ``kernels`` whose fastest config beats the
    config shipped for its key by more than ``min_gain`` in the same table (or has no entry yet), that config with
    its time and the default's, stamped with the sweep's date, commit and file. Sampled tables are skipped (their
    best is not the space's), and so are kernels with a library path (the GEMM's entries also carry the
    library-or-Triton choice, which a sweep of Triton configs alone cannot make). Written into ``directory`` (any folder
    but ``kernels/tuned/``, which only ``tuner search --target kernels`` writes); the config compared against is the
    folder's entry, else the shipped one. Returns one line per table."""
    from benchmarks.common import _effective, tuned_output_dir
    from kernels.configs import config_path, read_config_file, write_config_file
    from kernels.registry import get_kernel

    directory = tuned_output_dir(directory)
    lines = []
    for f in files:
        data = read_json(f)
        gpu, triton_version = data["gpu"], data.get("triton")
        for case in data["cases"]:
            kernel = get_kernel(case["kernel"])
            name = f"{case['kernel']} {kernel.shape_key(case['shape'])} {case['dtype']}"
            rows = [r for r in case["rows"] if r["status"] == "ok"]
            if case["kernel"] not in kernels or kernel.library_impl or not rows:
                continue
            if len(case["rows"]) < case["space_size"] or any(r["status"] == "not_timed" for r in case["rows"]):
                lines.append(f"{name}: skipped, a sample of the space")
                continue
            best = min(rows, key=lambda r: r["time_us"])
            key = kernel.shape_key(case["shape"])
            shipped = read_config_file(config_path(case["kernel"], gpu, case["dtype"], triton_version, directory)).get(
                key
            ) or read_config_file(config_path(case["kernel"], gpu, case["dtype"], triton_version)).get(key)
            times = {json.dumps(r["config"], sort_keys=True): r["time_us"] for r in rows}

            # the shipped config's time: its fastest twin in the table (configs the launcher runs alike: sparse decode's
            # S is an upper bound, benchmarks/kernels.py's _effective)
            kname, shape = case["kernel"], case["shape"]
            same = [
                r["time_us"]
                for r in rows
                if shipped and _effective(kname, r["config"], shape) == _effective(kname, shipped["config"], shape)
            ]
            shipped_t = min(same) if same else None
            if shipped_t is not None and best["time_us"] >= shipped_t * (1 - min_gain):
                lines.append(f"{name}: kept {shipped['config']} ({shipped_t:.2f} µs; the best {best['time_us']:.2f})")
                continue
            default_t = times.get(json.dumps(case["default"], sort_keys=True))
            entry = {
                "config": best["config"],
                "time_us": round(best["time_us"], 2),
                "measured": f"{data['date']}, commit {data['commit']}, {Path(f).name} (exhaustive sweep)",
            }
            if default_t is not None:
                entry["default_time_us"] = round(default_t, 2)
            write_config_file(
                case["kernel"], gpu, case["dtype"], {key: entry}, triton_version=triton_version, directory=directory
            )
            was = f"{shipped['config']} at {shipped_t:.2f} µs" if shipped_t is not None else "no entry timed here"
            lines.append(f"{name}: wrote {best['config']} ({best['time_us']:.2f} µs; was {was})")
    return lines


def selects(selector: str, case: SweepCase) -> bool:
    """``--only``'s test: ``gemm`` selects every GEMM case, ``gemm@M=16`` those whose shape has M = 16."""
    kernel, _, cond = selector.strip().partition("@")
    if kernel != case.kernel:
        return False
    if not cond:
        return True
    key, _, value = cond.partition("=")
    return str(case.shape.get(key)) == value


def load_sweeps(files: list[str]) -> dict:
    """Sweep JSONs written by ``--gpu``, their cases together (a later file's case replaces an earlier one's of the
    same kernel and shape)."""
    parts = [read_json(f) for f in files]
    data = parts[0]
    for extra in parts[1:]:
        names = {json.dumps([c["kernel"], c["shape"]], sort_keys=True) for c in extra["cases"]}
        data["cases"] = [
            c for c in data["cases"] if json.dumps([c["kernel"], c["shape"]], sort_keys=True) not in names
        ] + extra["cases"]
    return data


REFINE_STRATEGIES = ("tpe", "tpe+moves", "tpe+refine:0.25", "tpe+refine:0.5")


def refine_comparison(results: list[dict], header: list[str]) -> str:
    """One row per case and budget, one column per strategy: within 3% / seeds, median gap / worst gap."""
    strategies = list(dict.fromkeys(r["strategy"] for res in results for r in res["runs"]))
    lines = header + [
        "",
        "| case | budget (evals) | " + " | ".join(strategies) + " |",
        "| --- | --- | " + " | ".join("---" for _ in strategies) + " |",
    ]
    totals = {s: 0 for s in strategies}
    for res in results:
        for frac in FRACTIONS:
            cells = {r["strategy"]: r for r in res["runs"] if r["frac"] == frac}
            budget = next(iter(cells.values()))["budget"]
            row = []
            for s in strategies:
                r = cells[s]
                totals[s] += r["within3"]
                row.append(f"{r['within3']}/{r['seeds']}, {_pct(r['median_gap'])} / {_pct(r['worst_gap'])}")
            lines.append(f"| {res['name']} | {int(frac * 100)}% ({budget}) | " + " | ".join(row) + " |")
    lines += [
        "",
        "Runs within 3% of the exhaustive best, over every case and budget: "
        + ", ".join(f"{s} {n}" for s, n in totals.items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


GOAL = (18, 0.10, 0.03)
"""Issue 20's goal for the kernel search: at least 18 of 20 seeds within 3% of the exhaustive best at 10% of the
evaluations, on every table."""


def search_lookahead() -> int:
    """Trials the kernel search asks ahead on the H200 host (16 CPUs, one GPU): its compile helpers."""
    from tuner.execution.compile_ahead import default_helpers

    return max(1, default_helpers(1, cpus=16))


def goal_report(results: list[dict], header: list[str]) -> str:
    """One row per table: within 3% / seeds at 5, 10 and 20% of the evaluations, median / worst gap, the goal."""
    need, frac_goal, gap = GOAL
    lines = header + [
        "",
        "| table | configs | best (us) | 5% | 10% | 20% | median / worst gap at 10% | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    met = 0
    for res in results:
        cells = {r["frac"]: r for r in res["runs"]}
        ten = cells[frac_goal]
        ok = ten["within3"] >= need * ten["seeds"] / 20
        met += ok
        lines.append(
            f"| {res['name']}{' (sample)' if res.get('sampled') else ''} | {res['n']} | {res['best']:.2f} | "
            + " | ".join(
                f"{cells[f]['within3']}/{cells[f]['seeds']} ({cells[f]['budget']})" if f in cells else "not replayed"
                for f in FRACTIONS
            )
            + f" | {_pct(ten['median_gap'])} / {_pct(ten['worst_gap'])} | {'met' if ok else 'missed'} |"
        )
    whole = [r for r in results if not r.get("sampled")]
    met_whole = sum(
        1
        for r in whole
        if next(x for x in r["runs"] if x["frac"] == frac_goal)["within3"] >= need * r["runs"][0]["seeds"] / 20
    )
    lines += [
        "",
        f"Goal (>= {need} of 20 seeds within {gap:.0%} at {frac_goal:.0%} of the evaluations) met on {met} of "
        f"{len(results)} tables; on {met_whole} of the {len(whole)} exhaustive ones (a sample's best is not the "
        "space's: a sampled table only indicates).",
        "",
    ]
    for res in results:
        if res.get("extra"):
            lines += [f"- {res['name']}: " + " ".join(res["extra"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--gpu", action="store_true", help="measure the sweeps on this machine's GPU")
    ap.add_argument("--out", default=None, help="folder for the GPU results (default: $OUT or benchmarks/results)")
    ap.add_argument("--analyze-gpu", default=None, help="a sweep JSON written by --gpu: analyse it on a CPU")
    ap.add_argument("--no-analysis", action="store_true", help="with --gpu: only measure and write the JSON")
    ap.add_argument("--deadline-s", type=float, default=290.0, help="with --gpu: stop starting new work after this")
    ap.add_argument("--rep-ms", type=float, default=10.0, help="with --gpu: do_bench's timing window per config")
    ap.add_argument("--helpers", type=int, default=0, help="with --gpu: compile processes (default: CPUs - 2)")
    ap.add_argument(
        "--e2e-budget", type=float, default=0.0, help="with --gpu: then a real kernel search of this budget"
    )
    ap.add_argument(
        "--write-tuned",
        metavar="SWEEP_JSON[,SWEEP_JSON]",
        default=None,
        help="write the sparse decode tuned configs from exhaustive sweep tables (where one beats the "
        "shipped config by more than 1%% in the same table) into --tuned-dir and exit",
    )
    ap.add_argument(
        "--tuned-dir",
        metavar="DIR",
        default=None,
        help="with --write-tuned: the folder to write (not kernels/tuned/, which only `tuner search "
        "--target kernels` writes; read it with TUNER_KERNEL_CONFIG_DIR=DIR)",
    )
    ap.add_argument(
        "--only",
        default="",
        help="with --gpu: the cases to sweep (default: all), comma-separated: a kernel "
        "name, or KERNEL@KEY=VALUE for its cases whose shape has that value (gemm@M=16)",
    )
    ap.add_argument(
        "--cases",
        choices=sorted(CASE_SETS),
        default="issue20_held_out",
        help="with --gpu: the set of tables to sweep (default: issue 20's second held-out set, GPU_CASES)",
    )
    ap.add_argument("--no-autotune", action="store_true", help="with --gpu: skip the triton.autotune probe")
    ap.add_argument(
        "--vs-autotune",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="on a GPU: real triton.autotune over every indexer config vs the tuner with this fraction "
        "of that count as trials, cold caches, winners re-timed (writes tuner_vs_autotune.md)",
    )
    ap.add_argument(
        "--lookahead",
        type=int,
        default=1,
        help="replays: trials asked before the oldest is told (the kernel search asks as many ahead as "
        "it has compile helpers)",
    )
    ap.add_argument(
        "--compare-refine",
        action="store_true",
        help="replays: TPE alone, with a one-change move after each repeat (the kernel search), and with a "
        "refinement window (tuner.search.refine), default and seed configs first; writes "
        "tuner_efficiency_refine.md",
    )
    ap.add_argument(
        "--no-starts",
        action="store_true",
        help="with --goal: the sampler alone, without the default and the seed configs first (where a "
        "table's default is its best, the configured search finds it at the first evaluation)",
    )
    ap.add_argument(
        "--fractions",
        default=",".join(map(str, FRACTIONS)),
        help="with --goal: the fractions of each table replayed, comma-separated, among "
        f"{','.join(map(str, FRACTIONS))} and always with the goal's (each a replay of its own budget: "
        "the 4389-config tables take minutes a seed at 20%%)",
    )
    ap.add_argument(
        "--report-name",
        default=None,
        help="with --goal: the report's file name (default: tuner_efficiency_goal_<set>.md)",
    )
    ap.add_argument(
        "--goal",
        choices=("tuning", "held_out"),
        default=None,
        help="replays of the kernel search as it runs on the H200 (its sampler, default and seed configs "
        "first, moves on repeats, its compile helpers' lookahead) against issue 20's goal: on the "
        "tuning set (the recorded tables) or on the held-out tables of --analyze-gpu FILE; writes "
        "tuner_efficiency_goal_<set>.md",
    )
    ap.add_argument("--autotune-probe", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
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
            print("\n".join(write_tuned(args.write_tuned.split(","), args.tuned_dir)))
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.autotune_probe is not None:
        print(json.dumps(autotune_probe(args.autotune_probe)))
        return 0
    if args.vs_autotune:
        import torch

        if not torch.cuda.is_available():
            print(
                "error: --vs-autotune needs a CUDA GPU (it times real kernels); run it on the GPU host", file=sys.stderr
            )
            return 2
        out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results")
        out.mkdir(parents=True, exist_ok=True)
        print("\n".join(vs_autotune(args.vs_autotune, out)))
        return 0
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.goal:
        return _goal(args, date)
    if args.compare_refine:
        kw = {"strategies": REFINE_STRATEGIES, "firsts": (True,)}
        files = (args.analyze_gpu or ",".join(str(RESULTS / f) for f in RECORDED_SWEEPS[:2])).split(
            ","
        )  # MoE's cases win
        res = [recorded_case(args.seeds, args.lookahead, **kw)]
        res += gpu_analysis(load_sweeps(files), args.seeds, args.lookahead, **kw)
        header = [
            "# Refining in the kernel search: replays of the H200 sweeps",
            "",
            f"Date {date}, commit {short_commit()}, CPU replay (no GPU) of the exhaustive H200 sweeps "
            f"(`{TABLE.relative_to(ROOT)}`, " + ", ".join(f"`{Path(f).name}`" for f in files) + "), "
            f"{args.seeds} seeds per cell, {args.lookahead} trial(s) asked ahead, the default and the kernel's "
            "seed configs first. `tpe`: TPE alone; `tpe+moves`: a configuration TPE proposes again is followed "
            "by one move from the best (`tuner.search.refine.choose_move`), as `tuner.search.kernel_search` does; "
            "`tpe+refine:S`: that, and a move before every ask in the last share S of the evaluations. "
            "Cell: runs within 3% of the exhaustive best / seeds, median gap / worst gap.",
            "",
            f"    python benchmarks/tuner_efficiency.py --compare-refine --seeds {args.seeds}",
        ]
        text = refine_comparison(res, header)
        path = (
            Path(args.out) / "tuner_efficiency_refine.md"
            if args.out
            else result_path("tuner_efficiency", "cpu", "refine")
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(text)
        return 0
    if not args.gpu and not args.analyze_gpu:
        res = [recorded_case(args.seeds, args.lookahead)]
        header = [
            "# Tuner efficiency: replay of the recorded H200 sweep",
            "",
            f"Date {date}, commit {short_commit()}, run on {platform.node()} ({os.cpu_count()} CPUs, no GPU): a replay "
            f"of `{TABLE.relative_to(ROOT)}` (one H200, torch 2.11, triton 3.6), {args.seeds} seeds per cell. "
            "Gap = best time found / exhaustive best - 1. An evaluation is one compiled and timed config; "
            "rule-pruned configs and repeats cost none. `python benchmarks/tuner_efficiency.py`.",
        ]
        text = markdown(res, header)
        path = result_path("tuner_efficiency", "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(text)
        return 0
    out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    if args.analyze_gpu:  # one file, or several (comma-separated) whose cases are analysed together
        data = load_sweeps(args.analyze_gpu.split(","))
    else:
        import torch

        if not torch.cuda.is_available():
            print(
                "error: --gpu needs a CUDA GPU (it compiles and times real kernels); run "
                "benchmarks/tuner_efficiency_gpu.sh on the GPU host, then --analyze-gpu FILE here",
                file=sys.stderr,
            )
            return 2
        start = time.time()
        helpers = args.helpers or max(1, (os.cpu_count() or 2) - 2)  # the rest: this process and the GPU's feeding
        data = {
            "gpu": torch.cuda.get_device_name(0),
            "date": date,
            "commit": short_commit(),
            "cases": [],
            "torch": torch.__version__,
            "rep_ms": args.rep_ms,
            "helpers": helpers,
            "source": "benchmarks/tuner_efficiency.py --gpu",
        }
        import triton

        data["triton"] = triton.__version__
        cases = [
            c for c in CASE_SETS[args.cases] if not args.only or any(selects(sel, c) for sel in args.only.split(","))
        ]
        data["cases_set"] = args.cases

        def keep(case: dict) -> None:
            data["cases"].append(case)
            (out / "tuner_efficiency_gpu.json").write_text(json.dumps(data))
            timed = sum(r["status"] != "not_timed" for r in case["rows"])
            print(
                f"{case['kernel']} {case['shape']} {case['dtype']}: {timed}/{case['sampled']} configs timed "
                f"({case['space_size']} in the space) in {case['case_wall_s']:.1f}s of a {case['share_s']:.0f}s share; "
                f"torch {case['torch_us']:.2f} us",
                flush=True,
            )

        gpu_sweep(cases, args.deadline_s, helpers, args.rep_ms, keep)
        print(f"sweep: {time.time() - start:.0f}s", flush=True)
        if args.deadline_s - (time.time() - start) > 20 and not args.no_autotune:
            import tempfile

            env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-fresh-")}
            try:
                p = subprocess.run(
                    [sys.executable, __file__, "--autotune-probe", "12"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=max(10, args.deadline_s - (time.time() - start)),
                )
                data["autotune"] = (
                    json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-1500:]}
                )
            except Exception as exc:  # noqa: BLE001
                data["autotune"] = {"error": f"{type(exc).__name__}: {exc}"}
            print("autotune:", json.dumps(data["autotune"])[:600], flush=True)
        if args.e2e_budget:
            data["e2e"] = end_to_end(args.e2e_budget, out)
            print("\n".join(data["e2e"]), flush=True)
        (out / "tuner_efficiency_gpu.json").write_text(json.dumps(data))
        if args.no_analysis:
            return 0
    res = gpu_analysis(data, min(args.seeds, 10), args.lookahead)
    header = [
        "# Tuner efficiency on a GPU: measured exhaustive sweeps, replayed",
        "",
        f"Measured {data['date']} on {data['gpu']} (torch {data.get('torch')}, triton {data.get('triton')}), "
        f"commit {data['commit']}; analysed {date}, {args.lookahead} trial(s) asked ahead. Gap = best found / best of "
        "the measured table - 1.",
    ]
    at = data.get("autotune") or {}
    if "per_config_s" in at:
        header += [
            "",
            f"Real `triton.autotune` (indexer, batch 16, 64K rows) over a sample of {at['n']} configs in a fresh "
            f"Triton cache: {at['wall_s']:.1f} s = {at['per_config_s']:.2f} s per config, extrapolated per config "
            f"below (result rel. error {at['rel_error']:.2g}; picked {at['best']}).",
        ]
        for r in res:
            n = r["n"]
            r["extra"] = r.get("extra", []) + [
                f"triton.autotune extrapolated to all {n} configs of this table: "
                f"{n * at['per_config_s']:.0f} s vs TPE at 10% {r['wall']['tpe10_s']:.0f} s "
                f"({n * at['per_config_s'] / max(r['wall']['tpe10_s'], 1e-9):.1f}x)."
            ]
    elif at:
        header += ["", f"The triton.autotune probe failed: `{str(at.get('error'))[-400:]}`"]
    if data.get("e2e"):
        header += [
            "",
            "End to end (`run_kernel_search`, the first sparse_decode case of the plan):",
            "",
            "```",
            *data["e2e"],
            "```",
        ]
    text = markdown(res, header)
    (out / "tuner_efficiency_gpu.md").write_text(text)
    print(text)
    return 0


def _goal(args, date: str) -> int:
    commit = (
        short_commit()
    )  # the code that runs: read now, not when the report is written (a commit may land meanwhile)
    ahead = search_lookahead()
    try:
        fractions = tuple(sorted({float(f) for f in args.fractions.split(",")}))
    except ValueError:
        fractions = ()
    if not fractions or not set(fractions) <= set(FRACTIONS) or GOAL[1] not in fractions:
        print(
            f"error: --fractions {args.fractions!r}: give some of {','.join(map(str, FRACTIONS))}, the goal's "
            f"{GOAL[1]} among them",
            file=sys.stderr,
        )
        return 2
    kw = {"strategies": ("tpe+moves",), "firsts": (not args.no_starts,), "fractions": fractions}
    if args.goal == "tuning":
        files = [str(RESULTS / f) for f in RECORDED_SWEEPS]
        res = [recorded_case(args.seeds, ahead, **kw)] + gpu_analysis(load_sweeps(files), args.seeds, ahead, **kw)
        meta = [read_json(f) for f in files]
        source = (
            ", ".join(f"`{p}`" for p in [str(TABLE.relative_to(ROOT)), *RECORDED_SWEEPS])
            + " (measured "
            + "; ".join(sorted({f"{m['date']} on {m['gpu']} at {m['commit']}" for m in meta}))
            + ")"
        )
    else:
        if not args.analyze_gpu:
            print(
                "error: --goal held_out needs --analyze-gpu FILE (the sweep JSON of benchmarks/tuner_efficiency_gpu.sh); "
                "e.g. --goal held_out --analyze-gpu benchmarks/results/tuner_efficiency/h200/2026-11-30_a39226e_issue20.json.gz",
                file=sys.stderr,
            )
            return 2
        data = load_sweeps(args.analyze_gpu.split(","))
        res = gpu_analysis(data, args.seeds, ahead, held_out=True, **kw)
        source = ", ".join(
            f"`{Path(f).name}` (measured {m['date']} on {m['gpu']}, torch {m.get('torch')}, triton "
            f"{m.get('triton')}, commit {m['commit']})"
            for f, m in ((f, read_json(f)) for f in args.analyze_gpu.split(","))
        )
        source += "; a later file's table replaces an earlier one's of the same kernel and shape"
        if not res:
            print(
                f"error: {args.analyze_gpu} holds no held-out table with a timed config; run "
                "benchmarks/tuner_efficiency_gpu.sh on the GPU first",
                file=sys.stderr,
            )
            return 2
    header = [
        f"# Kernel search against issue 20's goal: the {args.goal.replace('_', '-')} tables",
        "",
        f"Analysed {date} at commit {commit} on a CPU (replay, no GPU) from {source}. Each table is searched "
        f"{args.seeds} times (seeds 0..{args.seeds - 1}) as `tuner.search.kernel_search` searches it on the H200 "
        f"host: its sampler (`kernel_sampler`), "
        + (
            "without the default and `starting_configs` first (`--no-starts`: the sampler alone)"
            if args.no_starts
            else "the default then `starting_configs` first"
        )
        + f", a one-change move "
        f"after a repeat, {ahead} trials asked ahead (its compile helpers). Cell: seeds within 3% of the "
        f"table's best / seeds (evaluations). Rule-pruned configs and repeats cost no evaluation. Configs counts "
        f"programs: configs that run the same program (the kernel's `canonical_config`; GEMM: GROUP_M where "
        f"there is one row block) are one row, its fastest timing, and asking for one that was timed is a "
        f"repeat, as in the kernel search.",
        "",
        f"    python benchmarks/tuner_efficiency.py --goal {args.goal} --seeds {args.seeds}"
        + (" --no-starts" if args.no_starts else "")
        + (f" --fractions {args.fractions}" if fractions != FRACTIONS else "")
        + (f" --analyze-gpu {args.analyze_gpu}" if args.analyze_gpu else ""),
    ]
    text = goal_report(res, header)
    name = args.report_name or f"tuner_efficiency_goal_{args.goal}.md"
    path = (
        Path(args.out) / name
        if args.out
        else result_path("tuner_efficiency", "cpu", Path(name).stem.removeprefix("tuner_efficiency_"))
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
