"""The child side of ``tuner.isolation``: read a job on stdin, evaluate, write the measurement as JSON.

Run as ``python -m tuner.trial_worker``. Any exception becomes a classified failed measurement; only a hard
crash (segfault, kill) leaves no result, which the parent then classifies.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

from tuner.isolation import MARK
from tuner.measurement import Measurement, Outcome


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
    print(MARK + json.dumps({"step": step, "value": value}), flush=True)
    return False


def _die_with_parent() -> None:
    """Ask Linux to kill this trial when the worker that started it dies (kill -9 included): no orphan holds a GPU."""
    try:
        import ctypes
        import signal as _signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main() -> int:
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    job = json.load(sys.stdin)
    result_path = job["result_path"]
    try:
        from search_spaces import Hardware, detect_hardware, load_space_text, resolve
        from tuner.targets import get_target_class

        space = load_space_text(job["space_yaml"], source=job["space_source"])
        hw = job.get("hardware")
        hardware = Hardware.from_json(hw) if hw else detect_hardware()
        target = get_target_class(job["target"])(resolve(space, hardware), job.get("settings") or {})
        m = target.evaluate(job["params"], float(job["deadline"]), report)
    except BaseException as exc:  # noqa: BLE001 - every failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        m = Measurement.failed(classify_exception(exc), f"{type(exc).__name__}: {exc}"[:2000],
                               traceback.format_exc()[-6000:])
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(m.to_json(), f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
