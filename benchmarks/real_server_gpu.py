"""The real-server search on a GPU: ``tuner search --target command`` with ``search_spaces/transformers_serve.yaml``
against Hugging Face ``transformers serve`` serving a small random Llama (built here, no download) on ``cuda``.

Per trial it records where the time went (start-up, warm-up = the first requests, measurement per level,
teardown: the metrics the trial stored) and the GPU's memory from outside the server (``nvidia-smi``): before the
trial, the peak while it ran, and after its teardown, so that "memory is back to its level" is a figure, not a hope.

    python benchmarks/real_server_gpu.py --budget-s 420                 # on the H200 (device cuda)
    python benchmarks/real_server_gpu.py --device cpu --hidden 64 --layers 2 --budget-s 150 --n-trials 3   # CPU

Needs, beside torch: this project's wheels and transformers' serving extra. On the H200 image (Python 3.12, torch
2.11, transformers 5.17 without fastapi/openai), carry ``.whl`` made here with
``bash shared/offline-wheels.sh .whl 3.12 pydantic-settings python-dotenv openai==2.54.0 jiter distro
transformers==5.24.0 tqdm typing-extensions`` and start the command with the install line of the device README.
The server is started as ``python -c '...transformers.cli.transformers main' serve`` so that a ``transformers``
installed with ``pip --target`` (no console script on PATH) is the one that runs.

Writes ``real_server_gpu.json`` and ``real_server_gpu.md`` under ``$OUT`` (or ``--out``; default
benchmarks/results), with the date, the GPU, the commit (``--commit`` or ``$TUNER_COMMIT``) and this file's name.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# the trial processes and the servers import tuner from here too (nothing is installed on the GPU image)
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p])

SPACE = ROOT / "search_spaces" / "transformers_serve.yaml"
SERVE = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()"
NEEDED = ("torch", "transformers", "fastapi", "uvicorn", "openai", "optuna", "sqlalchemy", "pydantic_settings",
          "tokenizers", "safetensors", "typer", "rich", "httpx", "yaml")
BACK_TO_LEVEL_MIB = 64
"""Memory after a trial's teardown counts as back to its level when within this of the level before it."""


