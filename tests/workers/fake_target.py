"""A test-only target whose trials take milliseconds: imported by trial subprocesses as ``fake_target:FakeTarget``
(``tests/workers`` is put on ``PYTHONPATH`` by the conftest).

Its trial asserts it sees exactly the GPUs it was leased (``CUDA_VISIBLE_DEVICES``, as many as ``tp``), and
appends ``{number-free record}`` lines to ``$TUNER_FAKE_LOG`` so a test can check no two trials overlapped on
one GPU id. ``sleep_ms`` and ``hang`` params make trials slow or stuck on demand.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tuner.measurement import Measurement, Outcome
from tuner.settings import CommonSettings
from tuner.targets.base import LaunchSpec, Target

NAME = "fake_target:FakeTarget"

SPACE_YAML = """\
name: fake-space
target: fake_target:FakeTarget
settings: {{sleep_ms: {sleep_ms}}}
objective:
  metric: score
  levels: [1]
  unit: pts
params:
  x:
    type: int
    low: 0
    high: 100000
    default: 1
  tp:
    type: categorical
    values: {tp}
    default: {tp_default}
"""


def space_yaml(sleep_ms: int = 10, tp: list[int] | None = None) -> str:
    tp = tp or [1]
    return SPACE_YAML.format(sleep_ms=sleep_ms, tp=json.dumps(tp), tp_default=tp[0])


class FakeSettings(CommonSettings):
    sleep_ms: float = 10.0
    use_gpus: bool = False
    """Lease ``tp`` GPUs per trial and check CUDA_VISIBLE_DEVICES."""


class FakeTarget(Target):
    name = NAME
    Settings = FakeSettings

    def gpus_for(self, params: dict[str, Any]) -> int:
        return int(params.get("tp", 1)) if self.config.use_gpus else 0

    def evaluate(self, params, deadline, report=None) -> Measurement:
        t0 = time.time()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.config.use_gpus:
            ids = [int(x) for x in visible.split(",")] if visible else []
            if len(ids) != int(params["tp"]) or len(set(ids)) != len(ids):
                return Measurement.failed(
                    Outcome.CRASH, f"wrong GPUs: CUDA_VISIBLE_DEVICES={visible!r} for tp={params['tp']}"
                )
        pause = self.config.sleep_ms / 1000.0
        stall = os.environ.get("TUNER_FAKE_STALL_FILE")
        if stall and os.path.exists(stall):  # the test kills a worker while trials stall here
            with open(stall + ".entered", "a") as f:  # which trials are stalled: the test picks its victim among them
                f.write(json.dumps(params, sort_keys=True) + "\n")
            while os.path.exists(stall) and time.time() < deadline:
                time.sleep(0.05)
        time.sleep(pause)
        log = os.environ.get("TUNER_FAKE_LOG")
        if log:
            with open(log, "a") as f:
                f.write(
                    json.dumps({"pid": os.getpid(), "start": t0, "end": time.time(), "gpus": visible, "params": params})
                    + "\n"
                )
        value = 1000.0 - abs(int(params["x"]) - 4242) / 100.0
        return Measurement(outcome=Outcome.OK, value=value)

    def launch_spec(self, params):
        return LaunchSpec(argv=["true"], description="fake")
