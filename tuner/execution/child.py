"""The child side of ``tuner.execution.isolation``: read a job on stdin, evaluate, write the measurement as JSON.

Run as ``python -m tuner.execution.child`` (one job, the whole of stdin) or ``python -m tuner.execution.child --serve``
(a persistent worker: one job per stdin line until EOF, each answered by ``@@tuner-done <result path>`` once its
result file is written; targets are built once per space and settings and reused). Any exception becomes a
classified failed measurement; only a hard crash (segfault, kill) leaves no result, which the parent then
classifies.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback

from storage.types import MetricRow
from tuner.execution.isolation import DONE_MARK, MARK, PRUNE_VERDICT, RETIRE_MARK
from tuner.measurement import Measurement, Outcome
from tuner.processes import die_with_parent


def classify_exception(exc: BaseException) -> Outcome:
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if "OutOfMemory" in name or "out of memory" in text:
        return Outcome.OOM
    if "OutOfResources" in name or "out of resource" in text:
        return Outcome.OUT_OF_RESOURCES
    module = type(exc).__module__ or ""
    if module.startswith(("torch._dynamo", "torch._inductor", "triton.compiler")) or "Compil" in name:
        return Outcome.COMPILE_ERROR
    if "compile" in text.lower() and ("error" in text.lower() or "fail" in text.lower()):
        return Outcome.COMPILE_ERROR
    if name in ("InvalidConfig",) or module.startswith("kernels") and "Invalid" in name:
        return Outcome.INVALID_CONFIG
    if name == "WrongResult":
        return Outcome.WRONG_RESULT
    if isinstance(exc, (ValueError, TypeError)) and "config" in text.lower():
        return Outcome.INVALID_CONFIG
    if "wrong result" in text.lower() or name == "WrongResult":
        return Outcome.WRONG_RESULT
    return Outcome.CRASH


def report(step: int, value: float) -> bool:
    """A one-trial process's intermediate value: the parent kills the process on a prune."""
    print(MARK + json.dumps({"step": step, "value": value}), flush=True)
    return False


def serve_report(step: int, value: float) -> bool:
    """A persistent worker's intermediate value: the parent answers on stdin (``PRUNE_VERDICT`` or ``GO_VERDICT``);
    on a prune the target stops (``report``'s contract) and this process stays for the next trial."""
    print(MARK + json.dumps({"step": step, "value": value}), flush=True)
    return sys.stdin.readline().strip() == PRUNE_VERDICT


def _target(job: dict, cache: dict):
    from search_spaces import Hardware, detect_hardware, load_space_text, resolve
    from tuner.targets import get_target_class

    key = json.dumps(
        [job["target"], job["space_yaml"], job["space_source"], job.get("settings"), job.get("hardware")],
        sort_keys=True,
        default=str,
    )
    if key not in cache:
        space = load_space_text(job["space_yaml"], source=job["space_source"])
        hw = job.get("hardware")
        hardware = Hardware.from_json(hw) if hw else detect_hardware()
        cache.clear()  # one space at a time: a kernel search moves from case to case
        cache[key] = get_target_class(job["target"])(resolve(space, hardware), job.get("settings") or {})
    return cache[key]


def _run(job: dict, cache: dict, served: int = 0, reporter=report):
    """Evaluate one job and write its result file; returns the target (None when it could not be built) and the
    measurement. Every measurement gets ``trial_time_s@spawn`` (from the parent sending the job to the evaluation's
    start: a fresh interpreter's start and imports, ~0 in a reused worker) and ``worker_trial`` (how many trials this
    process ran before: 0 in a fresh one)."""
    target = None
    started = time.time()
    try:
        target = _target(job, cache)
        started = time.time()
        m = target.evaluate(job["params"], float(job["deadline"]), reporter)
    except BaseException as exc:  # noqa: BLE001 - every failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        m = Measurement.failed(
            classify_exception(exc), f"{type(exc).__name__}: {exc}"[:2000], traceback.format_exc()[-6000:]
        )
    sent = job.get("sent_at")
    if isinstance(sent, (int, float)):
        m.metrics.append(MetricRow("trial_time_s", "spawn", max(0.0, started - float(sent)), "s"))
    m.metrics.append(MetricRow("worker_trial", "", float(served), ""))
    tmp = job["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(m.to_json(), f)
    os.replace(tmp, job["result_path"])
    return target, m


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    cache: dict = {}
    if "--serve" not in argv:
        _run(json.load(sys.stdin), cache)
        return 0
    served = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        target, m = _run(job, cache, served, serve_report)
        served += 1
        retire = target is not None and not target.worker_reusable(m)  # the target does not trust this process
        if retire:
            print(RETIRE_MARK, flush=True)
        print(DONE_MARK + job["result_path"], flush=True)
        if retire:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