def gpu_memory_mib(index: int) -> float | None:
    """Used memory of GPU ``index`` as nvidia-smi reports it (every process on it), or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20)
    try:
        return float(out.stdout.strip().splitlines()[0])
    except (IndexError, ValueError):
        return None


def gpu_name(index: int) -> str:
    if shutil.which("nvidia-smi") is None:
        return "none (CPU)"
    out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    return out.stdout.strip() or "unknown"


class MemoryWatch:
    """The search's progress hook: GPU memory before each trial, its peak while the trial runs (polled), and after
    the trial's process (and with it the server) is gone."""

    def __init__(self, gpu: int, poll_s: float = 0.5) -> None:
        self.gpu, self.poll_s = gpu, poll_s
        self.rows: dict[int, dict] = {}
        self._stop = threading.Event()
        self._current: int | None = None
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            n = self._current
            used = gpu_memory_mib(self.gpu) if n is not None else None
            if n is not None and used is not None:
                row = self.rows[n]
                row["mem_peak_mib"] = max(row.get("mem_peak_mib") or 0.0, used)

    # tuner.search.context.Progress, duck-typed
    def started(self, ctx) -> None: ...

    def message(self, text: str) -> None:
        print(text, flush=True)

    def trial_started(self, number: int, params: dict) -> None:
        self.rows[number] = {"number": number, "params": params, "t_start": time.time(),
                             "mem_before_mib": gpu_memory_mib(self.gpu), "mem_peak_mib": None}
        self._current = number

    def trial_finished(self, summary, ctx) -> None:
        self._current = None
        row = self.rows.setdefault(summary.number, {"number": summary.number, "params": summary.params})
        row.update(t_end=time.time(), mem_after_mib=gpu_memory_mib(self.gpu), outcome=summary.outcome,
                   value=summary.value, reason=summary.reason, repeat_of=summary.repeat_of,
                   is_baseline=summary.is_baseline)
        print(f"trial {summary.number} {summary.outcome} {summary.value} {summary.params} "
              f"mem {row.get('mem_before_mib')} -> {row.get('mem_after_mib')} MiB", flush=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def stored_times(storage_url: str, study: str) -> dict[int, dict]:
    """Per trial: the seconds it stored (startup_s, warmup_s, teardown_s, measure_s summed over its levels) and its
    duration, read back from the study's database."""
    from storage import Repo

    repo = Repo(storage_url)
    run = repo.get_run(study)
    out = {}
    for t in repo.list_trials(run.id, with_measurements=True):
        m = {}
        for row in t.measurements:
            if row.metric in ("startup_s", "warmup_s", "teardown_s"):
                m[row.metric] = row.value
            elif row.metric == "measure_s":
                m["measure_s"] = m.get("measure_s", 0.0) + row.value
                m[f"measure_s@{row.level}"] = row.value
            elif row.metric == "tok_s" and row.level:
                m[f"tok_s@{row.level}"] = row.value
        out[t.number] = {**m, "duration_s": t.duration_s}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--n-trials", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU (CUDA_VISIBLE_DEVICES for the servers)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--level-s", type=float, default=5.0, help="seconds each concurrency level is measured")
    ap.add_argument("--levels", default="1,16", help="concurrency levels")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=os.environ.get("TUNER_COMMIT", ""))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        print(f"error: missing Python packages {missing}; carry them as wheels (see this file's docstring)",
              file=sys.stderr)
        return 2
    build_tiny_llama = _tiny_model_builder()
    from tuner.fingerprint import fingerprint
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="real-server-gpu-"))
    t0 = time.time()
    model = build_tiny_llama(tmp / "model", hidden=args.hidden, layers=args.layers, heads=max(4, args.hidden // 64),
                             kv_heads=max(2, args.hidden // 256), dtype=args.dtype, seed=args.seed)
    build_s = time.time() - t0
    levels = [int(c) for c in args.levels.split(",")]
    settings = {
        "model": str(model), "command": [sys.executable, "-c", SERVE, "serve", "{model}", "--host", "{host}",
                                         "--port", "{port}", "--device", args.device, "--dtype", args.dtype],
        "env": {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": str(args.gpu)}, "levels": levels,
        "level_s": args.level_s, "output_len": args.output_len, "trial_timeout_s": 180, "ready_timeout_s": 150,
    }
    storage = f"sqlite:///{tmp / 'tuner.db'}"
    watch = MemoryWatch(args.gpu)
    level_before = gpu_memory_mib(args.gpu)
    opts = SearchOptions(budget_s=args.budget_s, storage_url=storage, study="real-server-gpu", space_path=str(SPACE),
                         target="command", settings=settings, n_trials=args.n_trials, seed=args.seed,
                         out_dir=str(tmp / "export"))
    t0 = time.time()
    try:
        result = run_search(opts, watch)
    finally:
        watch.close()
    wall = time.time() - t0
    times = stored_times(storage, "real-server-gpu")
    trials = []
    for n, row in sorted(watch.rows.items()):
        before, after = row.get("mem_before_mib"), row.get("mem_after_mib")
        back = None if before is None or after is None else after <= before + BACK_TO_LEVEL_MIB
        trials.append({**row, **times.get(n, {}), "memory_back_to_level": back})
    env = fingerprint()
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu_name(args.gpu),
        "device": args.device, "commit": args.commit or env.get("git_sha"), "source": "benchmarks/real_server_gpu.py",
        "torch": env.get("torch"), "transformers": _version("transformers"), "model": {
            "hidden": args.hidden, "layers": args.layers, "dtype": args.dtype, "build_s": build_s},
        "budget_s": args.budget_s, "wall_s": wall, "levels": levels, "level_s": args.level_s,
        "memory_before_search_mib": level_before, "memory_after_search_mib": gpu_memory_mib(args.gpu),
        "state": result.state, "stop_reason": result.stop_reason, "baseline_value": result.baseline_value,
        "best_value": result.best_value, "best_params": result.best_params, "speedup": result.speedup,
        "export_dir": result.export_dir, "trials": trials,
    }
    (out / "real_server_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "real_server_gpu.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if result.best is not None else 1


def _tiny_model_builder():
    """``tests/real_server/tiny_model.py``'s builder, loaded by path (another package named ``tests`` may be
    installed on the image)."""
    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tests" / "real_server" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_llama


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(doc: dict) -> str:
    lines = [
        "# transformers serve tuned on a GPU: where each trial's time goes, and its GPU memory",
        "",
        f"{doc['date']}, GPU {doc['gpu']} (device {doc['device']}), commit {doc['commit']}, torch {doc['torch']}, "
        f"transformers {doc['transformers']}; written by `{doc['source']}` (JSON beside it). Model: random Llama, "
        f"hidden {doc['model']['hidden']}, {doc['model']['layers']} layers, {doc['model']['dtype']}. Space "
        f"`search_spaces/transformers_serve.yaml`, levels {doc['levels']}, {doc['level_s']:g} s per level, "
        f"budget {doc['budget_s']:.0f} s; the search took {doc['wall_s']:.0f} s ({doc['state']}"
        + (f", {doc['stop_reason']}" if doc["stop_reason"] else "") + ").",
        "",
        f"Best {_f(doc['best_value'], '.2f')} tok/s = {_f(doc['speedup'], '.2f')}x the baseline "
        f"({_f(doc['baseline_value'], '.2f')}); params {doc['best_params']}.",
        f"GPU memory before the search {_f(doc['memory_before_search_mib'], '.0f')} MiB, after it "
        f"{_f(doc['memory_after_search_mib'], '.0f')} MiB.",
        "",
        "| # | params | outcome | tok/s | start-up s | warm-up s | measure s | teardown s | trial s | "
        "mem before / peak / after MiB | back to level |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trials"]:
        params = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        outcome = t.get("outcome", "?") + (" (baseline)" if t.get("is_baseline") else "") \
            + (f" (repeat of {t['repeat_of']})" if t.get("repeat_of") is not None else "")
        back = {True: "yes", False: "NO", None: "-"}[t.get("memory_back_to_level")]
        lines.append(
            f"| {t['number']} | {params} | {outcome} | {_f(t.get('value'), '.2f')} | {_f(t.get('startup_s'))} | "
            f"{_f(t.get('warmup_s'))} | {_f(t.get('measure_s'))} | {_f(t.get('teardown_s'))} | "
            f"{_f(t.get('duration_s'))} | {_f(t.get('mem_before_mib'), '.0f')} / {_f(t.get('mem_peak_mib'), '.0f')} / "
            f"{_f(t.get('mem_after_mib'), '.0f')} | {back} |")
    fails = [t for t in doc["trials"] if t.get("outcome") not in ("ok", None) and t.get("reason")]
    if fails:
        lines += ["", "Failures:"] + [f"- trial {t['number']}: {t['outcome']}: {t['reason'][:300]}" for t in fails]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
