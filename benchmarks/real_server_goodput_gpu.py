"""A goodput search on a real server: ``tuner search --target command`` with
``search_spaces/transformers_serve_goodput_h200.yaml`` (its SLO stated there, before the run) against Hugging Face
``transformers serve`` serving a small random Llama (built here, no download), on ``cuda``: per trial the highest
Poisson request rate meeting the SLO (its interval, the measurements and seconds the boundary search took, or why
it was infeasible or pruned), every load measured (its figures and whether the server kept up with the arrivals),
the throughput-latency front (``tuner best --pareto``) and the best configuration under the SLO (``tuner export
--slo``, its launch script's header).

    python benchmarks/real_server_goodput_gpu.py                       # on the H200 (device cuda), about 7 minutes
    python benchmarks/real_server_goodput_gpu.py --device cpu --hidden 64 --layers 2 --dtype float32 --budget-s 200 \\
        --n-trials 2 --ttft-ms 4000 --tpot-ms 400 --start 0.5                           # a smoke run on the CPU

Needs what ``benchmarks/serve_bench.py`` says (this project's wheels and transformers' serving extra carried as
``.whl`` onto the H200 image). Writes ``real_server_goodput_gpu.json``, ``.md`` and the study's database ``.db``
under ``$OUT`` (or ``--out``; default benchmarks/results) with the date, the GPU, the commit (``--commit`` or
``$TUNER_COMMIT``) and this file's name.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

# the project's root first and this folder last: run as a script, this folder is sys.path[0], and its kernels.py
# would shadow the `kernels` package (transformers imports `kernels` on a GPU to look for hub kernels)
_HERE = Path(__file__).resolve().parent
sys.path[:] = (
    [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)] + [str(_HERE)]
)

from serve_bench import (  # noqa: E402
    ROOT,
    add_common_args,
    build_model,
    copy_study_db,
    fmt,
    gpu_memory_mib,
    gpu_name,
    missing_packages,
    model_doc,
    serve_settings,
    version,
)

SPACE = ROOT / "search_spaces" / "transformers_serve_goodput_h200.yaml"
STUDY = "real-server-goodput"
LOAD_FIGURES = (
    "tok_s",
    "tok_s_per_request",
    "ttft_ms_p95",
    "tpot_ms_p95",
    "error_rate",
    "offered_req_s",
    "achieved_req_s",
    "unfinished",
    "kept_up",
    "measurements",
    "meets_slo",
)


def space_for_run(space: Path, dest: Path, ttft_ms: float | None, tpot_ms: float | None) -> tuple[Path, dict]:
    """The space file the run uses (``space`` itself, or a copy with the SLO given on the command line) and its
    SLO."""
    data = yaml.safe_load(space.read_text())
    if ttft_ms is None and tpot_ms is None:
        return space, dict(data["objective"]["slo"])
    slo = dict(data["objective"]["slo"])
    slo.update({k: v for k, v in (("ttft_ms_p95", ttft_ms), ("tpot_ms_p95", tpot_ms)) if v is not None})
    data["objective"]["slo"] = slo
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest, slo


def trial_rows(storage_url: str) -> list[dict]:
    """Per trial: outcome, params, the goodput and its interval, the search's cost, the SLO figures at the
    boundary, and every load measured (its figures, whether the server kept up, whether it met the SLO), read back
    from the database."""
    from storage import Repo

    repo = Repo(storage_url)
    run = repo.get_run(STUDY)
    out = []
    for t in repo.list_trials(run.id, with_measurements=True):
        m = {(r.metric, r.level): r.value for r in t.measurements}
        loads = sorted({lv for _, lv in m if lv.startswith(("r=", "c="))}, key=lambda s: float(s[2:]))
        out.append(
            {
                "number": t.number,
                "params": t.params,
                "outcome": t.outcome,
                "value": t.value,
                "reason": t.reason,
                "duration_s": t.duration_s,
                "is_baseline": t.is_baseline,
                "repeat_of": t.repeat_of,
                "startup_s": m.get(("startup_s", "")),
                "warmup_s": m.get(("warmup_s", "")),
                "teardown_s": m.get(("teardown_s", "")),
                **{
                    k: m.get((k, "goodput"))
                    for k in (
                        "goodput_req_s",
                        "goodput_tok_s_per_gpu",
                        "goodput_low",
                        "goodput_high",
                        "goodput_measurements",
                        "goodput_search_s",
                        "goodput_feasible",
                    )
                },
                "slo_figures": {k: v for (k, lv), v in m.items() if lv == "slo"},
                "loads": [{"load": lv, **{k: m.get((k, lv)) for k in LOAD_FIGURES}} for lv in loads],
            }
        )
    return out


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=180, cwd=ROOT
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, budget_s=360.0)
    ap.add_argument("--space", default=str(SPACE), help="the space file (its SLO, rates and windows)")
    ap.add_argument("--ttft-ms", type=float, default=None, help="replace the space's p95 TTFT limit (CPU runs)")
    ap.add_argument("--tpot-ms", type=float, default=None, help="replace the space's p95 TPOT limit (CPU runs)")
    ap.add_argument("--start", type=float, default=None, help="replace the space's goodput_start (req/s)")
    args = ap.parse_args()

    missing = missing_packages()
    if missing:
        print(
            f"error: missing Python packages {missing}; carry them as wheels (see benchmarks/serve_bench.py)",
            file=sys.stderr,
        )
        return 2
    from tuner.fingerprint import fingerprint
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="real-server-goodput-"))
    model, build_s = build_model(args, tmp / "model")
    space, slo = space_for_run(Path(args.space), tmp / "space.yaml", args.ttft_ms, args.tpot_ms)
    settings = {
        **serve_settings(args, model),
        "gpus": 1 if args.device == "cuda" else 0,
        "seed": args.seed,
        "ready_timeout_s": 150,
    }
    if args.start is not None:
        settings["goodput_start"] = args.start
    storage = f"sqlite:///{tmp / 'tuner.db'}"
    memory_before = gpu_memory_mib(args.gpu)
    opts = SearchOptions(
        budget_s=args.budget_s,
        storage_url=storage,
        study=STUDY,
        space_path=str(space),
        target="command",
        settings=settings,
        n_trials=args.n_trials,
        seed=args.seed,
        confirm_top=0,
        out_dir=str(tmp / "export"),
    )
    t0 = time.time()
    result = run_search(opts)
    wall = time.time() - t0
    front = _tuner("best", "--pareto", "--storage", storage, "--study", STUDY)
    slo_text = ",".join(f"{k}<={v:g}" for k, v in slo.items())
    export = _tuner("export", "--storage", storage, "--study", STUDY, "--out", str(tmp / "slo"), "--slo", slo_text)
    launch = tmp / "slo" / STUDY / "launch.sh"
    header = [ln[2:] for ln in launch.read_text().splitlines() if ln.startswith("# ")] if launch.exists() else []
    env = fingerprint()
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu_name(args.gpu),
        "device": args.device,
        "commit": args.commit or env.get("git_sha"),
        "source": "benchmarks/real_server_goodput_gpu.py",
        "torch": env.get("torch"),
        "transformers": version("transformers"),
        "model": model_doc(args, build_s),
        "space": str(Path(args.space).resolve().relative_to(ROOT))
        if Path(args.space).resolve().is_relative_to(ROOT)
        else args.space,
        "slo": slo,
        "slo_from": "the command line" if space != Path(args.space) else "the space file",
        "settings": {
            k: v
            for k, v in yaml.safe_load(space.read_text())["settings"].items()
            if k.startswith("goodput_")
            or k in ("prompt_len", "output_len", "prompt_len_std", "output_len_std", "load_shape")
        }
        | ({"goodput_start": args.start} if args.start is not None else {}),
        "budget_s": args.budget_s,
        "wall_s": wall,
        "memory_before_search_mib": memory_before,
        "memory_after_search_mib": gpu_memory_mib(args.gpu),
        "state": result.state,
        "stop_reason": result.stop_reason,
        "best_value": result.best_value,
        "best_params": result.best_params,
        "baseline_value": result.baseline_value,
        "front": front.stdout.splitlines() if front.returncode == 0 else [f"error: {front.stderr.strip()}"],
        "export_slo": {
            "args": ["--slo", slo_text],
            "returncode": export.returncode,
            "said": (export.stdout + export.stderr).strip(),
            "header": header,
        },
        "trials": trial_rows(storage),
    }
    (out / "real_server_goodput_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "real_server_goodput_gpu.md").write_text(markdown(doc))
    copy_study_db(tmp / "tuner.db", out / "real_server_goodput_gpu.db")
    print(markdown(doc))
    return 0 if result.best is not None else 1


def markdown(doc: dict) -> str:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in doc["slo"].items())
    st = doc["settings"]
    lines = [
        "# Goodput of transformers serve under an SLO: the boundary per configuration, the front, the best under "
        "the SLO",
        "",
        f"{doc['date']}, GPU {doc['gpu']} (device {doc['device']}), commit {doc['commit']}, torch {doc['torch']}, "
        f"transformers {doc['transformers']}; written by `{doc['source']}` (JSON and the study's database beside "
        f"it). Model: random Llama, hidden {doc['model']['hidden']}, {doc['model']['layers']} layers, "
        f"{doc['model']['dtype']}. Space `{doc['space']}`; SLO {slo} (from {doc['slo_from']}); Poisson arrivals "
        f"from {st.get('goodput_start')} req/s (lowest {st.get('goodput_min')}), {st.get('goodput_window_s')} s of "
        f"arrivals and at least {st.get('goodput_min_requests')} requests per measurement; budget "
        f"{doc['budget_s']:.0f} s, the search took {doc['wall_s']:.0f} s ({doc['state']}"
        + (f", {doc['stop_reason']}" if doc["stop_reason"] else "")
        + ").",
        "",
        f"Search's best: {fmt(doc['best_value'], '.1f')} output tok/s per GPU at the boundary (baseline "
        f"{fmt(doc['baseline_value'], '.1f')}); params {doc['best_params']}.",
        "",
        "| # | params | outcome | goodput req/s | tok/s per GPU | boundary interval req/s | measurements | "
        "search s | trial s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trials"]:
        if t.get("repeat_of") is not None:
            continue
        params = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        outcome = (
            (t.get("outcome") or "?")
            + (" (baseline)" if t.get("is_baseline") else "")
            + (" (infeasible)" if t.get("goodput_feasible") == 0.0 and t.get("outcome") == "ok" else "")
        )
        lines.append(
            f"| {t['number']} | {params} | {outcome} | {fmt(t.get('goodput_req_s'), '.2f')} | "
            f"{fmt(t.get('goodput_tok_s_per_gpu'))} | [{fmt(t.get('goodput_low'), '.3g')}, "
            f"{fmt(t.get('goodput_high'), '.3g')}] | {fmt(t.get('goodput_measurements'), '.0f')} | "
            f"{fmt(t.get('goodput_search_s'))} | {fmt(t.get('duration_s'))} |"
        )
    repeats = [t["number"] for t in doc["trials"] if t.get("repeat_of") is not None]
    if repeats:
        lines += ["", f"Trials {', '.join(map(str, repeats))} repeated a configuration already run (not run again)."]
    lines += [
        "",
        "Every load measured (pooled over its measurements): whether the server kept up with the arrivals "
        "(completions advanced at the offered rate within the tolerance, none unfinished; - where the "
        "measurement was cut short once a TTFT limit was certainly missed, a p95 TTFT of - being such a cut "
        "request's) and met the SLO:",
        "",
        "| # | load | measurements | tok/s | tok/s per user | p95 TTFT ms | p95 TPOT ms | errors | offered req/s "
        "| achieved req/s | unfinished | kept up | meets SLO |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    yes = {1.0: "yes", 0.0: "no", None: "-"}
    for t in doc["trials"]:
        for p in t.get("loads") or []:
            lines.append(
                f"| {t['number']} | {p['load']} | {fmt(p['measurements'], '.0f')} | {fmt(p['tok_s'])} | "
                f"{fmt(p['tok_s_per_request'])} | {fmt(p['ttft_ms_p95'], '.0f')} | "
                f"{fmt(p['tpot_ms_p95'])} | {fmt(p['error_rate'], '.0%')} | "
                f"{fmt(p['offered_req_s'], '.2f')} | {fmt(p['achieved_req_s'], '.2f')} | "
                f"{fmt(p['unfinished'], '.0f')} | {yes[p['kept_up']]} | {yes[p['meets_slo']]} |"
            )
    lines += ["", "The front (`tuner best --pareto` on the study):", "", "```"] + doc["front"] + ["```"]
    ex = doc["export_slo"]
    lines += [
        "",
        f"The best under the SLO (`tuner export {' '.join(repr(a) if ' ' in a else a for a in ex['args'])}`, "
        f"exit {ex['returncode']}): {ex['said']}",
        "",
    ]
    lines += (
        ["```"] + [h for h in ex["header"] if h.startswith(("exported for", "best parameters", "study "))] + ["```"]
    )
    odd = [
        t for t in doc["trials"] if t.get("outcome") not in ("ok",) and t.get("reason") and t.get("repeat_of") is None
    ]
    if odd:
        lines += ["", "Not ok:"] + [f"- trial {t['number']}: {t['outcome']}: {t['reason'][:300]}" for t in odd]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
