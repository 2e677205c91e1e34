"""A test-only workload target whose trial corrupts what a long-lived worker keeps, then fails in a chosen way.

Used as ``target: workload_faults:FaultyWorkload`` in a job sent to the same persistent worker as the real
``workload`` target: the fault trial adds 1 to every weight tensor the process keeps for reuse (as a stray kernel
store would), then crashes (SIGSEGV), raises an out-of-memory error, hangs past its deadline, or returns ``ok`` as
if nothing happened (``silent``). The next real trial must not see the corrupted weights.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tuner.measurement import Measurement, Outcome
from tuner.targets.base import Reporter
from tuner.targets.workload.target import WorkloadTarget


class FaultyWorkload(WorkloadTarget):
    name = "workload_faults"

    def evaluate(self, params: dict[str, Any], deadline: float, report: Reporter | None = None) -> Measurement:
        import torch

        from tuner.targets.workload import model

        fault = params["fault"]
        touched = 0
        with torch.no_grad():
            for w, _ in model._WEIGHTS.values():
                for t in model._tensors(w):
                    if t.is_floating_point() and t.dtype.itemsize >= 2:
                        t.add_(1.0)
                        touched += 1
        assert touched, "no kept weights to corrupt: run a real workload trial in this worker first"
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (a test's fault)")
        if fault == "hang":
            time.sleep(3600)
        return Measurement(outcome=Outcome.OK, value=1.0)
