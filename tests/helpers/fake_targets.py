"""Test-only targets with known behaviour: a value from a formula, or a crash, a hang, an OOM, an exception.

Used by the search tests through the plug-in form ``target: fake_targets:FakeTarget`` in a space.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from storage.types import MetricRow
from tuner.measurement import Measurement, Outcome
from tuner.settings import CommonSettings
from tuner.targets.base import LaunchSpec, Target


class FakeSettings(CommonSettings):
    sleep_s: float = 0.0
    """Seconds each trial sleeps before it answers."""
    model: str = ""
    moe_config_dir: str | None = None
    """Accepted so a kernel phase's settings can reach it (the SGLang target's key)."""
    crash_unless_x: float | None = None
    """Every configuration with another ``x`` crashes (a broken environment that only the defaults survive)."""
    noise: dict[str, float] = {}
    """Per ``x`` (as text), a factor the value is multiplied by on every second run of that configuration in this
    study (a noisy server): the runs then disagree by that much."""
    served: dict[str, list[float]] = {}
    """Per ``x`` (as text), ``[error_rate, delivered]`` the trial stores at its highest level (a server that failed
    some requests or cut answers short); every other level stores ``[0, 1]``. Empty: no such rows at all."""
    min_trial_s: float = 0.0
    """What :meth:`Target.min_trial_s` answers: the search starts no trial with less time left."""
    slow_rerun_s: dict[str, float] = {}
    """Per ``x`` (as text), seconds every run of that configuration after its first sleeps (a re-run that does not
    fit the time left: with a shorter trial timeout it times out)."""


class FakeTarget(Target):
    name = "fake_targets:FakeTarget"
    Settings = FakeSettings

    def min_trial_s(self) -> float:
        return self.config.min_trial_s

    def evaluate(self, params: dict[str, Any], deadline: float, report=None) -> Measurement:
        mode = params.get("mode", "ok")
        x = float(params.get("x", 1.0)) + float(params.get("boost", 0))  # boost: a code change in the stage tests
        sleep = self.config.sleep_s
        if sleep:
            time.sleep(sleep)
        if mode == "crash" or (self.config.crash_unless_x is not None and x != self.config.crash_unless_x):
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang":
            while True:
                time.sleep(1)
        if mode == "oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if mode == "raise":
            raise ZeroDivisionError("the fake target divided by zero")
        factor = 1.0
        name = str(int(x))
        if name in self.config.noise or name in self.config.slow_rerun_s:  # a count of runs kept beside the study
            seen = Path(os.environ.get("TUNER_FAKE_NOISE_DIR", "/tmp")) / f"fake-noise-x{int(x)}"
            n = int(seen.read_text()) if seen.exists() else 0
            seen.write_text(str(n + 1))
            factor = self.config.noise.get(name, 1.0) if n % 2 else 1.0
            if n and name in self.config.slow_rerun_s:
                time.sleep(self.config.slow_rerun_s[name])
        levels = {c: factor * (10.0 + 5 * x) * c**0.5 for c in self.space.objective.levels}
        for i, (c, v) in enumerate(levels.items()):
            pruned = report is not None and report(i, v)
            while mode == "deaf":  # a target that goes on after its first intermediate value, whatever the verdict
                time.sleep(1)
            if pruned:
                break  # stop here (the contract of report)
        metrics = [MetricRow("tok_s", f"c={c}", v, "tok/s") for c, v in levels.items()]
        for c in levels if self.config.served else ():
            err, delivered = self.config.served.get(name, [0.0, 1.0]) if c == max(levels) else [0.0, 1.0]
            metrics += [
                MetricRow("error_rate", f"c={c}", err, "fraction"),
                MetricRow("delivered", f"c={c}", delivered, "fraction"),
            ]
        return Measurement(
            outcome=Outcome.OK, value=self.space.objective.combine_values(levels), metrics=metrics, by_level=levels
        )

    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        argv = ["echo", "serve"] + [f"--{k.replace('_', '-')}={v}" for k, v in params.items()]
        return LaunchSpec(argv=argv, env={"FAKE_MODEL_PATH": self.config.model}, description="fake target")
