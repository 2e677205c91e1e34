"""The real-server search on a GPU: ``tuner search --target command`` with ``search_spaces/transformers_serve.yaml``
against Hugging Face ``transformers serve`` serving a small random Llama (built here, no download) on ``cuda``.

Per trial it records where the time went (start-up, warm-up = the first requests, measurement per level,
teardown: the metrics the trial stored) and the GPU's memory from outside the server (``nvidia-smi``): before the
trial, the peak while it ran, and after its teardown, so that "memory is back to its level" is a figure, not a hope.

    python benchmarks/real_server_gpu.py --budget-s 420                 # on the H200 (device cuda)
    python benchmarks/real_server_gpu.py --device cpu --hidden 64 --layers 2 --budget-s 150 --n-trials 3   # CPU

Needs what ``benchmarks/serve_bench.py`` says (this project's wheels and transformers' serving extra carried
as ``.whl`` onto the H200 image).

Writes ``real_server_gpu.json`` and ``real_server_gpu.md`` under ``$OUT`` (or ``--out``; default
benchmarks/results), with the date, the GPU, the commit (``--commit`` or ``$TUNER_COMMIT``) and this file's name.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

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
    gpu_memory_mib,
    gpu_name,
    missing_packages,
    model_doc,
    serve_settings,
    version,
)

SPACE = ROOT / "search_spaces" / "transformers_serve.yaml"
BACK_TO_LEVEL_MIB = 64
"""Memory after a trial's teardown counts as back to its level when within this of the level before it."""


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
        self.rows[number] = {
            "number": number,
            "params": params,
            "t_start": time.time(),
            "mem_before_mib": gpu_memory_mib(self.gpu),
            "mem_peak_mib": None,
        }
        self._current = number

    def trial_finished(self, summary, ctx) -> None:
        self._current = None
        row = self.rows.setdefault(summary.number, {"number": summary.number, "params": summary.params})
        row.update(
            t_end=time.time(),
            mem_after_mib=gpu_memory_mib(self.gpu),
            outcome=summary.outcome,
            value=summary.value,
            reason=summary.reason,
            repeat_of=summary.repeat_of,
            is_baseline=summary.is_baseline,
        )
        print(
            f"trial {summary.number} {summary.outcome} {summary.value} {summary.params} "
            f"mem {row.get('mem_before_mib')} -> {row.get('mem_after_mib')} MiB",
            flush=True,
        )

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
    add_common_args(ap, budget_s=420.0)
    ap.add_argument("--level-s", type=float, default=5.0, help="seconds each concurrency level is measured")
    ap.add_argument("--levels", default="1,16", help="concurrency levels")
    ap.add_argument("--output-len", type=int, default=128)
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
    tmp = Path(tempfile.mkdtemp(prefix="real-server-gpu-"))
    model, build_s = build_model(args, tmp / "model")
    levels = [int(c) for c in args.levels.split(",")]
    settings = {
        **serve_settings(args, model),
        "levels": levels,
        "level_s": args.level_s,
        "output_len": args.output_len,
        "trial_timeout_s": 180,
        "ready_timeout_s": 150,
    }
    storage = f"sqlite:///{tmp / 'tuner.db'}"
    watch = MemoryWatch(args.gpu)
    level_before = gpu_memory_mib(args.gpu)
    opts = SearchOptions(
        budget_s=args.budget_s,
        storage_url=storage,
        study="real-server-gpu",
        space_path=str(SPACE),
        target="command",
        settings=settings,
        n_trials=args.n_trials,
        seed=args.seed,
        out_dir=str(tmp / "export"),
    )
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
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu_name(args.gpu),
        "device": args.device,
        "commit": args.commit or env.get("git_sha"),
        "source": "benchmarks/real_server_gpu.py",
        "torch": env.get("torch"),
        "transformers": version("transformers"),
        "model": model_doc(args, build_s),
        "budget_s": args.budget_s,
        "wall_s": wall,
        "levels": levels,
        "level_s": args.level_s,
        "memory_before_search_mib": level_before,
        "memory_after_search_mib": gpu_memory_mib(args.gpu),
        "state": result.state,
        "stop_reason": result.stop_reason,
        "baseline_value": result.baseline_value,
        "best_value": result.best_value,
        "best_params": result.best_params,
        "speedup": result.speedup,
        "export_dir": result.export_dir,
        "trials": trials,
    }
    (out / "real_server_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "real_server_gpu.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if result.best is not None else 1


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
        + (f", {doc['stop_reason']}" if doc["stop_reason"] else "")
        + ").",
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
        outcome = (
            t.get("outcome", "?")
            + (" (baseline)" if t.get("is_baseline") else "")
            + (f" (repeat of {t['repeat_of']})" if t.get("repeat_of") is not None else "")
        )
        back = {True: "yes", False: "NO", None: "-"}[t.get("memory_back_to_level")]
        lines.append(
            f"| {t['number']} | {params} | {outcome} | {_f(t.get('value'), '.2f')} | {_f(t.get('startup_s'))} | "
            f"{_f(t.get('warmup_s'))} | {_f(t.get('measure_s'))} | {_f(t.get('teardown_s'))} | "
            f"{_f(t.get('duration_s'))} | {_f(t.get('mem_before_mib'), '.0f')} / {_f(t.get('mem_peak_mib'), '.0f')} / "
            f"{_f(t.get('mem_after_mib'), '.0f')} | {back} |"
        )
    fails = [t for t in doc["trials"] if t.get("outcome") not in ("ok", None) and t.get("reason")]
    if fails:
        lines += ["", "Failures:"] + [f"- trial {t['number']}: {t['outcome']}: {t['reason'][:300]}" for t in fails]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
