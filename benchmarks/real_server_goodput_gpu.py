"""A goodput search on a real server: ``tuner search --target command`` with
``search_spaces/transformers_serve_goodput.yaml`` against Hugging Face ``transformers serve`` serving a small random
Llama (built here, no download), on ``cuda``: per trial the highest Poisson request rate meeting the SLO (its
interval, the measurements and seconds the boundary search took, or why it was infeasible or pruned), the
throughput-latency front of every load measured (``tuner best --pareto``) and the best configuration under the SLO.

    python benchmarks/real_server_goodput_gpu.py --budget-s 480                     # on the H200 (device cuda)
    python benchmarks/real_server_goodput_gpu.py --device cpu --hidden 64 --layers 2 --budget-s 240 --n-trials 3 \\
        --dtype float32 --ttft-ms 4000 --tpot-ms 400 --start 0.5 --window-s 4 --min-requests 8   # on the CPU

Needs what ``benchmarks/real_server_gpu.py`` needs (its docstring: this project's wheels and transformers' serving
extra carried as ``.whl`` onto the H200 image). Writes ``real_server_goodput_gpu.json`` and ``.md`` under ``$OUT``
(or ``--out``; default benchmarks/results) with the date, the GPU, the commit (``--commit`` or ``$TUNER_COMMIT``)
and this file's name.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from real_server_gpu import NEEDED, SERVE, _version, gpu_memory_mib, gpu_name  # noqa: E402

SPACE = ROOT / "search_spaces" / "transformers_serve_goodput.yaml"
STUDY = "real-server-goodput"


def space_with_slo(path: Path, ttft_ms: float, tpot_ms: float) -> Path:
    """The example space with this run's SLO (the limits depend on the model and the device)."""
    data = yaml.safe_load(SPACE.read_text())
    data["objective"]["slo"] = {"ttft_ms_p95": ttft_ms, "tpot_ms_p95": tpot_ms}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trial_rows(storage_url: str) -> list[dict]:
    """Per trial: outcome, params, the goodput and its interval, the search's cost, the SLO figures at the
    boundary, and every load measured (rate, tok/s, per-user tok/s, met the SLO), read back from the database."""
    from storage import Repo

    repo = Repo(storage_url)
    run = repo.get_run(STUDY)
    out = []
    for t in repo.list_trials(run.id, with_measurements=True):
        m = {(r.metric, r.level): r.value for r in t.measurements}
        loads = sorted({lv for _, lv in m if lv.startswith(("r=", "c="))}, key=lambda s: float(s[2:]))
        out.append({
            "number": t.number, "params": t.params, "outcome": t.outcome, "value": t.value, "reason": t.reason,
            "duration_s": t.duration_s, "is_baseline": t.is_baseline, "repeat_of": t.repeat_of,
            "startup_s": m.get(("startup_s", "")), "warmup_s": m.get(("warmup_s", "")),
            "teardown_s": m.get(("teardown_s", "")),
            **{k: m.get((k, "goodput")) for k in ("goodput_req_s", "goodput_tok_s_per_gpu", "goodput_low",
                                                  "goodput_high", "goodput_measurements", "goodput_search_s",
                                                  "goodput_feasible")},
            "slo_figures": {k: v for (k, lv), v in m.items() if lv == "slo"},
            "loads": [{"load": lv, "tok_s": m.get(("tok_s", lv)), "tok_s_per_request": m.get(("tok_s_per_request", lv)),
                       "ttft_ms_p95": m.get(("ttft_ms_p95", lv)), "tpot_ms_p95": m.get(("tpot_ms_p95", lv)),
                       "measurements": m.get(("measurements", lv)), "meets_slo": m.get(("meets_slo", lv))}
                      for lv in loads],
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--n-trials", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU (CUDA_VISIBLE_DEVICES for the servers)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ttft-ms", type=float, default=1000.0, help="SLO: p95 time to first token")
    ap.add_argument("--tpot-ms", type=float, default=100.0, help="SLO: p95 time per output token")
    ap.add_argument("--start", type=float, default=2.0, help="the first request rate measured (req/s)")
    ap.add_argument("--window-s", type=float, default=6.0, help="seconds of arrivals per measurement")
    ap.add_argument("--min-requests", type=int, default=24, help="requests per measurement at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=os.environ.get("TUNER_COMMIT", ""))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        print(f"error: missing Python packages {missing}; carry them as wheels (see benchmarks/real_server_gpu.py)",
              file=sys.stderr)
        return 2
    from tests.real_server.tiny_model import build_tiny_llama
    from tuner.fingerprint import fingerprint
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="real-server-goodput-"))
    t0 = time.time()
    model = build_tiny_llama(tmp / "model", hidden=args.hidden, layers=args.layers, heads=max(4, args.hidden // 64),
                             kv_heads=max(2, args.hidden // 256), dtype=args.dtype, seed=args.seed)
    build_s = time.time() - t0
    space = space_with_slo(tmp / "space.yaml", args.ttft_ms, args.tpot_ms)
    settings = {
        "model": str(model), "command": [sys.executable, "-c", SERVE, "serve", "{model}", "--host", "{host}",
                                         "--port", "{port}", "--device", args.device, "--dtype", args.dtype],
        "env": {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": str(args.gpu)},
        "gpus": 1 if args.device == "cuda" else 0, "goodput_start": args.start, "goodput_window_s": args.window_s,
        "goodput_min_requests": args.min_requests,
        "trial_timeout_s": max(120.0, args.budget_s / 3), "ready_timeout_s": 150, "seed": args.seed,
    }
    storage = f"sqlite:///{tmp / 'tuner.db'}"
    memory_before = gpu_memory_mib(args.gpu)
    opts = SearchOptions(budget_s=args.budget_s, storage_url=storage, study=STUDY, space_path=str(space),
                         target="command", settings=settings, n_trials=args.n_trials, seed=args.seed,
                         confirm_top=0, out_dir=str(tmp / "export"))
    t0 = time.time()
    result = run_search(opts)
    wall = time.time() - t0
    front = subprocess.run([sys.executable, "-m", "tuner.cli", "best", "--pareto", "--storage", storage, "--study",
                            STUDY], capture_output=True, text=True, timeout=120, cwd=ROOT)
    env = fingerprint()
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu_name(args.gpu),
        "device": args.device, "commit": args.commit or env.get("git_sha"),
        "source": "benchmarks/real_server_goodput_gpu.py", "torch": env.get("torch"),
        "transformers": _version("transformers"),
        "model": {"hidden": args.hidden, "layers": args.layers, "dtype": args.dtype, "build_s": build_s},
        "slo": {"ttft_ms_p95": args.ttft_ms, "tpot_ms_p95": args.tpot_ms}, "budget_s": args.budget_s,
        "wall_s": wall, "start_req_s": args.start, "window_s": args.window_s,
        "memory_before_search_mib": memory_before, "memory_after_search_mib": gpu_memory_mib(args.gpu),
        "state": result.state, "stop_reason": result.stop_reason, "best_value": result.best_value,
        "best_params": result.best_params, "baseline_value": result.baseline_value,
        "front": front.stdout.splitlines() if front.returncode == 0 else [f"error: {front.stderr.strip()}"],
        "trials": trial_rows(storage),
    }
    (out / "real_server_goodput_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "real_server_goodput_gpu.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if result.best is not None else 1


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(doc: dict) -> str:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in doc["slo"].items())
    lines = [
        "# Goodput of transformers serve under an SLO: the boundary per configuration and the front",
        "",
        f"{doc['date']}, GPU {doc['gpu']} (device {doc['device']}), commit {doc['commit']}, torch {doc['torch']}, "
        f"transformers {doc['transformers']}; written by `{doc['source']}` (JSON beside it). Model: random Llama, "
        f"hidden {doc['model']['hidden']}, {doc['model']['layers']} layers, {doc['model']['dtype']}. Space "
        f"`search_spaces/transformers_serve_goodput.yaml` with SLO {slo}; Poisson arrivals from "
        f"{doc['start_req_s']:g} req/s, {doc['window_s']:g} s of arrivals per measurement; budget "
        f"{doc['budget_s']:.0f} s, the search took {doc['wall_s']:.0f} s ({doc['state']}"
        + (f", {doc['stop_reason']}" if doc["stop_reason"] else "") + ").",
        "",
        f"Best under the SLO: {_f(doc['best_value'], '.1f')} output tok/s per GPU (baseline "
        f"{_f(doc['baseline_value'], '.1f')}); params {doc['best_params']}.",
        "",
        "| # | params | outcome | goodput req/s | tok/s per GPU | boundary interval req/s | measurements | "
        "search s | trial s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trials"]:
        params = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        outcome = (t.get("outcome") or "?") + (" (baseline)" if t.get("is_baseline") else "") \
            + (f" (repeat of {t['repeat_of']})" if t.get("repeat_of") is not None else "") \
            + (" (infeasible)" if t.get("goodput_feasible") == 0.0 and t.get("outcome") == "ok" else "")
        lines.append(f"| {t['number']} | {params} | {outcome} | {_f(t.get('goodput_req_s'), '.2f')} | "
                     f"{_f(t.get('goodput_tok_s_per_gpu'))} | [{_f(t.get('goodput_low'), '.3g')}, "
                     f"{_f(t.get('goodput_high'), '.3g')}] | {_f(t.get('goodput_measurements'), '.0f')} | "
                     f"{_f(t.get('goodput_search_s'))} | {_f(t.get('duration_s'))} |")
    lines += ["", "The front (`tuner best --pareto` on the study):", "", "```"] + doc["front"] + ["```"]
    odd = [t for t in doc["trials"] if t.get("outcome") not in ("ok",) and t.get("reason")]
    if odd:
        lines += ["", "Not ok:"] + [f"- trial {t['number']}: {t['outcome']}: {t['reason'][:300]}" for t in odd]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
