"""The wgmma sparse decode with an fp8 cache, beside the ``tl.dot`` kernel that served fp8 caches until now.

V4-Flash serves its compressed KV cache in float8 e4m3 with a float32 scale per row: half the bytes of a bf16
cache, so half the floor. Until 2026-12-01 only the ``tl.dot`` kernel (``kernels.sparse_decode``) took such a
cache; the Gluon wgmma kernel now does too (its producer warpgroup stages the fp8 rows and their scales by
``cp.async`` and widens each tile to bf16 in shared memory, ``_ws_gather_fp8``).

For each batch (V4-Flash shapes, 640 selected rows of 65536), in one process, on the same inputs (an fp8 cache
with row scales of different magnitudes; q in bf16), each config checked first against the float32 reference of
the dequantised cache into a NaN-poisoned output (timed and ragged inputs), then timed with
``kernels.bench.do_bench`` (medians of CUDA-graph replays, L2 flushed before each, 4 input sets rotating):

* ``torch``: the gather + bmm path on the dequantised rows (``sparse_decode_torch``);
* ``tl_dot``: the ``tl.dot`` kernel at its shipped H200 fp8 config;
* ``wgmma_default``: the wgmma kernel's default made fit for fp8 (``fit_dtype``): what it launches untuned;
* ``wgmma_bf16``: the wgmma kernel at its shipped bf16 config on the same rows widened to a bf16 cache (the
  16-bit kernel this variant should beat: twice the bytes);
* ``sweep``: fp8 configs of the wgmma kernel (32-row tiles, every schedule with a producer, one wave of programs
  at most), the bf16 tuned config made fit first, then a seeded shuffle, until ``--budget-s`` a batch.

    python3 benchmarks/sparse_decode_wgmma_fp8.py --json OUT.json                   # on an H200
    python3 benchmarks/sparse_decode_wgmma_fp8.py --report-from OUT.json --out X.md  # on any machine
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

from tuner.targets.kernels import H200_BYTES_PER_S  # noqa: E402 - after the path: the H200's measured copy rate

BATCHES = (1, 16, 64)
FP8 = "float8_e4m3fn"


def fp8_space(batch: int) -> list[dict]:
    """The canonical fp8 configs of the wgmma kernel at ``batch`` that pass its rules and launch one wave at most."""
    from benchmarks.sparse_decode_wgmma import programs
    from kernels.registry import get_kernel
    from kernels.sparse_decode_wgmma import one_wave

    kernel = get_kernel("sparse_decode_wgmma")
    shape = dict(kernel.shapes("v4flash")[0], batch=batch)
    space = {**kernel.config_space(shape), "BLOCK_T": [32], "STAGES": [2, 3, 4], "WS": [1]}
    out = []
    for values in itertools.product(*space.values()):
        config = dict(zip(space, values))
        if kernel.check_config(config, shape, None, FP8) or kernel.canonical_config(config, shape) != config:
            continue
        if programs(config, batch, shape["topk"]) <= one_wave():
            out.append(config)
    return out


def first_configs(batch: int, shape: dict, device) -> dict:
    """The named configs: the shipped ``tl.dot`` fp8 one, the wgmma default made fit for fp8, the shipped bf16
    wgmma one (for the bf16 cache) and the same made fit for fp8."""
    from kernels.configs import lookup
    from kernels.registry import get_kernel

    wg = get_kernel("sparse_decode_wgmma")
    bf16 = lookup("sparse_decode_wgmma", shape, "bfloat16", device)
    return {
        "tl_dot": lookup("sparse_decode", shape, FP8, device),
        "wgmma_default": wg.fit_dtype(wg.default_config(shape), shape, FP8),
        "wgmma_bf16": bf16,
        "bf16_fit": wg.fit_dtype(bf16, shape, FP8),
    }


def measure(args, json_path: Path) -> dict:
    import torch

    from benchmarks.common import checked_time, run_meta
    from kernels.bench import measure_copy_bandwidth
    from kernels.registry import get_kernel
    from kernels.sparse_decode import sparse_decode, sparse_decode_torch
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma

    kernel = get_kernel("sparse_decode")
    base = kernel.shapes("v4flash")[0]
    meta = run_meta(args.rep_ms, budget_s=args.budget_s, copy_tb_s=measure_copy_bandwidth() / 1e12)
    rows = []
    for batch in BATCHES:
        shape = dict(base, batch=batch)
        key_shape = {k: shape[k] for k in base}
        sets = [kernel.make_inputs(shape, FP8, "cuda", seed=1 + k) for k in range(4)]
        ragged = kernel.make_inputs(dict(shape, ragged=1), FP8, "cuda", seed=99)

        # the same rows as a bf16 cache (dequantised, then rounded to bf16): what the 16-bit kernel reads
        def widened(i):
            return {**i, "kv": (i["kv"].float() * i["kv_scale"][:, None]).to(torch.bfloat16), "kv_scale": None}

        wide, wide_ragged = [widened(i) for i in sets], widened(ragged)
        named = first_configs(batch, key_shape, "cuda")

        def wg_run(i, out, config):
            return sparse_decode_wgmma(
                i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out, kv_scale=i["kv_scale"]
            )

        def add(way, config, got):
            rows.append(
                {"batch": batch, "way": way, "config": config, **{k: got[k] for k in ("err", "us") if k in got}}
            )
            print(f"batch {batch} {way} {config} {got.get('us', 'wrong_result')}", flush=True)

        add(
            "torch",
            None,
            checked_time(
                kernel,
                lambda i, out: out.copy_(
                    sparse_decode_torch(i["q"], i["kv"], i["indices"], i["sm_scale"], kv_scale=i["kv_scale"])
                ),
                sets,
                (sets[0], ragged),
                args.rep_ms,
                FP8,
            ),
        )
        add(
            "tl_dot",
            named["tl_dot"],
            checked_time(
                kernel,
                lambda i, out: sparse_decode(
                    i["q"], i["kv"], i["indices"], i["sm_scale"], named["tl_dot"], out=out, kv_scale=i["kv_scale"]
                ),
                sets,
                (sets[0], ragged),
                args.rep_ms,
                FP8,
            ),
        )
        add(
            "wgmma_bf16",
            named["wgmma_bf16"],
            checked_time(
                kernel,
                lambda i, out: sparse_decode_wgmma(
                    i["q"], i["kv"], i["indices"], i["sm_scale"], named["wgmma_bf16"], out=out
                ),
                wide,
                (wide[0], wide_ragged),
                args.rep_ms,
            ),
        )
        timed: dict[str, dict] = {}

        def fp8_time(way, config):
            key = json.dumps(config, sort_keys=True)
            if key not in timed:
                timed[key] = checked_time(
                    kernel, lambda i, out: wg_run(i, out, config), sets, (sets[0], ragged), args.rep_ms, FP8
                )
            add(way, config, timed[key])

        fp8_time("wgmma_default", named["wgmma_default"])
        fp8_time("sweep", named["bf16_fit"])
        rest = fp8_space(batch)
        random.Random(batch).shuffle(rest)
        t0 = time.monotonic()
        for config in rest:
            if time.monotonic() - t0 > args.budget_s:
                break
            if json.dumps(config, sort_keys=True) in timed:
                continue
            try:
                fp8_time("sweep", config)
            except Exception as exc:  # a config that fails to build or launch is a row, not the end of the run
                rows.append(
                    {"batch": batch, "way": "sweep", "config": config, "failed": f"{type(exc).__name__}: {exc}"[:300]}
                )
        rows.append({"batch": batch, "way": "space", "n": len(rest) + 1})
        # at the default and the sweep's best: the 16-bit kernel at the same config on the widened cache (its ring as
        # small as the fp8 build's). The stored run (4ac0e78) also timed two timing probes since removed
        # (fp8_no_widen, fp8_no_copies); the report shows them where a run has them.
        ok = [r for r in rows if r["batch"] == batch and r["way"] in ("sweep", "wgmma_default") and r.get("us")]
        picks = {
            json.dumps(c, sort_keys=True): c
            for c in [named["wgmma_default"]] + ([min(ok, key=lambda r: r["us"])["config"]] if ok else [])
        }
        for config in picks.values():
            add(
                "probe:bf16_same_config",
                config,
                checked_time(
                    kernel,
                    lambda i, out, config=config: sparse_decode_wgmma(
                        i["q"], i["kv"], i["indices"], i["sm_scale"], config, out=out
                    ),
                    wide,
                    (wide[0], wide_ragged),
                    args.rep_ms,
                ),
            )
        torch.cuda.empty_cache()
    data = {"meta": meta, "rows": rows}
    return data


COPY_TB_S = H200_BYTES_PER_S / 1e12
"""The H200's copy rate (TB/s, read + write) that ``benchmarks/kernels.py`` measured on 2026-12-01 at 2b6e86b
(``benchmarks/results/kernels/h200/2026-12-01_2b6e86b_sparse_decode_wgmma.md``): the floor of the runs stored
before a run measured its own
(``copy_tb_s`` in its meta, ``kernels.bench.measure_copy_bandwidth``)."""


def floor_us(batch: int, dtype: str, copy_tb_s: float) -> float:
    """Bytes of the kernel's cost model over the copy rate ``copy_tb_s`` (TB/s)."""
    from kernels.registry import get_kernel

    kernel = get_kernel("sparse_decode")
    shape = dict(kernel.shapes("v4flash")[0], batch=batch)
    return kernel.cost(shape, dtype).bytes / (copy_tb_s * 1e6)


def summary(data: dict) -> dict:
    """Per batch: each named way's row, the sweep's fastest (with the default and the bf16 fit among its rows),
    how many fp8 configs were timed and the space's size."""
    out: dict = {}
    for r in data["rows"]:
        b = out.setdefault(r["batch"], {"sweep": [], "failed": 0})
        if r["way"] == "space":
            b["space"] = r["n"]
        elif "failed" in r:
            b["failed"] += 1
        elif r["way"].startswith("probe:"):
            b.setdefault("probes", []).append(r)
        elif r["way"] in ("sweep", "wgmma_default"):
            b["sweep"].append(r)
            if r["way"] == "wgmma_default":
                b["wgmma_default"] = r
        else:
            b[r["way"]] = r
    for b in out.values():
        ok = [r for r in b["sweep"] if r.get("us")]
        b["best"] = min(ok, key=lambda r: r["us"]) if ok else None
        b["timed"] = len({json.dumps(r["config"], sort_keys=True) for r in b["sweep"]})
    return out


def report(data: dict, source: str) -> str:
    from benchmarks.report_cli import provenance

    meta = data["meta"]
    copy_tb_s = meta.get("copy_tb_s", COPY_TB_S)
    lines = [
        "# Sparse decode with an fp8 cache: the wgmma kernel beside the tl.dot kernel, torch and the bf16 cache",
        "",
        *provenance(meta, "sparse_decode_wgmma_fp8.py", source),
        "- V4-Flash shapes (64 heads, 512-wide K=V latent, 640 selected rows of 65536); an fp8 e4m3 cache with a "
        "float32 scale per row, q in bf16; µs: median of CUDA-graph replays, L2 flushed before each, 4 input sets "
        "rotating; each config checked against the float32 reference of the dequantised cache first (timed and "
        "ragged inputs, NaN-poisoned outputs)",
        f"- floor: the fp8 cache's bytes (rows, scales, indices, q, output) over {copy_tb_s:.2f} TB/s"
        + (
            " (copy bandwidth measured in the same run)"
            if "copy_tb_s" in meta
            else " (the H200's copy rate measured by kernels.py at 2b6e86b; this run did not measure its own)"
        )
        + "; bf16 wgmma: the same "
        "rows widened to a bf16 cache, at the kernel's shipped bf16 config",
        f"- sweep: fp8 configs of the wgmma kernel timed within {meta.get('budget_s')} s a batch (32-row tiles, "
        "every schedule with a producer warpgroup, one wave of programs at most), its best is a measured best "
        "of a sample, not of the whole space",
        "",
        "| batch | floor µs | torch µs | tl.dot fp8 µs | wgmma bf16 µs | wgmma fp8 default µs | wgmma fp8 best µs "
        "| tl.dot / best | bf16 / best | torch / best | best / floor | timed / space |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def us(r):
        return f"{r['us']:.1f}" if r and r.get("us") else "wrong_result" if r else "-"

    def ratio(a, b):
        return f"{a['us'] / b['us']:.2f}x" if a and b and a.get("us") and b.get("us") else "-"

    s = summary(data)
    for batch, b in s.items():
        best, fl = b["best"], floor_us(batch, FP8, copy_tb_s)
        lines.append(
            f"| {batch} | {fl:.2f} | {us(b.get('torch'))} | {us(b.get('tl_dot'))} | {us(b.get('wgmma_bf16'))} "
            f"| {us(b.get('wgmma_default'))} | {us(best)} | {ratio(b.get('tl_dot'), best)} | "
            f"{ratio(b.get('wgmma_bf16'), best)} | {ratio(b.get('torch'), best)} | "
            f"{best['us'] / fl:.1f}x | {b['timed']} / {b.get('space', '-')} |"
            if best
            else f"| {batch} | {fl:.2f} | {us(b.get('torch'))} | {us(b.get('tl_dot'))} | {us(b.get('wgmma_bf16'))} "
            f"| {us(b.get('wgmma_default'))} | - | - | - | - | - | {b['timed']} / {b.get('space', '-')} |"
        )
    lines += ["", "Configs (rel. error against the float32 reference of the dequantised cache):", ""]
    for batch, b in s.items():
        for way in ("tl_dot", "wgmma_bf16", "wgmma_default", "best"):
            r = b.get(way)
            if r:
                cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
                lines.append(
                    f"- batch {batch}, {way.replace('best', 'wgmma fp8 best')}: {cfg} (rel. error {r['err']:.5f})"
                )
        if b["failed"]:
            lines.append(f"- batch {batch}: {b['failed']} sweep configs failed to build or launch")
    probes = [(batch, r) for batch, b in s.items() for r in b.get("probes", [])]
    if probes:
        lines += [
            "",
            "Where the time goes (the fp8 probes' results are garbage; timed like the rest):",
            "",
            "| batch | config | fp8 µs | without widening µs | without the fp8 copies (still widening) µs | bf16 cache, same "
            "config µs |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        by: dict = {}
        for batch, r in probes:
            by.setdefault((batch, json.dumps(r["config"], sort_keys=True)), {})[r["way"][6:]] = r
        for (batch, key), w in by.items():
            cfg = json.loads(key)
            full = next((r for r in s[batch]["sweep"] if r["config"] == cfg and r.get("us")), None)
            short = " ".join(f"{k}={v}" for k, v in cfg.items() if v and k not in ("BLOCK_T",))
            lines.append(
                f"| {batch} | {short} | {us(full)} | {us(w.get('fp8_no_widen'))} | "
                f"{us(w.get('fp8_no_copies'))} | {us(w.get('bf16_same_config'))} |"
            )
    worst = max((r["err"] for b in s.values() for r in b["sweep"] if "err" in r), default=None)
    if worst is not None:
        lines += ["", f"Worst rel. error of any fp8 wgmma config timed: {worst:.5f} (tolerance 0.02)."]
    return "\n".join(lines) + "\n"


def runnable_best(kernel, rows: list[dict], shape: dict) -> dict | None:
    """The fastest of the timed ``rows`` whose config the kernel runs now, in its current keys: a stored config
    with a switch the kernel no longer has is kept where that switch was off (the key is dropped) and left out
    where it was on (a schedule removed from the kernel)."""
    space = kernel.config_space(shape)
    runnable = []
    for r in rows:
        if not r.get("us") or any(v for k, v in r["config"].items() if k not in space):
            continue
        config = {k: v for k, v in r["config"].items() if k in space}
        if kernel.check_config(config, shape, None, FP8) is None:
            runnable.append({**r, "config": config})
    return min(runnable, key=lambda r: r["us"], default=None)


def write_tuned(data: dict, source: str, directory: Path) -> Path:
    """The sweep's fastest fp8 config at each batch that the kernel runs now (:func:`runnable_best`) as the GPU's tuned-config file of the wgmma kernel for an fp8
    cache (``kernels.configs`` format, keyed like the kernel's shapes, with the default's time beside it and where
    it was measured): the launcher looks it up, and adapts its split count at other batches."""
    from benchmarks.common import stored_path, tuned_output_dir
    from kernels.configs import config_path
    from kernels.registry import get_kernel

    directory = tuned_output_dir(directory)
    kernel = get_kernel("sparse_decode_wgmma")
    meta = data["meta"]
    base = kernel.shapes("v4flash")[0]
    entries = {}
    for batch, b in sorted(summary(data).items()):
        shape = dict(base, batch=batch)
        best = runnable_best(kernel, b["sweep"], shape)
        if not best:
            continue
        default = b.get("wgmma_default")
        entries[kernel.shape_key(shape)] = {
            "config": best["config"],
            "time_us": round(best["us"], 3),
            "default_time_us": round(default["us"], 3) if default and default.get("us") else None,
            "measured": f"{meta['date']}, commit {meta['commit']}, {Path(source).name} (sampled sweep: {b['timed']} of "
            f"{b.get('space')} configs)",
            "source": f"{stored_path(source)} (benchmarks/sparse_decode_wgmma_fp8.py --write-tuned: the sampled sweep's "
            "fastest config the kernel runs now)",
        }
    path = config_path(kernel.name, meta["gpu"], FP8, triton_version=meta["triton"], directory=directory)
    path.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return path


def main(argv=None) -> int:
    import argparse

    from benchmarks.common import result_path
    from benchmarks.report_cli import run

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--write-tuned", type=Path)
    pre.add_argument("--report-from", type=Path)
    known, _ = pre.parse_known_args(argv)

    def extra(ap):
        ap.add_argument("--rep-ms", type=float, default=30.0)
        ap.add_argument("--budget-s", type=float, default=60.0, help="seconds of fp8 sweep a batch")
        ap.add_argument(
            "--write-tuned",
            type=Path,
            metavar="DIR",
            help="with --report-from: also write the sweep's fastest config a batch as DIR's tuned file",
        )

    if known.write_tuned and not known.report_from:
        print(
            "error: --write-tuned DIR needs --report-from FILE.json (the stored run it takes the configs from)",
            file=sys.stderr,
        )
        return 2
    rc = run(argv, __doc__, result_path("sparse_decode_wgmma_fp8", "h200"), report, measure, extra)
    if rc == 0 and known.write_tuned:
        print(
            f"wrote {write_tuned(json.loads(known.report_from.read_text()), str(known.report_from), known.write_tuned)}"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
